"""Grounding a template by whole-array joins (numpy), and the entry point :func:`ground`.

    graph = ground(template, {"edge": Relation(...), ...}, queries=R.predict).graph

How it runs (``docs/relational.md`` has the long version):

1. :func:`~.plan.make_plan` checks the template against the relations' schemas.
2. Constants and examples become int64 ids (:mod:`.encoding`); relations are cut to the queried
   examples.
3. Strata of predicates are grounded in order. A rule body is a sequence of sort-merge joins
   (:mod:`.joins`) on the example and the shared variables, starting from its smallest literal;
   each row of the result is a grounding, carrying the atom id of each body literal. The heads,
   made distinct, are the predicate's atoms. A recursive stratum is iterated to its fixed point
   (then each atom's level is its longest derivation, and a cycle is an error) or unrolled to a
   declared depth.
4. Groundings and atoms the queries do not reach are dropped, walking the stages backwards.
5. :mod:`.assembly` writes the layers of the :class:`neurovec.Graph`.
"""
from __future__ import annotations

import functools
import itertools
import time
from dataclasses import dataclass, field

import numpy as np

from .data import Query, Relation
from .encoding import Vocabulary, encode_relation
from .joins import ColumnIndex, distinct, join, lookup, row_keys
from .plan import Plan, Stratum, _Where, make_plan
from .template import Constant, Rule, Template, TemplateError, Variable

__all__ = ["ground", "Grounding", "Table", "Groundings", "Stage"]

_LIMIT = 1 << 62


@dataclass(eq=False)
class Table:
    """The ground atoms of one predicate (or of one round of a recursion unrolled to a depth).

    Atom ``i`` is ``predicate(args[0][i], ...)`` in example ``example[i]``; ``fact_row[i]`` is its row in the
    predicate's :class:`~.encoding.FactTable` (-1: none), ``derived[i]`` says whether a rule derives it (then the
    derived neuron replaces the fact, as in NeuraLogic) and ``level[i]`` is its stage within a recursion.
    """

    name: str
    predicate: str
    example: np.ndarray | None        # None in the SQL grounder: the atoms live in the database
    args: list | None
    fact_row: np.ndarray
    derived: np.ndarray
    level: np.ndarray | None = None
    in_order: bool = False            # whether the rows are sorted by (example, args) (then by any prefix too)
    sql: object = None                # the SQL grounder's temporary table of these atoms
    _sorted: dict = field(default_factory=dict, repr=False)

    @property
    def size(self) -> int:
        return int(self.fact_row.size)


@dataclass(eq=False)
class Groundings:
    """The groundings of one rule (one row each): the head atom and the atom of every input literal."""

    rule: Rule
    head_table: str
    head: np.ndarray
    input_tables: list
    inputs: list
    # A family of rules grounded together (see NumpyGrounder._families): ``rule`` is its first, ``family`` all of
    # them in template order and ``member[i]`` the one grounding ``i`` belongs to. Empty for a single rule.
    family: tuple = ()
    member: np.ndarray | None = None

    @property
    def size(self) -> int:
        return int(self.head.size)

    @functools.cached_property
    def head_starts(self) -> np.ndarray:
        """The first grounding of each head (groundings are sorted by head)."""
        new = np.ones(self.head.size, bool)
        new[1:] = self.head[1:] != self.head[:-1]
        return np.flatnonzero(new)

    def take(self, rows: np.ndarray) -> "Groundings":
        return Groundings(self.rule, self.head_table, self.head[rows], self.input_tables,
                          [ids[rows] for ids in self.inputs], self.family,
                          None if self.member is None else self.member[rows])

    def split(self) -> list:
        """A family's groundings as one :class:`Groundings` per rule (in template order), each sorted by head as a
        rule's own groundings are; a single rule's: ``[self]``."""
        if not self.family:
            return [self]
        return [Groundings(rule, self.head_table, self.head[rows], self.input_tables, [ids[rows] for ids in self.inputs])
                for rule, rows in ((rule, np.flatnonzero(self.member == r)) for r, rule in enumerate(self.family))]


@dataclass(eq=False)
class Stage:
    """Atoms derived together (one predicate, or one level of a recursion) and the groundings that derive them."""

    atoms: dict          # table name -> atom ids
    groundings: list     # Groundings whose heads are these atoms
    label: str = ""


@dataclass(eq=False)
class Grounding:
    """What :func:`ground` returns: the graph, and what it took."""

    graph: object
    stats: dict
    tables: dict
    stages: list


@dataclass(eq=False)
class _Binding:
    """A partial grounding: example, variable columns, and for each body literal joined so far (by body position)
    the table it was joined with and the atom ids."""

    example: np.ndarray
    vars: dict
    ids: dict
    tables: dict
    member: np.ndarray | None = None   # a family's bindings: the rule of each row (see NumpyGrounder._families)

    @property
    def size(self) -> int:
        return int(self.example.size)

    def take(self, rows: np.ndarray) -> "_Binding":
        return _Binding(self.example[rows], {v: c[rows] for v, c in self.vars.items()},
                        {k: c[rows] for k, c in self.ids.items()}, dict(self.tables),
                        None if self.member is None else self.member[rows])


