"""Checking a template against the data's relations, before anything is grounded.

:func:`make_plan` reads the template and the *schemas* of the relations (arity and value
shape of each predicate, no rows) and returns a :class:`Plan`: the strata of predicates
(strongly connected components of the rule dependency graph, in the order they are
grounded), the value shape of every predicate, and every weight of the template with its
shape. Every template error of ``docs/relational.md`` that needs no data is raised here,
with the rule it is in:

* a head variable not bound by the body, a special literal (``@neq``...) with an unbound variable;
* an unknown predicate; an arity that no relation, fact or rule of that name has;
* functions neurovec does not compute (with what it would need);
* weights whose shapes do not fit the values they multiply; a shared weight used with two shapes;
* a recursion depth declared on a predicate that is not recursive.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from ..graph import product_shape
from .template import Constant, Function, Rule, Template, TemplateError, WeightSpec

__all__ = ["Plan", "Stratum", "WeightPlan", "make_plan", "TRANSFORMATIONS"]

# NeuraLogic transformation -> (neurovec transformation, its fixed bias, follow-up steps (transformation, fixed
# weight, fixed bias)); see docs/neuralogic.md for the NeuraLogic definitions.
TRANSFORMATIONS = {
    "identity": ("identity", None, ()), "sigmoid": ("sigmoid", None, ()), "tanh": ("tanh", None, ()),
    "relu": ("relu", None, ()), "leakyrelu": ("leaky_relu", None, ()), "exp": ("exp", None, ()),
    "log": ("log", None, ()), "sqrt": ("sqrt", None, ()), "inverse": ("inverse", None, ()),
    "softmax": ("softmax", None, ()),
    "reverse": ("reverse", -1.0, ()),                                   # 1 - x = -(x - 1)
    "signum": ("sign", None, (("relu", None, None),)),                  # 1 if x > 0 else 0
    "lukasiewicz": ("identity", None, (("sigmoid", 6.0, 0.5),)),        # sigmoid(6 x + 0.5)
}
COMBINATIONS = ("sum", "avg", "max", "min", "product", "elproduct")
AGGREGATIONS = ("sum", "avg", "max", "min", "count")
_IMPORTER = "a template built with PyNeuraLogic and imported with neurovec.sources.neuralogic.from_neuralogic takes it"
_NEEDS = {
    "count": "a count of a rule's body inputs is a constant; write it as an offset",
    "softmax": f"softmax over a neuron's inputs in the grounder ({_IMPORTER})",
    "sparsemax": "a sparsemax transformation in neurovec's graph",
    "concat": f"concatenation of inputs in the grounder ({_IMPORTER})",
    "crosssum": "a cross-sum combination",
    "cossim": "a cosine-similarity combination",
    "transp": f"a transpose transformation in the grounder ({_IMPORTER} as the left factor of a dot product)",
    "norm": "a normalization transformation",
}
DEFAULTS = {"rule_combination": "sum", "rule_transformation": "identity", "aggregation": "avg",
            "atom_combination": "sum", "atom_transformation": "identity"}


@dataclass
class WeightPlan:
    """One weight of the graph: its name, shape, initial value (None: random) and whether it is learnable."""

    name: str
    shape: tuple
    value: np.ndarray | None
    learnable: bool
    where: str   # where it was first used, for messages


@dataclass
class Stratum:
    """Predicates grounded together: one, or a recursive component with its declared depth (None: fixed point)."""

    predicates: list
    rules: list
    recursive: bool
    depth: int | None = None


@dataclass
class Plan:
    template: Template
    strata: list                                  # Stratum, in grounding order
    arity: dict                                   # predicate key (name/arity) -> arity
    shape: dict                                   # predicate key -> value shape of its atoms
    derived: set                                  # predicate keys with rules
    weights: dict = field(default_factory=dict)   # name -> WeightPlan, in template order
    rule_weights: dict = field(default_factory=dict)  # (rule index, "head" | i | "offset") -> weight name
    predicate_offsets: dict = field(default_factory=dict)  # predicate key -> weight name
    fact_weights: list = field(default_factory=list)  # per template fact: weight name or None (a unit fact)
    body_shape: dict = field(default_factory=dict)    # rule index -> value shape of its rule neurons
    _labels: dict = field(default_factory=dict, repr=False)
    # What the grounders derive from the template alone, kept for the next grounding with this plan (the families
    # of rules, the predicates the queries read): see Grounder._families and Grounder._relevant_predicates.
    memo: dict = field(default_factory=dict, repr=False)

    @cached_property
    def constant_values(self) -> list:
        """The constants written in the template (rules and facts), in template order (repeats included)."""
        values = [t.value for rule in self.template.rules for lit in [rule.head, *rule.body]
                  for t in lit.terms if isinstance(t, Constant)]
        return values + [t.value for fact in self.template.facts for t in fact.terms]

    @cached_property
    def constant_columns(self) -> list:
        """The constants written in the template as a few columns for the vocabulary: the ints in one, the strings in
        one, anything else alone (to be refused with its own message)."""
        values = self.constant_values

        def is_int(v) -> bool:
            return isinstance(v, (int, np.integer)) and not isinstance(v, bool) and -(1 << 63) <= v < (1 << 63)

        ints = [v for v in values if is_int(v)]
        strings = [v for v in values if isinstance(v, str)]
        others = [v for v in values if not is_int(v) and not isinstance(v, str)]
        columns = [np.asarray(ints, np.int64)] if ints else []
        columns += [np.asarray(strings)] if strings else []
        return columns + [np.asarray([v]) for v in others]

    def label(self, key: str) -> str:
        """A predicate's name for layer names: ``name``, or ``name/arity`` when the name has several arities."""
        if key not in self._labels:
            name = key.rsplit("/", 1)[0]
            self._labels[key] = name if sum(k.rsplit("/", 1)[0] == name for k in self.arity) == 1 else key
        return self._labels[key]

    def combination(self, rule: Rule) -> str:
        function = rule.metadata.combination
        return function.name if function is not None else DEFAULTS["rule_combination"]

    def rule_transformation(self, rule: Rule) -> str:
        function = rule.metadata.transformation
        return function.name if function is not None else DEFAULTS["rule_transformation"]

    def aggregation(self, rule: Rule) -> str:
        function = rule.metadata.aggregation
        return function.name if function is not None else DEFAULTS["aggregation"]

    def atom_combination(self, predicate: str) -> str:
        spec = self.template.predicates.get(predicate)
        function = spec.metadata.combination if spec is not None else None
        return function.name if function is not None else DEFAULTS["atom_combination"]

    def atom_transformation(self, predicate: str) -> str:
        spec = self.template.predicates.get(predicate)
        function = spec.metadata.transformation if spec is not None else None
        return function.name if function is not None else DEFAULTS["atom_transformation"]


