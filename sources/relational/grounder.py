"""What the numpy and the SQL grounders share: the tables of atoms and groundings, the strata in order, recursion,
the queries, and the helpers both use (:mod:`.grounding` joins numpy arrays, :mod:`.sql` joins in a database;
:mod:`.assembly` reads the tables). Nothing here imports either grounder, so the package's imports run one way:
template <- data, plan, encoding, joins <- grounder <- assembly, sql <- grounding (the entry point, ``ground``).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from .data import Query, as_column
from .joins import expand_runs, lookup, row_keys, stable_order
from .plan import Plan, Stratum
from .template import Constant, Rule, Template, TemplateError, Variable

__all__ = ["Table", "Groundings", "Stage", "Grounding", "Grounder", "relations_by_key", "prune_unreached",
           "target_atoms", "template_facts", "relation_key", "needs_dedup"]

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
    sql: object = None                # the SQL grounder's temporary table of these atoms (an sa.table)
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
    # A family of rules with one body shape that differ in one constant (see NumpyGrounder._join_families): sorted by
    # rule, then as each rule's own groundings are (by head, then input atoms), so each rule's rows are one run.
    joined: bool = False

    @property
    def size(self) -> int:
        return int(self.head.size)

    @functools.cached_property
    def head_starts(self) -> np.ndarray:
        """The first grounding of each head (groundings are sorted by head; a joined family's by rule and head)."""
        new = np.ones(self.head.size, bool)
        new[1:] = self.head[1:] != self.head[:-1]
        if self.joined:
            new[1:] |= self.member[1:] != self.member[:-1]
        return np.flatnonzero(new)

    def take(self, rows: np.ndarray) -> "Groundings":
        return Groundings(self.rule, self.head_table, self.head[rows], self.input_tables,
                          [ids[rows] for ids in self.inputs], self.family,
                          None if self.member is None else self.member[rows], self.joined)

    def split(self) -> list:
        """A family's groundings as one :class:`Groundings` per rule (in template order), each sorted by head as a
        rule's own groundings are; a single rule's: ``[self]``."""
        if not self.family:
            return [self]
        if self.joined:   # each rule's rows are one run
            bounds = np.searchsorted(self.member, np.arange(len(self.family) + 1)).tolist()
            return [Groundings(rule, self.head_table, self.head[a:b], self.input_tables, [ids[a:b] for ids in self.inputs])
                    for rule, a, b in zip(self.family, bounds[:-1], bounds[1:])]
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


class Grounder:
    """What the numpy and the SQL grounders share: the strata in order, recursion, the queries.

    A subclass provides :meth:`derive` (ground rules into a table of atoms and sorted groundings),
    :meth:`fact_atoms` (the facts of a predicate as a table of atoms) and :meth:`encoded` (a table with its
    example and argument columns as ids of ``self.constants`` and ``self.examples``, for queries and messages).
    It sets ``plan``, ``queries``, ``fact_tables``, ``tables``, ``constants``, ``examples`` and ``scope``.
    """

    @property
    def has_examples(self) -> bool:
        """Whether some relation has an example column (else the data is one example, id 0)."""
        return any(r.example is not None for r in self.relations.values())

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
        order = stable_order(src)
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
            elif not self.has_examples:   # one example, implicit (no relation has an example column)
                example = np.zeros(args[0].size, np.int64)
            else:
                with_examples = sorted(k for k, r in self.relations.items() if r.example is not None)
                raise TemplateError(f"query {q.describe()}: say in which examples (example=...): relations "
                                    f"{with_examples} have an example column, so the data has several examples")
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


@functools.lru_cache(maxsize=4096)   # rules are immutable (and hash by identity)
def needs_dedup(rule: Rule) -> bool:
    """Two groundings with the same head and the same input atoms are one rule neuron in NeuraLogic; that can
    only happen when some variable occurs only in hidden or special literals."""
    if rule.metadata.duplicate_grounding:
        return False
    inputs = {v for lit in rule.literals for v in lit.variables} | set(rule.head.variables)
    return any(v not in inputs for lit in rule.body for v in lit.variables)


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
    return expand_runs(starts, counts)


def _as_ids(column) -> np.ndarray:
    """Constants (any array-like) as a 1-D int64 or str column."""
    return as_column(np.asarray(column).reshape(-1), "constants")