def ground(template: Template, facts, queries, *, seed: int = 0, prune: bool = True) -> Grounding:
    """Ground ``template`` on ``facts`` and return the :class:`Grounding` with the :class:`neurovec.Graph`.

    * ``facts``: a mapping predicate name -> :class:`Relation` (numpy arrays or DataFrames), or a
      :class:`~.sql.Database` (then the joins run in the database);
    * ``queries``: the outputs, in order: ``R.predict`` (one per example, in example order), ``R.h(V.X)``
      (all derived atoms of ``h`` per example), a :class:`Query` (explicit atoms), or a list of them;
    * ``seed``: for the weights the template gives only dimensions;
    * ``prune``: leave out neurons that only pass one input on unchanged (exact: NeuraLogic's
      ``prune_only_identities``, per neuron). Groundings the queries do not reach are always left out.
    """
    from ...memory import reusing_freed_memory
    from .assembly import assemble

    start = time.perf_counter()
    queries = [Query.create(q) for q in (queries if isinstance(queries, (list, tuple)) else [queries])]
    if not queries:
        raise TemplateError("no queries: say which atoms are the outputs")
    # Joins and assembly make and drop many grounding-sized temporaries: as in a compile, they reuse the pages freed
    # by the last one instead of faulting in fresh ones (Mutagenesis: 12.6 -> 10.4 ms a grounding, loaded machine).
    with reusing_freed_memory():
        if hasattr(facts, "connect") and hasattr(facts, "relations"):   # a sql.Database
            from .sql import SQLGrounder
            grounder = SQLGrounder(template, facts, queries, seed)
        else:
            grounder = NumpyGrounder(template, facts, queries, seed)
        stages, targets = grounder.run()
        grounded = time.perf_counter()
        n_groundings = sum(g.size for s in stages for g in s.groundings)
        stages, needed = prune_unreached(stages, grounder.tables, targets)
        graph = assemble(grounder.plan, grounder.tables, grounder.fact_tables, stages, targets, needed, prune)
    end = time.perf_counter()
    stats = {"groundings": n_groundings, "kept_groundings": sum(g.size for s in stages for g in s.groundings),
             "ground_s": grounded - start, "assemble_s": end - grounded, "total_s": end - start}
    return Grounding(graph, stats, grounder.tables, stages)