def make_plan(template: Template, schemas: dict, seed: int = 0) -> Plan:
    """Check ``template`` against ``schemas`` (predicate key ``name/arity`` -> value shape of the data's facts).

    The plan is kept on the template: grounding it again (new data, same schemas and seed) does not plan again.
    Rules, facts and literals are immutable, so the template is unchanged while it holds the same ones."""
    # The same objects, compared by identity (settings may hold arrays, which == does not compare to one bool).
    objects = (*template.rules, *template.predicates.values(), *template.facts)
    layout = (len(template.rules), tuple(template.predicates), len(template.facts),
              tuple(sorted((k, tuple(shape)) for k, shape in schemas.items())), seed)
    cached = getattr(template, "_plan", None)
    if cached is not None and cached[1] == layout and all(a is b for a, b in zip(cached[0], objects)):
        return cached[2]
    plan = _make_plan(template, schemas, seed)
    template._plan = (objects, layout, plan)
    return plan


def _make_plan(template: Template, schemas: dict, seed: int) -> Plan:
    if not template.rules:
        raise TemplateError("the template has no rules")
    fact_shapes: dict[str, tuple] = {key: tuple(shape) for key, shape in schemas.items()}
    derived = {rule.head.key for rule in template.rules}
    for rule in template.rules:
        _check_rule(rule, _Where(rule))
    known = set(schemas) | {f.key for f in template.facts} | derived
    for rule in template.rules:
        for lit in rule.body:
            if not lit.special and lit.key not in known:
                where = _Where(rule)
                same_name = sorted(k for k in known if k.rsplit("/", 1)[0] == lit.name)
                if same_name:
                    arities = " and ".join(k.rsplit("/", 1)[1] for k in same_name)
                    source = "the data's relation" if same_name[0] in schemas else "the template's"
                    raise TemplateError(f"{where}: arity mismatch: {lit.name} has {lit.arity} arguments here, but "
                                        f"{arities} in {source} {lit.name!r}")
                raise TemplateError(f"{where}: unknown predicate {lit.key}: no relation in the data, no template fact "
                                    f"and no rule derives it (known: {sorted(known)})")
    for key, spec in template.predicates.items():
        if key not in known:
            raise TemplateError(f"predicate settings {spec}: no rule, fact or relation has the predicate {key}")
        for function in (spec.metadata.transformation, spec.metadata.combination):
            _check_function(function, f"predicate {key}")
    arity = {key: int(key.rsplit("/", 1)[1]) for key in known}
    plan = Plan(template, _strata(template, derived), arity, {}, derived)
    _template_fact_shapes(plan, fact_shapes)
    _infer_shapes(plan, fact_shapes)
    _weights(plan, np.random.default_rng(seed))
    return plan


