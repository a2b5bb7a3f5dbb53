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

import itertools
import time
from dataclasses import dataclass

import numpy as np

from ...memory import reusing_freed_memory
from .assembly import assemble
from .data import Query, Relation
from .encoding import Vocabulary, encode_relation
from .grounder import (_LIMIT, Grounder, Grounding, Groundings, Stage, Table, _as_ids, _canonical_order,
                       _input_positions, needs_dedup, prune_unreached, relations_by_key, template_facts)
from .joins import ColumnIndex, distinct, distinct_rows, join, row_keys, stable_order
from .plan import _Where, make_plan
from .sql import SQLGrounder
from .template import Constant, Rule, Template, TemplateError, Variable

__all__ = ["ground", "Grounding", "Table", "Groundings", "Stage"]


@dataclass(eq=False)
class _Binding:
    """A partial grounding: example, variable columns, and for each body literal joined so far (by body position)
    the table it was joined with and the atom ids."""

    example: np.ndarray
    vars: dict
    ids: dict
    tables: dict
    member: np.ndarray | None = None   # a family's bindings: the rule of each row (see NumpyGrounder._families)
    joined: bool = False               # a family of joins (see NumpyGrounder._join_families)

    @property
    def size(self) -> int:
        return int(self.example.size)

    def take(self, rows: np.ndarray) -> "_Binding":
        return _Binding(self.example[rows], {v: c[rows] for v, c in self.vars.items()},
                        {k: c[rows] for k, c in self.ids.items()}, dict(self.tables),
                        None if self.member is None else self.member[rows], self.joined)


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
    start = time.perf_counter()
    queries = [Query.create(q) for q in (queries if isinstance(queries, (list, tuple)) else [queries])]
    if not queries:
        raise TemplateError("no queries: say which atoms are the outputs")
    # Joins and assembly make and drop many grounding-sized temporaries: as in a compile, they reuse the pages freed
    # by the last one instead of faulting in fresh ones (Mutagenesis: 12.6 -> 10.4 ms a grounding, loaded machine).
    with reusing_freed_memory():
        if hasattr(facts, "connect") and hasattr(facts, "relations"):   # a sql.Database
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


Template._ground = staticmethod(ground)   # Template.ground (see there)