class Grounder:
    """What the numpy and the SQL grounders share: the strata in order, recursion, the queries.

    A subclass provides :meth:`derive` (ground rules into a table of atoms and sorted groundings),
    :meth:`fact_atoms` (the facts of a predicate as a table of atoms) and :meth:`encoded` (a table with its
    example and argument columns as ids of ``self.constants`` and ``self.examples``, for queries and messages).
    It sets ``plan``, ``queries``, ``fact_tables``, ``tables``, ``constants``, ``examples`` and ``scope``.
    """

    # -- grounding -------------------------------------------------------------------------------------------------
    def run(self) -> tuple[list, dict]:
        self.current: dict[str, str] = {}   # predicate -> the table body literals read
        for name in self.fact_tables:
            self.tables[name] = self.fact_atoms(name)
            self.current[name] = name
        needed = self._relevant_predicates()
        stages = []
        for stratum in self.plan.strata:
            if not needed.intersection(stratum.predicates):
                continue
            if not stratum.recursive:
                stages.append(self._ground_predicate(stratum.predicates[0], stratum.rules))
            elif stratum.depth is None:
                stages.extend(self._fixed_point(stratum))
            else:
                stages.extend(self._unrolled(stratum))
        return stages, self._resolve_queries()

    def _relevant_predicates(self) -> set:
        """Predicates the queries depend on (rules of others are not grounded at all)."""
        if getattr(self, "_needed", None) is not None:
            return self._needed
        unknown = [q for q in self.queries if q.key not in self.plan.arity]
        if unknown:
            raise TemplateError(f"query {unknown[0].describe()}: unknown predicate {unknown[0].key} (known: "
                                f"{sorted(self.plan.arity)})")
        asked = frozenset(q.key for q in self.queries)
        if ("needed", asked) in self.plan.memo:
            self._needed = self.plan.memo[("needed", asked)]
            return self._needed
        reads: dict[str, list] = {}
        for r in self.plan.template.rules:
            reads.setdefault(r.head.key, []).extend(lit.key for lit in r.body if not lit.special)
        needed, frontier = set(), list(asked)
        while frontier:
            p = frontier.pop()
            if p in needed:
                continue
            needed.add(p)
            frontier.extend(reads.get(p, ()))
        self._needed = self.plan.memo[("needed", asked)] = frozenset(needed)
        return self._needed

    def _ground_predicate(self, predicate: str, rules: list) -> Stage:
        """Ground the rules of a predicate that does not recurse; its atoms become the table named after it."""
        table, groundings = self.derive(predicate, predicate, rules, None)
        table.level = np.zeros(table.size, np.int64)
        self.tables[predicate] = table
        self.current[predicate] = predicate
        return Stage({predicate: np.flatnonzero(table.derived)}, groundings, predicate)

    # -- families of one-constant rules ----------------------------------------------------------------------------
    @functools.cached_property
    def plan_recursive(self) -> set:
        """The predicates of recursive strata."""
        return {p for stratum in self.plan.strata if stratum.recursive for p in stratum.predicates}

    @staticmethod
    def _family_signature(rule: Rule):
        """What rules of one family share: ``h(X..) <= p(.., c, ..)`` with one input literal holding exactly the
        head's variables and one constant ``c``, at the same place (then each atom of ``p`` grounds a rule at most
        once); the rules differ in the constant (and in weights and settings, which grounding does not read)."""
        if len(rule.body) != 1:
            return None
        lit = rule.body[0]
        if lit.special or lit.hidden or lit.function is not None:
            return None
        constants = [c for c, t in enumerate(lit.terms) if isinstance(t, Constant)]
        if len(constants) != 1 or not all(isinstance(t, Variable) for t in rule.head.terms) or \
                set(lit.variables) != set(rule.head.variables):
            return None
        pattern = tuple(None if c == constants[0] else t for c, t in enumerate(lit.terms))
        return rule.head.key, rule.head.terms, lit.key, pattern

    def _families(self, rules: list) -> list:
        """``rules`` in runs of consecutive rules with one :meth:`_family_signature` and distinct constants (a
        rule without a signature is a run of its own), e.g. ``W_e emb(A) :- type(A, e)`` for every element ``e``:
        one family is one selection over ``type`` instead of one per rule. Kept on the plan: it reads the rules only."""
        memo_key = ("families",) + tuple(rule.index for rule in rules)
        if memo_key not in self.plan.memo:
            self.plan.memo[memo_key] = self._find_families(rules)
        return self.plan.memo[memo_key]

    def _find_families(self, rules: list) -> list:
        groups, signature, constants = [], None, set()
        for rule in rules:
            sig = self._family_signature(rule)
            if sig is not None and groups and sig == signature:
                lit = rule.body[0]
                value = next(t for t in lit.terms if isinstance(t, Constant))
                key = (type(value.value), value.value)
                if key not in constants:
                    groups[-1].append(rule)
                    constants.add(key)
                    continue
            groups.append([rule])
            signature = sig
            constants = set()
            if sig is not None:
                value = next(t for t in rule.body[0].terms if isinstance(t, Constant))
                constants.add((type(value.value), value.value))
        return groups

    # -- recursion -------------------------------------------------------------------------------------------------
    def _fixed_point(self, stratum: Stratum) -> list:
        """Derive the atoms of a recursive component until nothing new appears; then each atom's level is its
        longest derivation (Kahn's algorithm, one whole-array step per level) and one stage is one level."""
        for p in stratum.predicates:  # start from the facts of the component (if any)
            self.tables[p] = self.fact_atoms(p)
            self.current[p] = p
        sizes = None
        while True:  # naive evaluation: every round joins the whole tables again (rounds = the longest derivation)
            derived = {p: self.derive(p, p, [r for r in stratum.rules if r.head.key == p], None)
                       for p in stratum.predicates}
            new_sizes = [derived[p][0].size for p in stratum.predicates]
            for p in stratum.predicates:
                self.tables[p] = derived[p][0]
            if new_sizes == sizes:
                break
            sizes = new_sizes
        groundings = [g for p in stratum.predicates for g in derived[p][1]]
        levels = self._levels(stratum, groundings)
        stages = []
        for level in range(int(max((lv.max(initial=-1) for lv in levels.values()), default=-1)) + 1):
            atoms = {p: np.flatnonzero(levels[p] == level) for p in stratum.predicates}
            subset = [g.take(np.flatnonzero(levels[g.head_table][g.head] == level)) for g in groundings]
            stages.append(Stage(atoms, [g for g in subset if g.size], f"{'+'.join(stratum.predicates)}@{level}"))
        for p in stratum.predicates:
            self.tables[p].level = levels[p]
        return stages

    def _levels(self, stratum: Stratum, groundings: list) -> dict:
        members = stratum.predicates
        offset = dict(zip(members, np.cumsum([0] + [self.tables[p].size for p in members[:-1]]).tolist()))
        total = sum(self.tables[p].size for p in members)
        derived = np.concatenate([self.tables[p].derived for p in members])
        src, dst = [], []
        for g in groundings:
            for table, ids in zip(g.input_tables, g.inputs):
                if table in offset:
                    uses = derived[offset[table] + ids]  # an input that is only a fact is no dependency
                    src.append(offset[table] + ids[uses])
                    dst.append(offset[g.head_table] + g.head[uses])
        src = np.concatenate(src) if src else np.zeros(0, np.int64)
        dst = np.concatenate(dst) if dst else np.zeros(0, np.int64)
        waiting = np.bincount(dst, minlength=total)
        order = np.argsort(src, kind="stable")
        ptr = np.concatenate([[0], np.cumsum(np.bincount(src, minlength=total))])
        level = np.full(total, -1, np.int64)
        frontier = np.flatnonzero(derived & (waiting == 0))
        depth = 0
        while frontier.size:
            level[frontier] = depth
            edges = order[_runs(ptr[frontier], ptr[frontier + 1] - ptr[frontier])]
            waiting -= np.bincount(dst[edges], minlength=total)
            touched = np.unique(dst[edges])
            frontier = touched[(waiting[touched] == 0) & (level[touched] < 0)]
            depth += 1
        stuck = np.flatnonzero(derived & (level < 0))
        if stuck.size:
            self._cycle_error(stratum, stuck[0], offset)
        return {p: level[offset[p]:offset[p] + self.tables[p].size] for p in members}

    def _cycle_error(self, stratum: Stratum, atom: int, offset: dict) -> None:
        p = max((q for q in stratum.predicates if offset[q] <= atom), key=lambda q: offset[q])
        table, i = self.tables[p], atom - offset[p]
        described = self._describe_atom(table, i)
        rules = "; ".join(f"{r.label} `{r}`" for r in stratum.rules)
        name, arity = p.rsplit("/", 1)
        raise TemplateError(f"recursion with no fixed point: the ground atom {described} depends on itself through "
                            f"{rules} (a cycle in the data); declare a depth with R.{name} / {arity} | "
                            "Metadata(depth=...) to unroll the recursion instead")

    def _describe_atom(self, table: Table, i: int) -> str:
        table = self.encoded(table)
        args = ", ".join(map(str, self.constants.decode([a[i] for a in table.args])))
        example = self.examples.decode([table.example[i]])[0] if self.examples.size else 0
        name = table.predicate.rsplit("/", 1)[0]
        return f"{name}({args}) in example {example!r}" if args else f"{name} in example {example!r}"

    def _unrolled(self, stratum: Stratum) -> list:
        """A recursion unrolled ``depth`` times: round 0 uses the rules that do not recurse, round t reads round
        t - 1 for the recursive literals; each round's atoms are their own table ``p@t``."""
        members = set(stratum.predicates)
        stages = []
        for t in range(stratum.depth + 1):
            reads_round = {p: f"{p}@{t - 1}" for p in members} if t else {}
            for p in stratum.predicates:
                rules = [r for r in stratum.rules if r.head.key == p and
                         (t > 0 or not any(lit.key in members for lit in r.body if not lit.special))]
                reads = {r.index: {k: reads_round[lit.key] for k, lit in enumerate(r.body)
                                   if not lit.special and lit.key in members} for r in rules}
                if not rules:
                    raise TemplateError(f"predicate {p}: every rule recurses, so round 0 of its unrolled recursion "
                                        "has no atoms; add a rule that does not recurse")
                table, groundings = self.derive(p, f"{p}@{t}", rules, reads)
                table.level = np.full(table.size, t, np.int64)
                self.tables[table.name] = table
                stages.append(Stage({table.name: np.flatnonzero(table.derived)}, groundings, table.name))
        for p in stratum.predicates:
            self.current[p] = f"{p}@{stratum.depth}"
        return stages

    # -- queries ---------------------------------------------------------------------------------------------------
    def _resolve_queries(self) -> dict:
        """The outputs, in query order: ``atom`` their atom ids, ``query`` the query each answers, and ``tables``
        the table of each query's atoms."""
        tables, atoms = [], []
        for q in self.queries:
            table = self.tables.get(self.current.get(q.key, ""))
            if table is None:
                raise TemplateError(f"query {q.describe()}: nothing derives {q.key} for these examples")
            atoms.append(self._query_atoms(q, self.encoded(table)))
            tables.append(table.name)
        return {"tables": tables, "atom": np.concatenate(atoms),
                "query": np.repeat(np.arange(len(atoms)), [ids.size for ids in atoms])}

    def _query_atoms(self, q: Query, table: Table) -> np.ndarray:
        if q.has_variables:
            mask = np.isin(table.example, self.scope)
            for c, term in enumerate(q.pattern):
                if isinstance(term, Constant):
                    mask &= table.args[c] == self.constants.encode_one(term)
            for c, term in enumerate(q.pattern):  # a repeated variable asks for equal constants
                first = next(j for j, t in enumerate(q.pattern) if t == term)
                if isinstance(term, Variable) and first != c:
                    mask &= table.args[c] == table.args[first]
            ids = np.flatnonzero(mask)
            if ids.size == 0:
                raise TemplateError(f"query {q.describe()} matches nothing: no atom of {q.predicate} is derived")
            return ids
        if q.pattern is not None:   # a ground literal, asked in every example of the scope
            example = self.scope
            args = [np.full(example.size, self.constants.encode_one(t), np.int64) for t in q.pattern]
            named = None
        else:
            args = [self.constants.encode(_as_ids(c)) for c in (q.args or ())]
            named = None if q.example is None else _as_ids(np.asarray(q.example).reshape(-1))
            if named is not None:
                example = self.examples.encode(named)
                if args and example.size == 1:
                    example, named = np.repeat(example, args[0].size), np.repeat(named, args[0].size)
            elif not args:
                example = self.scope
            elif self.examples.size == 0:
                example = np.zeros(args[0].size, np.int64)
            else:
                raise TemplateError(f"query {q.describe()}: say in which examples (example=...): the data has "
                                    "examples")
        keys_table, keys_probe = row_keys([table.example] + table.args,
                                          [np.maximum(example, 0)] + [np.maximum(a, 0) for a in args])
        found = lookup(keys_table, keys_probe, np.arange(table.size) if table.in_order else None)   # sorted keys
        bad = (found < 0) | (example < 0)
        for a in args:
            bad |= a < 0
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            what = q.describe() if q.pattern is not None or not q.args else \
                f"{q.predicate}({', '.join(str(np.asarray(c).reshape(-1)[k]) for c in q.args)})"
            ex = named[k].item() if named is not None else \
                self.examples.decode([example[k]])[0] if self.examples.size else 0
            raise TemplateError(f"query {what} in example {ex!r} (output {k}) matches nothing: the template derives "
                                f"no such atom of {q.predicate} (no grounding of its rules reaches it)")
        return found