def _check_rule(rule: Rule, where: str) -> None:
    bound = {v for lit in rule.body if not lit.special for v in lit.variables}
    for v in rule.head.variables:
        if v not in bound:
            raise TemplateError(f"{where}: unbound head variable {v}: it appears in no body literal, so the rule "
                                "would ground to infinitely many heads")
    for lit in rule.body:
        if lit.special:
            if lit.name != "alldiff" and lit.arity != 2:
                raise TemplateError(f"{where}: @{lit.name} takes two terms (got {lit.arity})")
            for v in lit.variables:
                if v not in bound:
                    raise TemplateError(f"{where}: variable {v} of {lit} appears in no other body literal")
        _check_function(lit.function, where)
    if not rule.literals:
        raise TemplateError(f"{where}: the body has no input literal (all are hidden or special)")
    _check_function(rule.metadata.transformation, where)
    _check_function(rule.metadata.combination, where, COMBINATIONS)
    _check_function(rule.metadata.aggregation, where, AGGREGATIONS)


def _check_function(function: Function | None, where: str, allowed=None) -> None:
    if function is None:
        return
    ok = function.name in TRANSFORMATIONS if function.kind == "transformation" else function.name in allowed \
        if allowed is not None else function.name in COMBINATIONS
    if not ok:
        need = _NEEDS.get(function.name)
        raise TemplateError(f"{where}: {function.kind} {function.name} is not supported" +
                            (f"; neurovec would need {need}" if need else ""))


def _strata(template: Template, derived: set) -> list[Stratum]:
    """Strongly connected components of "head depends on body predicate", dependencies first (Tarjan)."""
    edges = {p: [] for p in derived}
    for rule in template.rules:
        edges[rule.head.key].extend(lit.key for lit in rule.body if not lit.special and lit.key in derived)
    index, low, on_stack, stack, order = {}, {}, set(), [], []

    def visit(p):  # recursion depth = length of the longest predicate chain: small
        index[p] = low[p] = len(index)
        stack.append(p)
        on_stack.add(p)
        for q in edges[p]:
            if q not in index:
                visit(q)
                low[p] = min(low[p], low[q])
            elif q in on_stack:
                low[p] = min(low[p], index[q])
        if low[p] == index[p]:
            component = []
            while True:
                q = stack.pop()
                on_stack.discard(q)
                component.append(q)
                if q == p:
                    break
            order.append(component)

    for p in sorted(derived, key=lambda key: min(r.index for r in template.rules if r.head.key == key)):
        if p not in index:
            visit(p)
    strata = []
    for component in order:
        members = set(component)
        rules = [r for r in template.rules if r.head.key in members]
        recursive = len(component) > 1 or any(lit.key in members for r in rules for lit in r.body if not lit.special)
        depths = {p: template.predicates[p].metadata.depth for p in component
                  if p in template.predicates and template.predicates[p].metadata.depth is not None}
        if depths and not recursive:
            p = next(iter(depths))
            raise TemplateError(f"predicate {p}: depth={depths[p]} is declared, but {p} is not recursive")
        if len(set(depths.values())) > 1:
            raise TemplateError(f"the recursive predicates {sorted(component)} declare different depths {depths}")
        depth = next(iter(depths.values()), None)
        if depth is not None and (not isinstance(depth, int) or depth < 1):
            raise TemplateError(f"predicate {next(iter(depths))}: depth must be a positive int (got {depth!r})")
        ordered = sorted(component, key=lambda key: min(r.index for r in rules if r.head.key == key))
        strata.append(Stratum(ordered, rules, recursive, depth))
    return strata