def _check_join_types(template: Template, relations: dict, memo: dict) -> None:
    """A variable that joins two relations' columns joins constants of one type: an int never equals a string, so a
    join of ints with strings grounds to nothing (and the queries then "match nothing", far from the cause). Checked
    once per plan (``memo``) and kind of each column (strings, ints or empty)."""
    kinds = ("join types",) + tuple(sorted((key, tuple("empty" if c.size == 0 else c.dtype.kind in "US"
                                                       for c in r.args)) for key, r in relations.items()))
    if kinds in memo:
        return
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
    memo[kinds] = True


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
        _check_join_types(template, relations, self.plan.memo)
        self.queries, self.relations = queries, relations
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
        for group in self._join_families(rules):
            if len(group) == 1:
                bodies.append((group[0], self._ground_body(group[0], None)))
            elif self._join_signature(group[0]) is not None:
                bodies.append((tuple(group), self._ground_body(group[0], None, group)))
            else:
                bodies.append((tuple(group), self._ground_family(group)))
        return self._derive(predicate, name, bodies)

    def _join_families(self, rules: list) -> list:
        """:meth:`_families`, with runs of consecutive rules of one :meth:`_join_signature` and distinct constants
        joined as one family too, e.g. the rule per edge type ``t`` of an RGCN, ``W_t h(I) :- g(J), _edge(J, t, I)``:
        one join for all edge types instead of one per type. (Only here: the SQL grounder joins such rules one by
        one.) Kept on the plan: it reads the rules only."""
        families = self._families(rules)
        memo_key = ("join families",) + tuple(rule.index for rule in rules)
        cached = self.plan.memo.get(memo_key)
        if cached is not None and cached[0] is families:   # (the families of _families, memoized: the same list)
            return cached[1]
        groups, signature, constants = [], None, set()
        for group in families:
            sig = self._join_signature(group[0]) if len(group) == 1 else None
            if sig is not None:
                value = sig[-1]
                if groups and sig[:-1] == signature and value not in constants:
                    groups[-1].append(group[0])
                    constants.add(value)
                    continue
                signature, constants = sig[:-1], {value}
            else:
                signature, constants = None, set()
            groups.append(list(group))
        self.plan.memo[memo_key] = (families, groups)
        return groups

    @staticmethod
    def _join_signature(rule: Rule):
        """What rules of one join family share: a body of two or more literals with exactly one constant, in a literal
        that is no comparison, and otherwise the same literals, head and deduplication; the rules differ in that
        constant (the last item, ``(type, value)``) and in weights and settings, which grounding does not read."""
        if len(rule.body) < 2:
            return None
        found = [(k, c) for k, lit in enumerate(rule.body) for c, t in enumerate(lit.terms) if isinstance(t, Constant)]
        if len(found) != 1 or rule.body[found[0][0]].special:
            return None
        (k0, c0), = found
        pattern = tuple((lit.key, lit.hidden, lit.special, lit.name,
                         tuple(None if (k, c) == (k0, c0) else t for c, t in enumerate(lit.terms)))
                        for k, lit in enumerate(rule.body))
        value = rule.body[k0].terms[c0].value
        return rule.head.key, rule.head.terms, pattern, k0, c0, needs_dedup(rule), (type(value), value)

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
            if binding.joined and key.size:   # a join family: by rule, then each rule's canonical order
                positions = _input_positions(rule[0])
                order = _canonical_order(binding.member, [key] + [binding.ids[k] for k in positions],
                                         [int(key.max()) + 1] + [self.tables[binding.tables[k]].size for k in positions])
                if order is not None:
                    key, binding, columns = key[order], binding.take(order), [c[order] for c in columns]
                new = np.ones(key.size, bool)
                new[1:] = (key[1:] != key[:-1]) | (binding.member[1:] != binding.member[:-1])
                starts = np.flatnonzero(new)
                distinct_keys.append(key[starts])
                distinct_columns.append([c[starts] for c in columns])
                sorted_bodies.append((rule, binding, None if starts.size == key.size else np.cumsum(new) - 1, starts))
                continue
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
        if len(distinct_keys) == 1 and facts is None and not bodies[0][1].joined:  # one rule: its heads are sorted
            inverse = None   # the identity
            columns = distinct_columns[0]
        else:
            first, inverse = distinct_rows(all_keys)   # equal keys, equal columns: any row of each key is its atom's
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
        if isinstance(rule, tuple) and binding.joined:
            positions = _input_positions(rule[0])
            return Groundings(rule[0], head_table, head_ids, [binding.tables[k] for k in positions],
                              [binding.ids[k] for k in positions], rule, binding.member, joined=True)
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

    def _ground_body(self, rule: Rule, reads: dict | None, family: list | None = None) -> _Binding:
        """All groundings of the body: joins in a greedy order (smallest literal first, then the literal sharing
        most variables with what is joined); special literals filter at the end. With ``family`` (a join family,
        see :meth:`_join_families`; ``rule`` is its first), the groundings of all its rules: the literal with the
        constant matches any of theirs, and ``member`` says whose each row is."""
        pending, member_of = {}, None
        k0 = self._join_signature(rule)[3] if family is not None else None
        for k, lit in enumerate(rule.body):
            if lit.special:
                continue
            table = self.tables[(reads or {}).get(k) or self.current[lit.key]]
            if k == k0:
                rows, columns, member_of = self._family_selection(table, lit, family, k0)
            else:
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
        if k == k0:   # a join family, from its constant's literal: by rule first (a stable radix sort of small ints), so
            # that its groundings come out in the order of _derive (by rule, then head) where the joins keep it
            small = np.int16 if len(family) <= np.iinfo(np.int16).max else np.int64
            rows = rows[np.argsort(member_of[rows].astype(small), kind="stable")]
        take = (lambda c: c) if rows is None else (lambda c: c[rows])  # noqa: E731
        binding = _Binding(take(table.example), {v: take(table.args[c]) for v, c in columns.items()},
                           {k: take(np.arange(table.size))}, {k: table.name})
        if k == k0:
            binding.member, binding.joined = member_of[binding.ids[k]], True
        while pending:
            k = max(pending, key=lambda k: (len(set(pending[k][2]) & set(binding.vars)), -size(k), -k))
            table, rows, columns = pending.pop(k)
            binding = self._join(binding, k, table, rows, columns)
            if k == k0:
                binding.member, binding.joined = member_of[binding.ids[k]], True
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

    def _family_selection(self, table: Table, lit, family: list, k0: int) -> tuple[np.ndarray, dict, np.ndarray]:
        """:meth:`_selection` for the literal of a join family's constant: the rows whose constant is one of the
        family's (and whose repeated variables agree), the variables' columns, and the rule of each row of the table
        (its place in ``family``, -1 for none)."""
        position = next(c for c, t in enumerate(lit.terms) if isinstance(t, Constant))
        ids = self._family_ids(family, k0, position)
        column = table.args[position]
        if self.n_constants <= 2 * column.size + 1024:   # a table from id to rule: one gather
            # The family's constants are distinct, and so are their ids, but for -1 (a constant no fact holds): the
            # table's last entry, left -1.
            rule_of = np.full(self.n_constants + 1, -1, np.int64)
            rule_of[ids] = np.arange(ids.size)
            rule_of[-1] = -1
            member = rule_of[column]
        else:   # few rules among many constants: a binary search
            by_id = np.argsort(ids, kind="stable")
            sorted_ids = ids[by_id]
            found = np.minimum(np.searchsorted(sorted_ids, column), sorted_ids.size - 1)
            member = np.where(sorted_ids[found] == column, by_id[found], -1)
        mask, first = member >= 0, {}
        for c, term in enumerate(lit.terms):
            if isinstance(term, Variable):
                if term.name in first:
                    mask &= table.args[c] == table.args[first[term.name]]
                else:
                    first[term.name] = c
        return np.flatnonzero(mask), first, member

    def _family_ids(self, family: list, k0: int, position: int) -> np.ndarray:
        """The constant of each rule of a join family, as ids (-1: a constant no fact or query holds), encoded in one
        call per type; the constants themselves are kept on the plan (they are the template's)."""
        memo_key = ("family constants",) + tuple(rule.index for rule in family)
        values = self.plan.memo.get(memo_key)
        if values is None:
            values = [rule.body[k0].terms[position].value for rule in family]
            kinds = {type(v) for v in values}
            if kinds == {int} and all(-(1 << 63) <= v < (1 << 63) for v in values):
                values = np.asarray(values, np.int64)
            elif kinds == {str}:
                values = np.asarray(values, str)   # else (mixed or other types) one at a time
            self.plan.memo[memo_key] = values
        if isinstance(values, np.ndarray):
            return self.constants.encode(values).astype(np.int64, copy=False)
        return np.asarray([self.constants.encode_one(v) for v in values], np.int64)

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
                else stable_order(keys)
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
                                            stable_order(right_key))
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
            joined = _Binding(binding.example, dict(binding.vars), dict(binding.ids), dict(binding.tables),
                              binding.member, binding.joined)
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

    _needs_dedup = staticmethod(needs_dedup)

    def _dedup(self, rule: Rule, binding: _Binding) -> _Binding:
        positions = _input_positions(rule)
        columns = self._head_columns(rule, binding) + [binding.ids[k] for k in positions]
        if binding.member is not None:   # a join family: duplicates within one rule
            columns.append(binding.member)
        (key,) = row_keys([np.asarray(c, np.int64) for c in columns])
        first, _ = distinct(key)
        return binding.take(np.sort(first))