def _check_join_types(template: Template, relations: dict) -> None:
    """A variable that joins two relations' columns joins constants of one type: an int never equals a string, so a
    join of ints with strings grounds to nothing (and the queries then "match nothing", far from the cause)."""
    for rule in template.rules:
        seen = {}   # variable -> (relation key, argument, kind) where it first reads a relation's column
        for lit in rule.body:
            relation = None if lit.special else relations.get(lit.key)
            if relation is None:
                continue
            for c, term in enumerate(lit.terms):
                column = relation.args[c]
                if not isinstance(term, Variable) or column.size == 0:
                    continue
                kind = "strings" if column.dtype.kind in "US" else "ints"
                first = seen.setdefault(term.name, (lit.key, c, kind))
                if first[2] != kind:
                    raise TemplateError(
                        f"{_Where(rule)}: variable {term.name} joins argument {first[1]} of relation {first[0]} "
                        f"({first[2]}) with argument {c} of relation {lit.key} ({kind}); an int never equals a "
                        "string, so this rule would ground to nothing: give both columns one type (e.g. "
                        "Relation(column.astype(str)) or ints for both)")


def relations_by_key(template: Template, relations) -> dict:
    """``{predicate key: relation}`` for ``(name, arity, relation)`` triples, checked: one relation
    per predicate, and none for a predicate that the template's own facts define."""
    found = {}
    for name, arity, relation in relations:
        key = relation_key(name, arity)
        if key in found:
            raise TemplateError(f"two relations for the predicate {key}")
        found[key] = relation
    for fact in template.facts:
        if fact.key in found:
            raise TemplateError(f"predicate {fact.key} has facts both in the template and in the data")
    return found