def _template_fact_shapes(plan: Plan, fact_shapes: dict) -> None:
    for fact in plan.template.facts:
        shape = fact.weight.shape if fact.weight is not None else ()
        previous = fact_shapes.setdefault(fact.key, shape)
        if previous != shape:
            raise TemplateError(f"template fact {fact}: value shape {shape}, but other facts of {fact.key} have "
                                f"{previous}")


def _infer_shapes(plan: Plan, fact_shapes: dict) -> None:
    """The value shape of every predicate; errors name the rule whose weights do not fit."""
    shape = plan.shape
    for name in plan.arity:
        if name not in plan.derived:
            shape[name] = fact_shapes.get(name, ())
    for stratum in plan.strata:
        pending = list(stratum.rules)
        while pending:  # recursive rules wait until a base rule gave their body's shape
            progress = [r for r in pending if all(lit.key in shape for lit in r.literals)]
            if not progress:
                rule = pending[0]
                raise TemplateError(f"{rule.label} `{rule}`: the value shape of "
                                    f"{next(lit.key for lit in rule.literals if lit.key not in shape)} is unknown: a "
                                    "recursive predicate needs a rule or fact that does not recurse")
            for rule in progress:
                pending.remove(rule)
                plan.body_shape[rule.index], head = _head_shape(plan, rule, shape)
                name = rule.head.key
                if name in shape and shape[name] != head:
                    raise TemplateError(f"{rule.label} `{rule}`: the atoms of {name} get shape {head} here, but "
                                        f"{shape[name]} from its other rules or facts")
                shape[name] = head
        for name in stratum.predicates:
            facts = fact_shapes.get(name)
            if facts is not None and facts != shape[name]:
                raise TemplateError(f"predicate {name}: its facts have value shape {facts} but its rules derive "
                                    f"{shape[name]}")


def _head_shape(plan: Plan, rule: Rule, shape: dict) -> tuple[tuple, tuple]:
    """The value shapes of the rule's neurons and of the atoms it derives."""
    where = _Where(rule)
    combination = plan.combination(rule)
    products = []
    for lit in rule.literals:
        value = shape[lit.key]
        if lit.function is not None and lit.function.name == "softmax" and value == ():
            raise TemplateError(f"{where}: softmax({lit}) needs a vector value (got a scalar)")
        product = product_shape(lit.weight.shape if lit.weight is not None else None, value)
        if product is None:
            raise TemplateError(f"{where}: weight shapes do not fit: weight {lit.weight} of shape {lit.weight.shape} "
                                f"times {lit.name} with values of shape {value}")
        products.append((lit, product))
    distinct = {p for _, p in products if p != ()}
    if len(distinct) > 1:
        described = ", ".join(f"{lit} -> {p}" for lit, p in products)
        raise TemplateError(f"{where}: weight shapes do not fit: the body's weighted inputs have different shapes "
                            f"({described})")
    body = distinct.pop() if distinct else ()
    if body != () and len(rule.literals) > 1:
        for lit, product in products:
            if product == () and lit.weight is not None:
                raise TemplateError(f"{where}: the weighted scalar {lit} among {body} inputs is not supported (write "
                                    "its weight on a rule of its own, or drop it)")
    if combination in ("max", "min") and body != ():
        raise TemplateError(f"{where}: combination {combination} of {body} values is not supported: NeuraLogic "
                            "selects the input with the largest element sum, neurovec's max/min are elementwise")
    if combination in ("product", "elproduct") and rule.offset is not None and body != ():
        raise TemplateError(f"{where}: an offset in a product of {body} values is not supported")
    if rule.offset is not None and rule.offset.shape not in ((), body):
        raise TemplateError(f"{where}: weight shapes do not fit: the offset has shape {rule.offset.shape} but the "
                            f"rule's value has shape {body}")
    if plan.rule_transformation(rule) == "softmax" and body == ():
        raise TemplateError(f"{where}: transformation softmax needs vector values (the rule's value is a scalar)")
    aggregation = plan.aggregation(rule)
    if aggregation in ("max", "min") and body != ():
        raise TemplateError(f"{where}: aggregation {aggregation} of {body} values is not supported: NeuraLogic "
                            "selects the grounding with the largest element sum, neurovec's max/min are elementwise")
    aggregated = () if aggregation == "count" else body
    head = product_shape(rule.head.weight.shape if rule.head.weight is not None else None, aggregated)
    if head is None:
        raise TemplateError(f"{where}: weight shapes do not fit: head weight {rule.head.weight} of shape "
                            f"{rule.head.weight.shape} times the aggregated body of shape {aggregated}")
    return body, head


