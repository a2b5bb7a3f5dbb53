"""The template language: NeuraLogic rules written in Python, in PyNeuraLogic 0.9.2's syntax.

    from neurovec.relational import R, V, C, Template, Metadata, Aggregation, Transformation

    template = Template()
    template += R.h(V.X)[3, 3] <= (R.a(V.Y)["W_a": (3,)], R.b(V.X, V.Y))    # a weighted head and literal
    template += R.h / 1 | Metadata(transformation=Transformation.TANH)       # per-predicate settings
    template += (R.q[1, 3] <= R.h(V.X)) | [Aggregation.AVG]                # per-rule settings

A template is a list of rules, per-predicate settings and template facts. Nothing here
touches data: :mod:`.grounding` checks a template against the data's relations and
grounds it. ``docs/relational.md`` lists where this differs from PyNeuraLogic.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import numpy as np

__all__ = [
    "TemplateError", "Function", "Transformation", "Combination", "Aggregation", "F", "Variable", "Constant",
    "V", "C", "R", "WeightSpec", "Literal", "Rule", "Metadata", "PredicateRef", "Offset", "Template",
]


class TemplateError(ValueError):
    """A template that cannot be grounded; the message names the rule (or predicate) and what is wrong."""


# -- functions ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Function:
    """A NeuraLogic function: ``kind`` is ``transformation``, ``combination`` or ``aggregation``."""

    name: str
    kind: str

    def __str__(self) -> str:
        return self.name

    def __call__(self, *args):
        """``Transformation.SQRT(R.a(V.X))`` wraps a literal; ``Combination.PRODUCT(a, b)`` is a rule body."""
        if not args:
            return self
        if self.kind == "transformation":
            if len(args) != 1 or not isinstance(args[0], Literal):
                raise TemplateError(f"{self.name}(...) takes one (unweighted) literal (got {args!r}); neurovec has "
                                    "no nested function graphs")
            return args[0]._with_function(self)
        if self.kind == "combination":
            return Body(tuple(args), self)
        raise TemplateError(f"aggregation {self.name} is set with Metadata(aggregation=...), not called on literals")


class Transformation:
    """Transformations (PyNeuraLogic's names). ``docs/relational.md`` says which ones neurovec computes."""

    SIGMOID = Function("sigmoid", "transformation")
    TANH = Function("tanh", "transformation")
    SIGNUM = Function("signum", "transformation")
    RELU = Function("relu", "transformation")
    LEAKY_RELU = Function("leakyrelu", "transformation")
    LUKASIEWICZ = Function("lukasiewicz", "transformation")
    EXP = Function("exp", "transformation")
    SQRT = Function("sqrt", "transformation")
    INVERSE = Function("inverse", "transformation")
    REVERSE = Function("reverse", "transformation")
    LOG = Function("log", "transformation")
    IDENTITY = Function("identity", "transformation")
    SOFTMAX = Function("softmax", "transformation")
    SPARSEMAX = Function("sparsemax", "transformation")
    TRANSP = Function("transp", "transformation")
    NORM = Function("norm", "transformation")


class Combination:
    """How a rule neuron combines its body, or an atom neuron the rules of its head."""

    AVG = Function("avg", "combination")
    MAX = Function("max", "combination")
    MIN = Function("min", "combination")
    SUM = Function("sum", "combination")
    COUNT = Function("count", "combination")
    PRODUCT = Function("product", "combination")
    ELPRODUCT = Function("elproduct", "combination")
    SOFTMAX = Function("softmax", "combination")
    SPARSEMAX = Function("sparsemax", "combination")
    CROSSSUM = Function("crosssum", "combination")
    CONCAT = Function("concat", "combination")
    COSSIM = Function("cossim", "combination")


class Aggregation:
    """How the groundings of one rule with one head are aggregated."""

    AVG = Function("avg", "aggregation")
    MAX = Function("max", "aggregation")
    MIN = Function("min", "aggregation")
    SUM = Function("sum", "aggregation")
    COUNT = Function("count", "aggregation")
    CONCAT = Function("concat", "aggregation")
    SOFTMAX = Function("softmax", "aggregation")


class F:
    """PyNeuraLogic's flat namespace of functions."""

    sigmoid, tanh, signum, relu = (Transformation.SIGMOID, Transformation.TANH, Transformation.SIGNUM,
                                   Transformation.RELU)
    leaky_relu, lukasiewicz, exp, sqrt = (Transformation.LEAKY_RELU, Transformation.LUKASIEWICZ, Transformation.EXP,
                                          Transformation.SQRT)
    inverse, reverse, log, identity = (Transformation.INVERSE, Transformation.REVERSE, Transformation.LOG,
                                       Transformation.IDENTITY)
    softmax = Transformation.SOFTMAX
    avg, max, min, sum, count = (Combination.AVG, Combination.MAX, Combination.MIN, Combination.SUM,
                                 Combination.COUNT)
    product, elproduct = Combination.PRODUCT, Combination.ELPRODUCT
    avg_agg, max_agg, min_agg, sum_agg, count_agg = (Aggregation.AVG, Aggregation.MAX, Aggregation.MIN,
                                                     Aggregation.SUM, Aggregation.COUNT)


# -- terms --------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Variable:
    name: str

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Constant:
    """A constant; it matches data constants of equal value *and* type (``1`` is not ``"1"``)."""

    value: Any

    def __str__(self) -> str:
        return str(self.value)


class _Variables:
    def __getattr__(self, name: str) -> Variable:
        return self.get(name)

    def get(self, name: str) -> Variable:
        return Variable(name.capitalize())


class _Constants:
    def __getattr__(self, name: str) -> Constant:
        return self.get(name)

    def get(self, name) -> Constant:
        return Constant(name.lower() if isinstance(name, str) else name)


V = _Variables()
C = _Constants()


def _term(term) -> Variable | Constant:
    """PyNeuraLogic's reading of a term: a string starting upper-case is a variable, other values constants."""
    if isinstance(term, (Variable, Constant)):
        return term
    if isinstance(term, str):
        if not term:
            raise TemplateError("an empty string is not a term")
        return Variable(term) if term[0].isupper() else Constant(term)
    if isinstance(term, (int, np.integer)) and not isinstance(term, bool):
        return Constant(int(term))
    raise TemplateError(f"{term!r} is not a term: use V.X, C.x, a string or an int")


# -- weights ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class WeightSpec:
    """A weight as written in a template: its shape, an initial value or none (random), a name to share it."""

    shape: tuple
    value: np.ndarray | None = None
    name: str | None = None
    learnable: bool = True

    @classmethod
    def parse(cls, item, learnable: bool = True) -> "WeightSpec":
        """PyNeuraLogic's weight notations (``ValueFactory.get_value``), with the same shapes.

        * ``2.0``: a scalar with that value;
        * ``(3,)`` or ``(3, 1)``: a column vector of 3 (random); ``(1, 3)``: a row vector, here a ``(1, 3)``
          matrix; ``(2, 3)``: a matrix; ``(1,)`` and ``(1, 1)``: a scalar;
        * ``[1.0, 2.0]``: a vector; ``[[1.0, 2.0]]``: a row vector; ``[[..], [..]]``: a matrix;
        * ``"name": value`` (a slice) names the weight: every weight of that name is one shared weight.
        """
        if isinstance(item, WeightSpec):
            return item
        name = None
        if isinstance(item, slice):
            name, item = item.start, item.stop
        elif isinstance(item, tuple) and item and isinstance(item[0], slice):
            name, item = item[0].start, (item[0].stop,) + item[1:]
        if name is not None and not isinstance(name, str):
            raise TemplateError(f"a weight name must be a string (got {name!r})")
        if isinstance(item, (bool, np.bool_)) or item is None:
            raise TemplateError(f"{item!r} is not a weight")
        if isinstance(item, tuple):
            if not all(isinstance(d, (int, np.integer)) and d >= 1 for d in item) or len(item) not in (1, 2):
                raise TemplateError(f"weight dimensions must be one or two positive ints (got {item!r})")
            dims = tuple(int(d) for d in item)
            shape = {(1,): (), (1, 1): ()}.get(dims, (dims[0],) if len(dims) == 1 or dims[1] == 1 else dims)
            return cls(shape, None, name, learnable)
        value = np.asarray(item, dtype=np.float64)
        if value.ndim > 2 or value.size == 0:
            raise TemplateError(f"a weight value must be a scalar, a vector or a matrix (got shape {value.shape})")
        if not np.all(np.isfinite(value)):
            raise TemplateError(f"weight value {item!r} contains NaN or inf")
        return cls(value.shape, value, name, learnable)

    def fixed(self) -> "WeightSpec":
        return replace(self, learnable=False)

    def __str__(self) -> str:
        text = ("{" + ", ".join(map(str, self.shape)) + "}") if self.value is None else str(self.value.tolist())
        text = f"${self.name}={text}" if self.name else text
        return text if self.learnable else f"<{text}>"


def Offset(value, name: str | None = None, fixed: bool = False) -> WeightSpec:
    """A rule offset (a body item: ``R.h <= (R.a, Offset(0.25))``) or predicate offset (``Metadata(offset=...)``).

    PyNeuraLogic 0.9.2 can write offsets only in template files (``h :- a, 0.25.``); a bare number at the end of a
    body is read the same way here.
    """
    spec = WeightSpec.parse(slice(name, value) if name else value)
    return spec.fixed() if fixed else spec


# -- literals -----------------------------------------------------------------------------------------------------
SPECIAL = ("neq", "eq", "lt", "leq", "gt", "geq", "alldiff")


@dataclass(frozen=True, eq=False)
class Literal:
    """``R.name(terms...)``, optionally weighted (``[...]``), wrapped in a transformation, hidden or special.

    A *hidden* literal (``R.hidden.e(...)``, or a name starting with ``_``) constrains the grounding but is no
    input of the rule neuron; a *special* one (``R.special.neq(X, Y)``) is a comparison of constants.
    """

    name: str
    terms: tuple = ()
    called: bool = False
    weight: WeightSpec | None = None
    function: Function | None = None
    hidden: bool = False
    special: bool = False

    def __post_init__(self):
        if self.name.startswith("_"):
            object.__setattr__(self, "name", self.name[1:])
            object.__setattr__(self, "hidden", True)

    @property
    def arity(self) -> int:
        return len(self.terms)

    @cached_property
    def key(self) -> str:
        """``name/arity``: NeuraLogic's predicate identity (``shape/2`` and ``shape/3`` are different predicates)."""
        return f"{self.name}/{len(self.terms)}"

    @cached_property
    def variables(self) -> list[str]:
        return [t.name for t in self.terms if isinstance(t, Variable)]

    def __call__(self, *terms) -> "Literal":
        if self.called:
            raise TemplateError(f"cannot give terms twice to {self}")
        if len(terms) == 1 and isinstance(terms[0], (list, tuple)):
            terms = tuple(terms[0])
        if self.special and self.name not in SPECIAL:
            raise TemplateError(f"unknown special predicate @{self.name} (neurovec has {', '.join(SPECIAL)})")
        return replace(self, terms=tuple(_term(t) for t in terms), called=True)

    def __getitem__(self, weight) -> "Literal":
        if self.weight is not None:
            raise TemplateError(f"cannot give a second weight to {self}")
        if self.hidden or self.special:
            raise TemplateError(f"hidden and special literals cannot have weights ({self})")
        return replace(self, weight=WeightSpec.parse(weight))

    def fixed(self) -> "Literal":
        if self.weight is None:
            raise TemplateError(f"{self} has no weight to fix")
        if not self.weight.learnable:
            raise TemplateError(f"the weight of {self} is already fixed")
        return replace(self, weight=self.weight.fixed())

    def _with_function(self, function: Function) -> "Literal":
        if self.weight is not None:
            raise TemplateError(f"cannot attach {function} to the weighted literal {self}: attach it before the "
                                "weight, as in PyNeuraLogic")
        if self.function is not None:
            raise TemplateError(f"{self} already has the function {self.function}; neurovec has no nested "
                                "function graphs")
        return replace(self, function=function)

    def __neg__(self) -> "Literal":
        return self._with_function(Transformation.REVERSE)

    def __invert__(self) -> "Literal":
        """``~a``: NeuraLogic's negation neuron, ``1 - a`` of a *true* atom (see docs/relational.md)."""
        return self._with_function(Transformation.REVERSE)

    @property
    def T(self):
        raise TemplateError(f"transposition ({self}.T) is not supported yet: neurovec would need a transpose "
                            "transformation")

    def __truediv__(self, arity: int) -> "PredicateRef":
        if self.called or not isinstance(arity, int) or arity < 0:
            raise TemplateError(f"write predicate settings as R.name / arity (got {self} / {arity!r})")
        return PredicateRef(self.name, arity)

    def __le__(self, body) -> "Rule":
        return Rule.create(self, body)

    def __and__(self, other) -> "Body":
        return Body((self, other), None)

    def __add__(self, other) -> "Body":
        return Body._operator(self, other, Combination.SUM)

    def __mul__(self, other) -> "Body":
        return Body._operator(self, other, Combination.ELPRODUCT)

    def __matmul__(self, other) -> "Body":
        return Body._operator(self, other, Combination.PRODUCT)

    def __str__(self) -> str:
        name = ("_" if self.hidden else "") + ("@" if self.special else "") + self.name
        text = f"{name}({', '.join(map(str, self.terms))})" if self.terms else name
        if self.function is not None:
            text = f"{self.function}({text})"
        return f"{self.weight} {text}" if self.weight is not None else text

    __repr__ = __str__


class _Relations:
    """``R.name`` starts a literal; ``R.get("name")``, ``R.hidden.name``, ``R.special.neq(X, Y)``."""

    def __init__(self, hidden: bool = False, special: bool = False):
        self._hidden, self._special = hidden, special

    def __getattr__(self, name: str) -> Literal:
        if name.startswith("__"):
            raise AttributeError(name)
        return self.get(name)

    def get(self, name: str) -> Literal:
        return Literal(name, hidden=self._hidden, special=self._special)

    @property
    def hidden(self) -> "_Relations":
        return _Relations(True, self._special)

    @property
    def special(self) -> "_Relations":
        return _Relations(self._hidden, True)


R = _Relations()


# -- rules --------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Metadata:
    """Settings of a rule or a predicate (PyNeuraLogic's ``Metadata``).

    Beyond PyNeuraLogic: ``offset`` (a predicate or rule offset, as in NeuraLogic's template files) and
    ``depth`` (on a recursive predicate: unroll its recursion that many times instead of to the fixed point).
    """

    learnable: bool | None = None
    transformation: Function | None = None
    combination: Function | None = None
    aggregation: Function | None = None
    duplicate_grounding: bool | None = None
    offset: Any = None
    depth: int | None = None

    @classmethod
    def create(cls, item) -> "Metadata":
        if isinstance(item, Metadata):
            return item
        if isinstance(item, Function):
            item = [item]
        if not isinstance(item, Iterable):
            raise TemplateError(f"metadata must be Metadata or a list of functions (got {item!r})")
        fields = {}
        for entry in item:
            if not isinstance(entry, Function):
                raise TemplateError(f"invalid metadata entry {entry!r}")
            fields[entry.kind] = entry
        return cls(**fields)

    def __post_init__(self):
        # A function by its name (as in a NeuraLogic template file) is that function; another name is an error here,
        # not when the rule is grounded.
        for kind, namespace in (("transformation", Transformation), ("combination", Combination),
                                ("aggregation", Aggregation)):
            value = getattr(self, kind)
            if value is None or (isinstance(value, Function) and value.kind == kind):
                continue
            known = {f.name: (attribute, f) for attribute, f in vars(namespace).items() if isinstance(f, Function)}
            if isinstance(value, str) and value.lower() in known:
                object.__setattr__(self, kind, known[value.lower()][1])
                continue
            article = "an" if kind[0] == "a" else "a"
            raise TemplateError(f"Metadata({kind}={value!r}): not {article} {kind}; use one of "
                                f"{', '.join(f'{namespace.__name__}.{a}' for a, _ in known.values())} (or its name: "
                                f"{', '.join(known)})")
        for name in ("learnable", "duplicate_grounding"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, (bool, np.bool_)):
                raise TemplateError(f"Metadata({name}={value!r}): expected True or False")
        if self.depth is not None and (isinstance(self.depth, bool) or not isinstance(self.depth, (int, np.integer))
                                       or self.depth < 0):
            raise TemplateError(f"Metadata(depth={self.depth!r}): expected a whole number >= 0 (the recursion's "
                                "unrolling depth)")

    def __str__(self) -> str:
        parts = [f"{k}={v}" for k, v in self.__dict__.items() if v is not None]
        return f"[{', '.join(parts)}]"


@dataclass(frozen=True)
class PredicateRef:
    name: str
    arity: int

    def __or__(self, metadata) -> "PredicateSpec":
        metadata = Metadata.create(metadata)
        if metadata.aggregation is not None:
            raise TemplateError(f"cannot set 'aggregation' on predicate {self} (it is a rule setting)")
        return PredicateSpec(self.name, self.arity, metadata)

    def __str__(self) -> str:
        return f"{self.name}/{self.arity}"


@dataclass(frozen=True)
class PredicateSpec:
    """``R.h / 1 | Metadata(...)``: the transformation, combination and offset of the atoms of ``h``."""

    name: str
    arity: int
    metadata: Metadata

    @property
    def key(self) -> str:
        return f"{self.name}/{self.arity}"

    def __str__(self) -> str:
        return f"{self.key} {self.metadata}"


@dataclass(frozen=True)
class Body:
    """A rule body built with ``&``, ``+``, ``*``, ``@`` or ``Combination.X(...)`` (then the rule's combination)."""

    items: tuple
    combination: Function | None

    @staticmethod
    def _operator(left, right, combination: Function) -> "Body":
        items = []
        for side in (left, right):
            if isinstance(side, Body) and side.combination == combination:
                items.extend(side.items)
            elif isinstance(side, Body):
                raise TemplateError(f"nested combinations ({side}) are not supported: neurovec has no function graphs")
            else:
                items.append(side)
        return Body(tuple(items), combination)

    def __and__(self, other) -> "Body":
        if self.combination is not None:
            raise TemplateError("cannot mix & with combination operators in one body")
        return Body(self.items + (other,), None)

    __add__ = lambda self, other: Body._operator(self, other, Combination.SUM)  # noqa: E731
    __mul__ = lambda self, other: Body._operator(self, other, Combination.ELPRODUCT)  # noqa: E731
    __matmul__ = lambda self, other: Body._operator(self, other, Combination.PRODUCT)  # noqa: E731

    def __str__(self) -> str:
        inner = ", ".join(map(str, self.items))
        return f"{self.combination}({inner})" if self.combination else inner


@dataclass(frozen=True, eq=False)
class Rule:
    """``head <= body``: one rule. ``index`` (its position in the template) is set when it is added."""

    head: Literal
    body: tuple
    offset: WeightSpec | None = None
    metadata: Metadata = field(default_factory=Metadata)
    index: int | None = None

    @classmethod
    def create(cls, head: Literal, body) -> "Rule":
        if head.function is not None or head.hidden or head.special:
            raise TemplateError(f"rule head {head} cannot have a function or be hidden or special")
        combination = None
        if isinstance(body, Body):
            combination, body = body.combination, body.items
        elif isinstance(body, (Literal, WeightSpec)) or not isinstance(body, Iterable):
            body = (body,)
        literals, offset = [], None
        for k, item in enumerate(body):
            if isinstance(item, Literal):
                if offset is not None:
                    raise TemplateError(f"rule {head} :- ...: the offset must be the last body item")
                literals.append(item)
            elif isinstance(item, Body):
                raise TemplateError(f"rule {head} :- ...: nested combination {item} is not supported (neurovec has "
                                    "no function graphs inside a rule)")
            elif k == len(body) - 1 and item is not None and not isinstance(item, str):
                offset = WeightSpec.parse(item)
            else:
                raise TemplateError(f"rule {head} :- ...: body item {item!r} is neither a literal nor a trailing "
                                    "offset")
        if not literals:
            raise TemplateError(f"rule {head} :- ...: the body has no literals")
        metadata = Metadata(combination=combination) if combination is not None else Metadata()
        return cls(head, tuple(literals), offset, metadata)

    def __or__(self, metadata) -> "Rule":
        metadata = Metadata.create(metadata)
        merged = {k: v for k, v in self.metadata.__dict__.items() if v is not None}
        merged.update({k: v for k, v in metadata.__dict__.items() if v is not None})
        offset = self.offset
        if "offset" in merged:
            if offset is not None:
                raise TemplateError(f"rule {self}: two offsets (in the body and in the metadata)")
            offset = WeightSpec.parse(merged.pop("offset"))
        if merged.get("depth") is not None:
            raise TemplateError(f"rule {self}: depth is a predicate setting (R.{self.head.name} / "
                                f"{self.head.arity} | Metadata(depth=...))")
        return replace(self, metadata=Metadata(**merged), offset=offset)

    @cached_property
    def literals(self) -> list[Literal]:
        """Body literals that are neuron inputs (neither hidden nor special), in body order."""
        return [lit for lit in self.body if not lit.hidden and not lit.special]

    @cached_property
    def input_positions(self) -> list[int]:
        """Body positions of :attr:`literals`."""
        return [k for k, lit in enumerate(self.body) if not lit.hidden and not lit.special]

    @property
    def label(self) -> str:
        return f"rule {self.index}" if self.index is not None else "rule"

    def __str__(self) -> str:
        body = ", ".join(map(str, self.body)) + (f", {self.offset}" if self.offset is not None else "")
        meta = str(self.metadata)
        return f"{self.head} :- {body}." + (f" {meta}" if meta != "[]" else "")


# -- the template -------------------------------------------------------------------------------------------------
class Template:
    """Rules, predicate settings and template facts (facts that hold in every example; weighted ones are learnable
    embeddings). ``template += entry`` adds a rule, a ``R.h / 1 | Metadata(...)``, a fact, or a list of them."""

    def __init__(self, entries: Iterable = ()):
        self.rules: list[Rule] = []
        self.predicates: dict[str, PredicateSpec] = {}   # by name/arity
        self.facts: list[Literal] = []
        self.add_rules(entries)

    def add_rule(self, entry) -> None:
        self.add_rules([entry])

    def add_rules(self, entries: Iterable) -> None:
        for entry in entries:
            if isinstance(entry, Rule):
                self.rules.append(replace(entry, index=len(self.rules)))
            elif isinstance(entry, PredicateSpec):
                previous = self.predicates.get(entry.key)
                if previous is not None:
                    entry = PredicateSpec(entry.name, entry.arity, _merge(previous, entry))
                self.predicates[entry.key] = entry
            elif isinstance(entry, Literal):
                if entry.function is not None or entry.hidden or entry.special:
                    raise TemplateError(f"template fact {entry} cannot have a function or be hidden or special")
                if any(isinstance(t, Variable) for t in entry.terms):
                    raise TemplateError(f"template fact {entry} has variables; facts are ground")
                self.facts.append(entry)
            elif isinstance(entry, (list, tuple)):
                self.add_rules(entry)
            else:
                raise TemplateError(f"cannot add {entry!r} to a template (expected a rule, R.name / arity | "
                                    "Metadata(...), or a fact)")

    def __iadd__(self, entry) -> "Template":
        self.add_rules(entry if isinstance(entry, (list, tuple)) else [entry])
        return self

    def __len__(self) -> int:
        return len(self.rules) + len(self.predicates) + len(self.facts)

    def __str__(self) -> str:
        return "\n".join([str(f) + "." for f in self.facts] + [str(r) for r in self.rules] +
                         [str(p) for p in self.predicates.values()])

    # The grounding entry point, set by .grounding when it is imported (as importing neurovec.relational does): this
    # module stays below the grounders and imports none of them.
    _ground = None

    def ground(self, facts, queries, **options):
        """Ground this template on ``facts`` for ``queries``: a :class:`neurovec.Graph` (see :func:`.ground`)."""
        if Template._ground is None:
            raise RuntimeError("import neurovec.sources.relational (or neurovec.relational) to ground templates")
        return Template._ground(self, facts, queries, **options).graph


def _merge(old: PredicateSpec, new: PredicateSpec) -> Metadata:
    merged = {k: v for k, v in old.metadata.__dict__.items() if v is not None}
    merged.update({k: v for k, v in new.metadata.__dict__.items() if v is not None})
    return Metadata(**merged)