class NumpyGrounder(Grounder):
    """Grounds on in-memory relations, joining numpy arrays."""

    def __init__(self, template: Template, facts, queries: list, seed: int):
        if not hasattr(facts, "items"):
            raise TemplateError(f"facts must map predicate names to Relation objects (got {type(facts).__name__})")
        for name, relation in facts.items():
            if not isinstance(relation, Relation):
                raise TemplateError(f"relation {name!r}: expected a neurovec.relational.Relation (got "
                                    f"{type(relation).__name__}); build one with Relation(...) or Relation.from_frame")
        relations = relations_by_key(template, ((name, r.arity, r) for name, r in facts.items()))
        self.plan = make_plan(template, {key: r.value_shape for key, r in relations.items()}, seed)
        _check_join_types(template, relations)
        self.queries = queries
        self.tables: dict[str, Table] = {}
        self._indexes: list[tuple[np.ndarray, np.ndarray, ColumnIndex | None]] = []  # see _shared_index
        self._encode(relations)

    # -- encoding --------------------------------------------------------------------------------------------------
    def _encode(self, relations: dict) -> None:
        # A Relation's columns are constant columns already (ints or strings); the queries' and template's are made so.
        constants = [np.asarray(c) for q in self.queries for c in (q.args or ())]
        constants += [np.asarray([v]) for q in self.queries for v in q.constants()] + list(self.plan.constant_columns)
        self.constants = Vocabulary.of([c for r in relations.values() for c in r.args] + [_as_ids(c) for c in constants])
        self.constants.encode_constants(self.plan.constant_values)   # the rules' constants in two calls, not one each
        example_columns = [r.example for r in relations.values() if r.example is not None]
        example_columns += [_as_ids(np.asarray(q.example).reshape(-1)) for q in self.queries if q.example is not None]
        self.examples = Vocabulary.of(example_columns) if example_columns else Vocabulary(0, 1, np.zeros(0, str))
        self.scope = self._scope(relations)
        used = self._relevant_predicates()
        self.fact_tables = {name: encode_relation(name, r, self.constants, self.examples, self.scope)
                            for name, r in relations.items() if name in used}
        self.fact_tables.update(self._template_facts())
        self.n_examples = max(self.examples.size, 1)
        self.n_constants = max(self.constants.size, 1)

    def _scope(self, relations: dict) -> np.ndarray:
        """The example ids the queries ask about (all examples when some query names none)."""
        asked = []
        for q in self.queries:
            if q.example is None:
                present = [self.examples.encode(_as_ids(r.example)) for r in relations.values() if r.example is not None]
                return np.unique(np.concatenate(present)) if present else np.zeros(1, np.int64)
            asked.append(self.examples.encode(_as_ids(np.asarray(q.example).reshape(-1))))
        asked = np.concatenate(asked)
        if asked.size > 1 and bool(np.all(asked[1:] > asked[:-1])):   # every example once, in order already
            return asked
        return np.unique(asked)

    def _template_facts(self) -> dict:
        """Template facts hold in every example; one value row (a learnable embedding, or a unit) per fact."""
        tables = {}
        for key, indices in template_facts(self.plan).items():
            facts = [self.plan.template.facts[k] for k in indices]
            columns = [np.asarray([f.terms[c].value for f in facts]) for c in range(self.plan.arity[key])]
            relation = Relation(columns, size=len(facts))
            tables[key] = encode_relation(key, relation, self.constants, self.examples, self.scope,
                                          [self.plan.fact_weights[k] for k in indices])
        return tables

    def fact_atoms(self, predicate: str) -> Table:
        facts = self.fact_tables.get(predicate)
        if facts is None:
            zero = np.zeros(0, np.int64)
            return Table(predicate, predicate, zero, [zero] * self.plan.arity[predicate], zero, np.zeros(0, bool))
        n = facts.size
        return Table(predicate, predicate, facts.example, facts.args, np.arange(n), np.zeros(n, bool),
                     in_order=True)

    def encoded(self, table: Table) -> Table:
        return table

    def derive(self, predicate: str, name: str, rules: list, reads: dict | None) -> tuple[Table, list]:
        """Join the bodies of ``rules`` (``reads``: body position -> table, for recursion rounds), then derive.
        Outside recursion, a family of one-constant rules is selected in one pass (:meth:`_families`)."""
        if reads or predicate in self.plan_recursive:
            reads = reads or {}
            return self._derive(predicate, name, [(r, self._ground_body(r, reads.get(r.index))) for r in rules])
        bodies = []
        for group in self._families(rules):
            if len(group) == 1:
                bodies.append((group[0], self._ground_body(group[0], None)))
            else:
                bodies.append((tuple(group), self._ground_family(group)))
        return self._derive(predicate, name, bodies)

    def _ground_family(self, rules: list) -> _Binding:
        """The groundings of a family of rules (:meth:`_families`) at once: the rows of the literal's table whose
        constant is one of the family's, in the order :meth:`_ground_body` gives each rule's; ``member`` says whose.
        Each rule's rows, taken apart, are exactly its own grounding."""
        lit = rules[0].body[0]
        table = self.tables[self.current[lit.key]]
        position = next(c for c, t in enumerate(lit.terms) if isinstance(t, Constant))
        ids = np.asarray([self.constants.encode_one(r.body[0].terms[position]) for r in rules], np.int64)
        by_id = np.argsort(ids, kind="stable")
        sorted_ids = ids[by_id]
        column = table.args[position]
        found = np.minimum(np.searchsorted(sorted_ids, column), sorted_ids.size - 1)
        member = np.where(sorted_ids[found] == column, by_id[found], -1)
        mask = member >= 0
        columns = {}
        for c, term in enumerate(lit.terms):   # a repeated variable asks for equal constants
            if isinstance(term, Variable):
                if term.name in columns:
                    mask &= table.args[c] == table.args[columns[term.name]]
                else:
                    columns[term.name] = c
        head = [t.name for t in rules[0].head.terms]
        order = self._sorted_by(table, [columns[v] for v in head]) if head else None
        rows = np.flatnonzero(mask) if order is None else order[mask[order]]
        return _Binding(table.example[rows], {v: table.args[c][rows] for v, c in columns.items()}, {0: rows},
                        {0: table.name}, member[rows])

    def _derive(self, predicate: str, name: str, bodies: list) -> tuple[Table, list]:
        """The atoms of ``predicate`` (its facts and the distinct heads of its groundings, numbered in the order of
        their example and constants) and the groundings of each rule, sorted by head atom, then input atoms."""
        facts = self.fact_tables.get(predicate)
        head_columns = [self._head_columns(rule[0] if isinstance(rule, tuple) else rule, b) for rule, b in bodies]
        parts = ([[facts.example] + list(facts.args)] if facts is not None else []) + head_columns
        keys = self._keys(parts)
        head_keys = keys[1:] if facts is not None else keys
        distinct_keys, distinct_columns, sorted_bodies = [], [], []
        for (rule, binding), key, columns in zip(bodies, head_keys, head_columns):
            if key.size < 2 or bool(np.all(key[1:] > key[:-1])):  # one grounding per head, in order: nothing to sort
                distinct_keys.append(key)
                distinct_columns.append(columns)
                sorted_bodies.append((rule, binding, None, None))
                continue
            if binding.member is not None:  # a family: each rule's rows by head (the head fixes its input atom)
                order = _canonical_order(key, [binding.member], [len(rule)])
            else:
                positions = _input_positions(rule)
                order = _canonical_order(key, [binding.ids[k] for k in positions],
                                         [self.tables[binding.tables[k]].size for k in positions])
            if order is not None:
                key, binding, columns = key[order], binding.take(order), [c[order] for c in columns]
            new = np.ones(key.size, bool)
            new[1:] = key[1:] != key[:-1]
            if new.all():  # one grounding per head
                distinct_keys.append(key)
                distinct_columns.append(columns)
                sorted_bodies.append((rule, binding, None, None))
                continue
            starts = np.flatnonzero(new)   # integer gathers: faster than three boolean masks
            distinct_keys.append(key[starts])
            distinct_columns.append([c[starts] for c in columns])
            sorted_bodies.append((rule, binding, np.cumsum(new) - 1, starts))
        if facts is not None:
            distinct_keys.append(keys[0])
            distinct_columns.append(parts[0])
        all_keys = distinct_keys[0] if len(distinct_keys) == 1 else np.concatenate(distinct_keys)
        if len(distinct_keys) == 1 and facts is None:  # one rule: its distinct heads are sorted already
            inverse = None   # the identity
            columns = distinct_columns[0]
        else:
            _, first, inverse = np.unique(all_keys, return_index=True, return_inverse=True)
            inverse = inverse.reshape(-1)
            columns = [np.concatenate([c[j] for c in distinct_columns])[first] for j in range(len(parts[0]))]
        n = columns[0].size
        derived, fact_row = np.zeros(n, bool), np.full(n, -1, np.int64)
        offsets = list(itertools.accumulate((k.size for k in distinct_keys), initial=0))
        groundings = []
        for r, (rule, binding, group, starts) in enumerate(sorted_bodies):
            if inverse is None:  # one rule: its distinct heads are the atoms
                derived[:] = True
                head = np.arange(n) if group is None else group
            else:
                atom = inverse[offsets[r]:offsets[r + 1]]
                derived[atom] = True
                head = atom if group is None else atom[group]
            groundings.append(self._groundings(rule, binding, name, head))
            # where the heads change: known here (the heads' atoms are as distinct as their keys)
            groundings[-1].head_starts = np.arange(head.size) if starts is None else starts
        if facts is not None:
            fact_row[inverse[offsets[-2]:]] = np.arange(facts.size)
        # The atoms are numbered in the order of their keys: sorted by (example, args).
        return Table(name, predicate, columns[0], columns[1:], fact_row, derived, in_order=True), groundings

    def _groundings(self, rule, binding: _Binding, head_table: str, head_ids: np.ndarray) -> Groundings:
        """``rule``: a rule, or a family of them (a tuple; see :meth:`_families`)."""
        if isinstance(rule, tuple):
            return Groundings(rule[0], head_table, head_ids, [binding.tables[0]], [binding.ids[0]], rule,
                              binding.member)
        positions = _input_positions(rule)
        return Groundings(rule, head_table, head_ids, [binding.tables[k] for k in positions],
                          [binding.ids[k] for k in positions])

    def _head_columns(self, rule: Rule, binding: _Binding) -> list:
        columns = [binding.example]
        for term in rule.head.terms:
            if isinstance(term, Variable):
                columns.append(binding.vars[term.name])
            else:
                columns.append(np.full(binding.size, self.constants.encode_one(term), np.int64))
        return columns

    # -- joins -----------------------------------------------------------------------------------------------------
    def _keys(self, tables: list) -> list:
        """Row keys of several tables with the same columns (example first, then constants): a fixed mixed radix
        when it fits (then keys are comparable across calls), else jointly densified."""
        n_columns = len(tables[0])
        if self.n_examples * self.n_constants ** (n_columns - 1) < _LIMIT:
            return [self._radix(t) for t in tables]
        return row_keys(*[[np.maximum(c, 0) for c in t] for t in tables])

    def _radix(self, columns: list) -> np.ndarray:
        key = np.asarray(columns[0], np.int64)
        for column in columns[1:]:
            key = key * self.n_constants if key is columns[0] else np.multiply(key, self.n_constants, out=key)
            key += column   # in place (key is a fresh array here)
        return key

    def _selection(self, table: Table, lit) -> tuple[np.ndarray | None, dict]:
        """Rows of ``table`` that match the literal's constants and repeated variables; its variables' columns."""
        mask, first = None, {}
        for c, term in enumerate(lit.terms):
            if isinstance(term, Constant):
                test = table.args[c] == self.constants.encode_one(term)
            elif term.name in first:
                test = table.args[c] == table.args[first[term.name]]
            else:
                first[term.name] = c
                continue
            mask = test if mask is None else mask & test
        return (None if mask is None else np.flatnonzero(mask)), first

    def _ground_body(self, rule: Rule, reads: dict | None) -> _Binding:
        """All groundings of the body: joins in a greedy order (smallest literal first, then the literal sharing
        most variables with what is joined); special literals filter at the end."""
        pending = {}
        for k, lit in enumerate(rule.body):
            if lit.special:
                continue
            table = self.tables[(reads or {}).get(k) or self.current[lit.key]]
            rows, columns = self._selection(table, lit)
            pending[k] = (table, rows, columns)
        size = lambda k: pending[k][0].size if pending[k][1] is None else pending[k][1].size  # noqa: E731
        # Start from a literal holding every head variable, read in the order of the head's columns: each join
        # keeps the order of its left side, so the groundings then come out sorted by head (the canonical order
        # of _derive, which then has nothing left to sort). Otherwise from the smallest literal.
        head = [t.name for t in rule.head.terms if isinstance(t, Variable)]
        holding = [k for k in pending if set(head) <= set(pending[k][2])]
        k = min(holding or pending, key=lambda k: (size(k), k))
        # Of those, rather one that binds more variables, if it is not much larger: then more of the joins that follow
        # find one row per grounding (no rows to copy), as bond(X, Y, B) before atom(X).
        wider = [j for j in holding if len(pending[j][2]) > len(pending[k][2]) and size(j) <= 4 * size(k)]
        if wider:
            k = max(wider, key=lambda j: (len(pending[j][2]), -size(j), -j))
        table, rows, columns = pending.pop(k)
        order = self._sorted_by(table, [columns[v] for v in head]) if holding and head else None
        if order is not None:
            if rows is not None:  # the selected rows, in the sorted order
                selected = np.zeros(table.size, bool)
                selected[rows] = True
                rows = order[selected[order]]
            else:
                rows = order
        take = (lambda c: c) if rows is None else (lambda c: c[rows])  # noqa: E731
        binding = _Binding(take(table.example), {v: take(table.args[c]) for v, c in columns.items()},
                           {k: take(np.arange(table.size))}, {k: table.name})
        while pending:
            k = max(pending, key=lambda k: (len(set(pending[k][2]) & set(binding.vars)), -size(k), -k))
            table, rows, columns = pending.pop(k)
            binding = self._join(binding, k, table, rows, columns)
        keep = None
        for lit in rule.body:
            if lit.special:
                test = self._special(lit, binding)
                keep = test if keep is None else keep & test
        if keep is not None:
            binding = binding.take(np.flatnonzero(keep))
        if self._needs_dedup(rule) and binding.size:
            binding = self._dedup(rule, binding)
        return binding

    def _sorted_by(self, table: Table, columns: list) -> np.ndarray | None:
        """The table's rows in the order of (example, these argument columns, the rest), cached per table; None when
        they are in that order already."""
        if table.in_order and columns == list(range(len(columns))):
            return None
        key = ("by",) + tuple(columns)
        if key not in table._sorted:
            rest = [c for c in range(len(table.args)) if c not in columns]
            keys = row_keys([table.example] + [table.args[c] for c in columns + rest])[0]
            table._sorted[key] = None if keys.size < 2 or bool(np.all(keys[1:] >= keys[:-1])) \
                else np.argsort(keys, kind="stable")
        return table._sorted[key]

    def _join(self, binding: _Binding, k: int, table: Table, rows, columns: dict) -> _Binding:
        shared = [v for v in columns if v in binding.vars]
        left = [binding.example] + [binding.vars[v] for v in shared]
        # Keys over the example and every argument are an atom's identity: at most one match each.
        unique = len(shared) == len(table.args) and len(set(columns.values())) == len(table.args)
        index = self._column_index(table, columns[shared[0]]) if rows is None and len(shared) == 1 else None
        cached = rows is None and self.n_examples * self.n_constants ** len(shared) < _LIMIT
        if index is not None:
            li, ri = index.join(binding.example, binding.vars[shared[0]], right_unique=unique)
        elif cached:
            cache_key = tuple(columns[v] for v in shared)
            if cache_key not in table._sorted:
                right_key = self._radix([table.example] + [table.args[columns[v]] for v in shared])
                prefix = cache_key == tuple(range(len(shared))) and table.in_order
                table._sorted[cache_key] = (right_key, np.arange(table.size) if prefix else
                                            np.argsort(right_key, kind="stable"))
            right_key, order = table._sorted[cache_key]
            left_key = self._radix(left)
        else:
            all_rows = np.arange(table.size) if rows is None else rows
            right = [table.example[all_rows]] + [table.args[columns[v]][all_rows] for v in shared]
            left_key, right_key = self._keys([left, right])
            order = None
        if index is None:
            li, ri = join(left_key, right_key, order, right_unique=unique)
        atom = ri if rows is None else rows[ri]
        if li is None or (unique and li.size == binding.size):  # every row matched once: nothing to gather
            joined = _Binding(binding.example, dict(binding.vars), dict(binding.ids), dict(binding.tables))
        else:
            joined = binding.take(li)
        for v, c in columns.items():
            if v not in joined.vars:
                joined.vars[v] = table.args[c][atom]
        joined.ids[k] = atom
        joined.tables[k] = table.name
        return joined

    def _column_index(self, table: Table, column: int) -> ColumnIndex | None:
        """The table's rows by one argument column (cached), when each of its constants is in one example."""
        key = ("column", column)
        if key not in table._sorted:
            table._sorted[key] = self._shared_index(table.args[column], table.example)
        return table._sorted[key]

    def _shared_index(self, column: np.ndarray, example: np.ndarray) -> ColumnIndex | None:
        """The :class:`ColumnIndex` of these columns: one built for equal columns before (the atoms of successive layers
        of a GNN are the same nodes, compared whole here), or a new one."""
        for other_column, other_example, index in self._indexes:
            if other_column.size == column.size and np.array_equal(other_column, column) and \
                    np.array_equal(other_example, example):
                return index
        index = ColumnIndex.build(column, example, self.n_constants)
        self._indexes.append((column, example, index))
        return index

    def _special(self, lit, binding: _Binding) -> np.ndarray:
        def column(term):
            if isinstance(term, Variable):
                return binding.vars[term.name]
            return np.full(binding.size, self.constants.encode_one(term), np.int64)

        cols = [column(t) for t in lit.terms]
        if lit.name == "alldiff":
            keep = np.ones(binding.size, bool)
            for i in range(len(cols)):
                for j in range(i + 1, len(cols)):
                    keep &= cols[i] != cols[j]
            return keep
        a, b = cols
        return {"neq": a != b, "eq": a == b, "lt": a < b, "leq": a <= b, "gt": a > b, "geq": a >= b}[lit.name]

    @staticmethod
    @functools.lru_cache(maxsize=4096)   # rules are immutable (and hash by identity)
    def _needs_dedup(rule: Rule) -> bool:
        """Two groundings with the same head and the same input atoms are one rule neuron in NeuraLogic; that can
        only happen when some variable occurs only in hidden or special literals."""
        if rule.metadata.duplicate_grounding:
            return False
        inputs = {v for lit in rule.literals for v in lit.variables} | set(rule.head.variables)
        return any(v not in inputs for lit in rule.body for v in lit.variables)

    def _dedup(self, rule: Rule, binding: _Binding) -> _Binding:
        positions = _input_positions(rule)
        columns = self._head_columns(rule, binding) + [binding.ids[k] for k in positions]
        (key,) = row_keys([np.asarray(c, np.int64) for c in columns])
        first, _ = distinct(key)
        return binding.take(np.sort(first))