def _weights(plan: Plan, rng: np.random.Generator) -> None:
    """Every weight of the template, named and shaped; shared names must agree; random values are drawn here, in
    template order, so the same template and seed give the same weights whatever the data."""

    def register(spec: WeightSpec | None, default_name: str, where: str) -> str | None:
        if spec is None:
            return None
        name = spec.name or default_name
        previous = plan.weights.get(name)
        if previous is None:
            value = spec.value if spec.value is not None else _glorot(rng, spec.shape)
            plan.weights[name] = WeightPlan(name, spec.shape, value, spec.learnable, where)
            return name
        if previous.shape != spec.shape:
            raise TemplateError(f"{where}: weight shapes do not fit: weight {name!r} has shape {spec.shape} here but "
                                f"{previous.shape} in {previous.where}")
        if spec.value is not None and previous.value is not None and spec.value is not previous.value and \
                not np.array_equal(spec.value, previous.value):
            raise TemplateError(f"{where}: weight {name!r} is given the value {spec.value.tolist()} here but "
                                f"{previous.value.tolist()} in {previous.where}")
        if spec.learnable != previous.learnable:
            raise TemplateError(f"{where}: weight {name!r} is fixed in one place and learnable in another "
                                f"({previous.where})")
        return name

    for k, fact in enumerate(plan.template.facts):
        plan.fact_weights.append(register(fact.weight, f"fact:{fact.name}({','.join(map(str, fact.terms))})",
                                          f"template fact {fact}"))
    for rule in plan.template.rules:
        where = _Where(rule)
        learnable = rule.metadata.learnable
        fix = (lambda s: s.fixed() if s is not None and learnable is False else s)
        plan.rule_weights[(rule.index, "head")] = register(fix(rule.head.weight), f"rule{rule.index}:head", where)
        for i, lit in enumerate(rule.literals):
            plan.rule_weights[(rule.index, i)] = register(fix(lit.weight), f"rule{rule.index}:{lit.name}{i}", where)
        plan.rule_weights[(rule.index, "offset")] = register(fix(rule.offset), f"rule{rule.index}:offset", where)
    for key, spec in plan.template.predicates.items():
        offset = spec.metadata.offset
        if offset is None:
            continue
        offset = WeightSpec.parse(offset)
        where = _Where(spec, "predicate")
        if key not in plan.derived:
            raise TemplateError(f"{where}: an offset on {key}, which no rule derives")
        if offset.shape not in ((), plan.shape[key]):
            raise TemplateError(f"{where}: weight shapes do not fit: the offset has shape {offset.shape} but the "
                                f"atoms of {key} have shape {plan.shape[key]}")
        plan.predicate_offsets[key] = register(offset, f"{key}:offset", where)


class _Where:
    """``rule 3 `h(X) :- a(X).``` (or ``predicate h/1 [...]``) for messages, formatted only when a message is
    (printing rules and predicates with their weights is not free)."""

    __slots__ = ("item", "kind")

    def __init__(self, item, kind: str = "rule"):
        self.item, self.kind = item, kind

    def __format__(self, spec: str) -> str:
        if self.kind == "predicate":
            return f"predicate {self.item}"
        return f"{self.item.label} `{self.item}`"

    __str__ = __repr__ = lambda self: format(self)  # noqa: E731


def _glorot(rng: np.random.Generator, shape: tuple) -> np.ndarray:
    fan_out, fan_in = (shape + (1, 1))[:2] if len(shape) < 2 else shape
    bound = np.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-bound, bound, size=shape)