def prune_unreached(stages: list, tables: dict, targets: dict) -> tuple[list, dict]:
    """Keep only the groundings the queries reach, walking the stages from the last one back; also returns, per
    table, which atoms are reached."""
    needed = {name: np.zeros(t.size, bool) for name, t in tables.items()}
    for name, _, atoms in target_atoms(targets):
        needed[name][atoms] = True
    kept = []
    derived = {name for stage in stages for name in stage.atoms}   # only their atoms are ever dropped
    for stage in reversed(stages):
        groundings = []
        for g in stage.groundings:
            reached = needed[g.head_table][g.head]
            if not reached.all():
                g = g.take(np.flatnonzero(reached))
            for table, ids in zip(g.input_tables, g.inputs):
                if table in derived:
                    needed[table][ids] = True
            if g.size:
                groundings.append(g)
        atoms = {name: ids[needed[name][ids]] for name, ids in stage.atoms.items()}
        kept.append(Stage(atoms, groundings, stage.label))
    return kept[::-1], needed


def target_atoms(targets: dict):
    """``(table name, output rows, atom ids)`` of each query's outputs (see :meth:`Grounder._resolve_queries`)."""
    query, atom = targets["query"], targets["atom"]
    one = len(targets["tables"]) == 1
    for k, name in enumerate(targets["tables"]):
        rows = np.arange(atom.size) if one else np.flatnonzero(query == k)
        yield name, rows, atom[rows]


def template_facts(plan: Plan) -> dict:
    """Predicate key -> the indices of its template facts."""
    by_key: dict[str, list] = {}
    for k, fact in enumerate(plan.template.facts):
        by_key.setdefault(fact.key, []).append(k)
    return by_key


def relation_key(name: str, arity: int) -> str:
    """The predicate key of a data relation given under ``name``: ``name/arity`` (a name may carry it already)."""
    if "/" in name:
        if not name.rsplit("/", 1)[1].isdigit() or int(name.rsplit("/", 1)[1]) != arity:
            raise TemplateError(f"relation {name!r} has {arity} argument columns")
        return name
    return f"{name}/{arity}"


def _input_positions(rule: Rule) -> list:
    """Body positions of the rule's input literals (not hidden, not special)."""
    return rule.input_positions


def _canonical_order(head_key: np.ndarray, inputs: list, bounds: list) -> np.ndarray | None:
    """The order that sorts groundings by head key, then input atoms (None: already sorted). Graphs come out the
    same whichever way the groundings were found (numpy joins in any order, or SQL)."""
    if head_key.size < 2:
        return None
    width = int(head_key.max()) + 1
    for bound in bounds:
        width *= max(bound, 1)
    if width < _LIMIT:
        key = head_key
        for ids, bound in zip(inputs, bounds):
            key = key * max(bound, 1) if key is head_key else np.multiply(key, max(bound, 1), out=key)
            key += ids   # in place: one array, not two per input
        if bool(np.all(key[1:] >= key[:-1])):
            return None
        return np.argsort(key)
    return np.lexsort(tuple(inputs[::-1]) + (head_key,))


def _runs(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    from .joins import expand_runs
    return expand_runs(starts, counts)


def _as_ids(column) -> np.ndarray:
    """Constants (any array-like) as a 1-D int64 or str column."""
    from .data import as_column
    return as_column(np.asarray(column).reshape(-1), "constants")
