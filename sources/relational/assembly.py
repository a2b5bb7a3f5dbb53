"""Groundings -> the layers of a :class:`neurovec.Graph`, in NeuraLogic 0.9.2's semantics.

NeuraLogic computes three kinds of neurons (``docs/neuralogic.md``); each becomes layers here:

* a **rule neuron** per grounding: ``T_r(C_r(offset, W_1 x_1, ..., W_n x_n))`` over the body's input
  literals, in body order;
* an **aggregation neuron** per rule and head atom: ``A_r`` of that head's rule neurons;
* an **atom neuron** per derived atom: ``T_p(C_p(offset, W_h1 agg_1, ...))`` over the rules that derive it,
  in template order, with their head weights. The predicate offset counts only in atoms with a weighted
  input (NeuraLogic's ``WeightedAtomNeuron``).

neurovec computes ``T(A(W_i x_i) + b)``: a sum's offset is the bias ``b``; any other combination's offset is
an extra first input (the unit fact times the offset weight), as NeuraLogic puts it first. One layer holds
the neurons of one rule (rule and aggregation neurons) or one predicate (atom neurons) at one stage, so the
grouping is the thesis' 5.1.8 by construction; the aggregation neurons of a join family (a rule per edge type) are
one layer for all its rules. Neuron lists are built as whole arrays: CSR ``counts`` and
edge columns per layer.

With ``prune`` (the default), a neuron that passes its single input on unchanged (a one-grounding
aggregation, a one-rule unweighted atom with the identity, a rule of one unweighted literal) is left out
and its readers read its input instead; a rule neuron that multiplies one input by a scalar fact ``c`` (GCN's
normalization) becomes an edge of its aggregation neuron with the fixed weight ``c``. Both compute the same
floating-point numbers.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..graph import NO_WEIGHT, FactLayer, Graph, NeuronLayer, Weight, prepend_inputs
from .grounder import Stage, target_atoms
from .joins import unique_keys
from .plan import TRANSFORMATIONS, Plan

__all__ = ["assemble"]

_COMBINATION = {"sum": "sum", "avg": "mean", "max": "max", "min": "min", "product": "prod", "elproduct": "prod"}
_UNIT = 0   # layer 0 is one unit fact: offsets and counts read it; unit facts of the data are all this neuron
_MAX_CONSTANTS = 4096   # a product's scalar fact becomes a fixed edge weight when its values are this few


def assemble(plan: Plan, tables: dict, fact_tables: dict, stages: list, targets: dict, needed: dict,
             prune: bool = True) -> Graph:
    builder = _Assembler(plan, tables, fact_tables, needed, prune)
    stages = builder.plan_inlining(stages, targets)
    builder.facts()
    for stage in stages:
        builder.stage(stage)
    return builder.graph(targets)


class _Assembler:
    def __init__(self, plan: Plan, tables: dict, fact_tables: dict, needed: dict, prune: bool):
        self.plan, self.tables, self.fact_tables, self.needed, self.prune = plan, tables, fact_tables, needed, prune
        if "unit" not in plan.memo:   # layers are immutable: every grounding's graph may share this one
            plan.memo["unit"] = FactLayer.units("unit", 1)
        self.layers: list = [plan.memo["unit"]]
        self.names = {"unit"}   # the layers' names
        # A Weight holds a private read-only copy of its value, so one made for an earlier grounding with this plan
        # is shared, not made again.
        if "weights" not in plan.memo:
            plan.memo["weights"] = [Weight(w.name, w.value, w.learnable) for w in plan.weights.values()]
        self.weights = list(plan.memo["weights"])
        self.weight_index = {w.name: i for i, w in enumerate(self.weights)}
        # Where each atom's value is: per table, layer and ordinal of every atom (-1: not built).
        self.ref = {name: tuple(np.full((2, t.size), -1, np.int64)) for name, t in tables.items()}

    # -- helpers ---------------------------------------------------------------------------------------------------
    def weight(self, name: str | None) -> int:
        return NO_WEIGHT if name is None else self.weight_index[name]

    def constant(self, value) -> int:
        """A fixed weight holding ``value`` (one per distinct value)."""
        value = np.asarray(value, dtype=np.float64)
        name = f"const:{value.tolist()!r}" if value.ndim else f"const:{float(value)!r}"
        if name not in self.weight_index:
            self.weight_index[name] = len(self.weights)
            self.weights.append(Weight(name, value, learnable=False))
        return self.weight_index[name]

    def add(self, layer) -> int:
        name, k = layer.name, 1
        while name in self.names:
            k += 1
            name = f"{layer.name}#{k}"
        self.names.add(name)
        self.layers.append(layer if name == layer.name else replace(layer, name=name, copy=False))
        return len(self.layers) - 1

    def neurons(self, name: str, counts, in_layer, in_ordinal, in_weight, offset, combination: str,
                transformation: str, shape: tuple, scalar_edges=None) -> int:
        """One layer of NeuraLogic neurons ``T(C(offset, inputs))`` (edges CSR-ordered by neuron); returns the index
        of the layer holding their values (after follow-up steps such as signum's relu). ``offset``: a weight index
        per neuron, one for all, or None."""
        counts = np.asarray(counts, np.int64)
        n = counts.size
        function, fixed_bias, steps = TRANSFORMATIONS[transformation]
        in_weight = np.asarray(in_weight, dtype=np.int64)
        if combination == "count":  # the number of inputs: a sum of unit facts
            total = int(counts.sum())
            in_layer, in_ordinal = np.full(total, _UNIT), np.zeros(total, np.int64)
            in_weight = np.full(total, NO_WEIGHT)
            aggregation = "sum"
        else:
            aggregation = _COMBINATION[combination]
            if scalar_edges is not None and shape != () and scalar_edges.any():
                # NeuraLogic broadcasts a scalar input over the others' shape: ones * s is s in every element.
                in_weight = np.where(scalar_edges, self.constant(np.ones(shape)), in_weight)
        bias = np.full(n, NO_WEIGHT if fixed_bias is None else self.constant(fixed_bias), np.int64)
        if offset is not None and np.ndim(offset) == 0:  # one offset for every neuron
            offset = None if offset == NO_WEIGHT else np.full(n, offset)
        has_offset = np.asarray(offset) != NO_WEIGHT if offset is not None else None
        if has_offset is not None and has_offset.any():
            if aggregation == "sum" and fixed_bias is None:
                bias[has_offset] = np.asarray(offset)[has_offset]
            else:  # the offset is NeuraLogic's first input: the unit fact times the offset weight
                counts, (in_layer, in_ordinal, in_weight) = prepend_inputs(
                    counts, has_offset, [in_layer, in_ordinal, in_weight],
                    [_UNIT, 0, np.asarray(offset)[has_offset]])
        index = self.add(NeuronLayer(name, counts, in_layer, in_ordinal, in_weight, bias, aggregation, function,
                                     copy=False))
        for k, (step, weight, step_bias) in enumerate(steps):
            w = NO_WEIGHT if weight is None else self.constant(weight)
            b = NO_WEIGHT if step_bias is None else self.constant(step_bias)
            index = self.add(NeuronLayer(f"{name}/{transformation}{k + 1}", np.ones(n, np.int64), np.full(n, index),
                                         np.arange(n), np.full(n, w), np.full(n, b), "sum", step, copy=False))
        return index

    def is_identity(self, transformation: str) -> bool:
        return TRANSFORMATIONS[transformation] == ("identity", None, ())

    # -- facts -----------------------------------------------------------------------------------------------------
    def facts(self) -> None:
        """Fact neurons of every needed atom that no rule derives: one layer per predicate with values, the unit
        neuron for unit facts, an embedding layer (unit times a learnable weight) for weighted template facts."""
        by_predicate: dict[str, list] = {}
        for name, used in self.used.items():
            table = self.tables[name]
            wanted = np.flatnonzero(used & ~table.derived & (table.fact_row >= 0))
            if wanted.size:
                by_predicate.setdefault(table.predicate, []).append((name, wanted))
        for predicate, parts in by_predicate.items():
            facts = self.fact_tables[predicate]
            rows = [facts.value_row[self.tables[name].fact_row[atoms]] for name, atoms in parts]
            if facts.values is None and facts.weights is None:
                for name, atoms in parts:
                    self.ref[name][0][atoms], self.ref[name][1][atoms] = _UNIT, 0
                continue
            distinct, inverse = _distinct_sorted(np.concatenate(rows))
            if facts.weights is None:
                label = self.plan.label(predicate)
                layer = self.add(FactLayer(label if predicate not in self.plan.derived else f"{label}:facts",
                                           facts.values[distinct], copy=False))
                ordinal = inverse.reshape(-1)
                layers = np.full(ordinal.size, layer)
            else:  # template facts
                names = [facts.weights[r] for r in distinct.tolist()]
                weighted = np.array([w is not None for w in names])
                layers, ordinal = np.full(distinct.size, _UNIT), np.zeros(distinct.size, np.int64)
                if weighted.any():
                    n = int(weighted.sum())
                    layer = self.add(NeuronLayer(f"{self.plan.label(predicate)}:embedding", np.ones(n, np.int64), np.full(n, _UNIT),
                                                 np.zeros(n, np.int64),
                                                 [self.weight(w) for w, ok in zip(names, weighted) if ok],
                                                 copy=False))
                    layers[weighted], ordinal[weighted] = layer, np.arange(n)
                inverse = inverse.reshape(-1)
                layers, ordinal = layers[inverse], ordinal[inverse]
            start = 0
            for name, atoms in parts:
                self.ref[name][0][atoms] = layers[start:start + atoms.size]
                self.ref[name][1][atoms] = ordinal[start:start + atoms.size]
                start += atoms.size

    # -- a stage: rule, aggregation and atom neurons -----------------------------------------------------------------
    def stage(self, stage) -> None:
        suffix = stage.label[stage.label.index("@"):] if "@" in stage.label else ""
        aggregated, merged = [], set()
        for g in stage.groundings:
            atoms = stage.atoms.get(g.head_table)
            if g.joined:  # a join family kept whole (see keeps_family)
                aggregated.append(self.joined_rules(g, suffix))
            elif g.family:  # a family kept whole (see plan_inlining): each grounding is its input, unchanged
                layer, ordinal = self.ref[g.input_tables[0]]
                aggregated.append((g.head, layer[g.inputs[0]], ordinal[g.inputs[0]]))
            elif self.merges_atoms(g, stage, atoms):
                merged.add(g.head_table)
                self.rule(g, suffix, atoms)
                aggregated.append(None)
            else:
                aggregated.append(self.rule(g, suffix))
        for table_name, atoms in stage.atoms.items():
            if atoms.size and table_name not in merged:
                self.atoms(table_name, atoms, [(g, ref) for g, ref in zip(stage.groundings, aggregated)
                                               if g.head_table == table_name], suffix)

    def merges_atoms(self, g, stage, atoms) -> bool:
        """Whether the rule's aggregation neurons can be its head atoms' neurons: with ``prune``, when the rule is
        the only one deriving these atoms here, has no head weight and the atoms no combination that changes one
        input (then there is no predicate offset either: it counts only in weighted atoms). The atom neuron is then
        ``T_p(A_r(...))``, the same floating-point numbers as ``T_p(C_p(A_r(...)))`` of one input."""
        if not self.prune or atoms is None or not atoms.size or g.family:
            return False
        rule, predicate = g.rule, self.tables[g.head_table].predicate
        if self.plan.rule_weights[(rule.index, "head")] is not None or \
                self.plan.atom_combination(predicate) not in _COMBINATION:
            return False
        if sum(other.head_table == g.head_table for other in stage.groundings) != 1:
            return False
        return g.size > 0 and g.head_starts.size == atoms.size

    def input_refs(self, g, i: int, name: str) -> tuple[np.ndarray, np.ndarray]:
        lit = g.rule.literals[i]
        layer, ordinal = self.ref[g.input_tables[i]]
        ids = g.inputs[i]
        if lit.function is None:
            return layer[ids], ordinal[ids]
        # NeuraLogic's negation neuron: the literal's function of the atom, one neuron per distinct atom.
        distinct, inverse = np.unique(ids, return_inverse=True)
        n = distinct.size
        index = self.neurons(f"{name}:{lit.function}({lit.name})", np.ones(n, np.int64), layer[distinct],
                             ordinal[distinct], np.full(n, NO_WEIGHT), None, "sum", lit.function.name,
                             self.plan.shape[lit.key])
        return np.full(ids.size, index), inverse.reshape(-1)

    def rule(self, g, suffix: str, atoms: np.ndarray | None = None):
        """Rule neurons (one per grounding) and aggregation neurons (one per head) of one rule; returns the heads
        and where each head's aggregated value is. With ``atoms`` (the heads, see :meth:`merges_atoms`), the
        aggregation neurons are these atoms' neurons, with the predicate's transformation."""
        rule, plan = g.rule, self.plan
        mode = self.inlining[id(g)]  # groundings come sorted by head, then inputs
        name = f"rule{rule.index}:{plan.label(rule.head.key)}{suffix}"
        literals = rule.literals
        read = range(len(literals)) if mode is None else [mode[1]]
        refs = {i: self.input_refs(g, i, name) for i in read}
        offset_name = plan.rule_weights[(rule.index, "offset")]
        transformation = plan.rule_transformation(rule)
        n = g.size
        # The value of each rule neuron as "weight . neuron" when no neuron is needed for it (an unchanged input, or
        # an input times a scalar fact of a product), else a neuron of the rule's own layer.
        inline = self.inline(g, refs, mode)
        if inline is not None:
            rule_layer, rule_ordinal, rule_weight = inline
        else:
            k = len(literals)
            in_layer = _interleaved([refs[i][0] for i in range(k)])
            in_ordinal = _interleaved([refs[i][1] for i in range(k)])
            weights = [self.weight(plan.rule_weights[(rule.index, i)]) for i in range(k)]
            in_weight = _interleaved(weights, n)
            scalar = [plan.shape[lit.key] == () and lit.weight is None for lit in literals]
            index = self.neurons(name, np.full(n, k), in_layer, in_ordinal, in_weight,
                                 self.weight(offset_name), plan.combination(rule), transformation,
                                 plan.body_shape[rule.index], np.tile(scalar, n) if any(scalar) else None)
            rule_layer, rule_ordinal, rule_weight = np.full(n, index), np.arange(n), np.full(n, NO_WEIGHT)
        first = g.head_starts
        heads, counts = g.head[first], np.diff(np.append(first, n))
        aggregation = plan.aggregation(rule)
        if atoms is not None:  # the atoms' neurons: T_p(A_r(rule neurons))
            predicate = self.tables[g.head_table].predicate
            index = self.neurons(f"{plan.label(predicate)}{suffix}", counts, rule_layer, rule_ordinal, rule_weight,
                                 None, aggregation, plan.atom_transformation(predicate), plan.body_shape[rule.index])
            ref_layer, ref_ordinal = self.ref[g.head_table]
            ref_layer[atoms], ref_ordinal[atoms] = index, np.arange(atoms.size)
            return None
        agg_layer, agg_ordinal = rule_layer[first], rule_ordinal[first]
        build = np.ones(heads.size, bool)
        if self.prune and aggregation != "count":  # one grounding, nothing to aggregate: read its value
            build = (counts > 1) | (rule_weight[first] != NO_WEIGHT)
        if build.any():
            members = np.repeat(build, counts)
            index = self.neurons(f"{name}:{aggregation}", counts[build], rule_layer[members], rule_ordinal[members],
                                 rule_weight[members], None, aggregation, "identity", plan.body_shape[rule.index])
            agg_layer[build], agg_ordinal[build] = index, np.arange(int(build.sum()))
        return heads, agg_layer, agg_ordinal

    def plan_inlining(self, stages: list, targets: dict) -> list:
        """Decide per rule which neurons are inlined (see :meth:`inlining_mode`), and so which atoms are read.
        Returns the stages with each family of rules (see :meth:`keeps_family`) kept whole or taken apart."""
        self.inlining, self._constants = {}, {}
        # Which atoms are read, kept for the tables of predicates with facts: only their facts need neurons here.
        self.used = {name: np.zeros(t.size, bool) for name, t in self.tables.items() if t.predicate in self.fact_tables}
        for name, _, atoms in target_atoms(targets):
            if name in self.used:
                self.used[name][atoms] = True
        stages = [Stage(stage.atoms, [part for g in stage.groundings
                                      for part in ([g] if self.keeps_family(g) else g.split()) if part.size],
                        stage.label) if any(g.family for g in stage.groundings) else stage for stage in stages]
        for stage in stages:
            for g in stage.groundings:
                mode = self.inlining_mode(g) if self.prune else None
                self.inlining[id(g)] = mode
                read = range(len(g.inputs)) if mode is None else [mode[1]]
                for i in read:
                    if g.input_tables[i] in self.used:
                        self.used[g.input_tables[i]][g.inputs[i]] = True
        return stages

    def keeps_family(self, g) -> bool:
        """Whether a family of rules grounded together (``h(X..) <= p(.., c_r, ..)``, one constant per rule) is
        assembled whole: with ``prune``, when each of its rule neurons is its input unchanged (no literal weight,
        no rule offset, the identity) and its heads are aggregated by anything but ``count`` (a rule of this shape
        grounds each head once: the aggregation of one input is left out), and at least two of its rules are left
        (one alone might make its aggregation the atom's neuron, see :meth:`merges_atoms`). Then the rules' only
        neurons are the head atoms': their inputs are the facts with each rule's head weight, as one rule at a
        time would give them. Otherwise the family is taken apart into its rules."""
        if not g.family:
            return True
        if not self.prune or g.size == 0:
            return False
        plan = self.plan
        if g.joined:
            return self.keeps_joined(g)
        for rule in g.family:
            if rule.body[0].weight is not None or plan.rule_weights[(rule.index, "offset")] is not None or \
                    not self.is_identity(plan.rule_transformation(rule)) or plan.aggregation(rule) == "count":
                return False
        present = np.bincount(g.member, minlength=len(g.family)) > 0
        return int(present.sum()) >= 2

    def keeps_joined(self, g) -> bool:
        """Whether a join family (one body shape, a constant per rule; see ``NumpyGrounder._join_families``) is
        assembled whole (:meth:`joined_rules`): when each rule neuron of each of its rules is its one input literal
        unchanged (no weight, function or offset, the identity), no rule counts, and at least two of its rules are
        left (one alone might make its aggregation the atom's neuron, see :meth:`merges_atoms`). Otherwise it is
        taken apart into its rules."""
        plan = self.plan
        memo_key = ("keeps joined",) + tuple(rule.index for rule in g.family)   # it reads the rules only
        if memo_key not in plan.memo:
            plan.memo[memo_key] = all(
                len(rule.literals) == 1 and rule.literals[0].weight is None and rule.literals[0].function is None
                and plan.rule_weights[(rule.index, "offset")] is None
                and self.is_identity(plan.rule_transformation(rule)) and plan.aggregation(rule) != "count"
                for rule in g.family)
        return plan.memo[memo_key] and int((np.bincount(g.member, minlength=len(g.family)) > 0).sum()) >= 2

    def joined_rules(self, g, suffix: str):
        """:meth:`rule` for all the rules of a join family kept whole, in whole arrays: the aggregation neurons of each
        (rule, head) run with more than one grounding, all in one layer (one per aggregation where the family's rules
        aggregate differently), by rule in template order, then by head; and what each run's value is. One layer,
        not one per rule: an RGCN template has a rule per relation, and each layer costs its own checks and
        statements while its neurons all compute the same function (a mean of inputs, no weight) on different
        inputs. Returns the runs' heads, layers and ordinals."""
        plan = self.plan
        layer, ordinal = self.ref[g.input_tables[0]]
        rule_layer, rule_ordinal = layer[g.inputs[0]], ordinal[g.inputs[0]]
        first = g.head_starts   # runs of one rule and head
        counts = np.diff(np.append(first, g.size))
        heads, agg_layer, agg_ordinal = g.head[first], rule_layer[first], rule_ordinal[first]
        build = counts > 1   # one grounding, nothing to aggregate: read its value
        if not build.any():
            return heads, agg_layer, agg_ordinal
        # The aggregation of each rule (as a class: its place in the family's distinct aggregations) and the layers'
        # name stem, made once per plan (a template grounded again has them).
        memo_key = ("joined layers", suffix) + tuple(rule.index for rule in g.family)
        if memo_key not in plan.memo:
            aggregations = [plan.aggregation(rule) for rule in g.family]
            distinct = list(dict.fromkeys(aggregations))
            plan.memo[memo_key] = (np.array([distinct.index(a) for a in aggregations], np.int64), distinct,
                                   np.array([rule.index for rule in g.family], np.int64),
                                   f"{plan.label(g.rule.head.key)}{suffix}")
        kind_of_rule, aggregations, rule_index, stem = plan.memo[memo_key]
        run_rule = g.member[first]
        for kind, aggregation in enumerate(aggregations):
            chosen = build if len(aggregations) == 1 else build & (kind_of_rule[run_rule] == kind)
            runs = np.flatnonzero(chosen)
            if not runs.size:
                continue
            members = np.repeat(chosen, counts)
            low, high = rule_index[run_rule[runs[0]]], rule_index[run_rule[runs[-1]]]
            name = f"rule{low}:{stem}:{aggregation}" if low == high else f"rules{low}-{high}:{stem}:{aggregation}"
            in_layer, in_ordinal = rule_layer[members], rule_ordinal[members]
            agg_layer[runs] = self.add(NeuronLayer(name, counts[runs], in_layer, in_ordinal,
                                                   np.full(in_layer.size, NO_WEIGHT), np.full(runs.size, NO_WEIGHT),
                                                   _COMBINATION[aggregation], "identity", copy=False))
            agg_ordinal[runs] = np.arange(runs.size)
        return heads, agg_layer, agg_ordinal

    def inlining_mode(self, g):
        """``("input", i)`` when each rule neuron is its input ``i`` unchanged; ``("product", i, j)`` when it is input
        ``i`` times the scalar fact of input ``j`` (``j`` None: times unit facts only), in a product; else None.

        * one unweighted input, no offset, the identity: the input itself;
        * a product of one unweighted input, unit facts (times 1, exactly) and at most one scalar fact ``c`` of the
          data: ``c . input``, one fixed weight per distinct ``c`` (when there are few).
        """
        rule, plan = g.rule, self.plan
        literals = rule.literals
        if plan.rule_weights[(rule.index, "offset")] is not None or \
                not self.is_identity(plan.rule_transformation(rule)):
            return None
        if len(literals) == 1:
            return ("input", 0) if literals[0].weight is None else None
        if plan.combination(rule) not in ("product", "elproduct"):
            return None
        units, scalars, others = [], [], []
        for i, lit in enumerate(literals):
            facts = self.fact_tables.get(lit.key)
            plain_fact = (lit.key not in plan.derived and facts is not None and facts.weights is None
                          and lit.weight is None and lit.function is None)
            if plain_fact and facts.values is None:
                units.append(i)
            elif plain_fact and facts.values.ndim == 1:
                scalars.append(i)
            else:
                others.append(i)
        if len(others) != 1 or len(scalars) > 1 or literals[others[0]].weight is not None:
            return None
        if not scalars:
            return ("product", others[0], None)
        distinct, inverse = self.fact_constants(g, scalars[0])
        if distinct.size > _MAX_CONSTANTS:
            return None
        return ("product", others[0], scalars[0], distinct, inverse)

    def fact_constants(self, g, i: int) -> tuple[np.ndarray, np.ndarray]:
        """The distinct values of the scalar facts of input ``i`` (bit patterns, so 0.0 and -0.0 stay apart) and
        which one each grounding reads; the distinct values are found once per predicate."""
        predicate = g.rule.literals[i].key
        facts = self.fact_tables[predicate]
        if predicate not in self._constants:
            bits = facts.values.view(np.int64)
            distinct = unique_keys(bits)
            self._constants[predicate] = (distinct.view(np.float64), np.searchsorted(distinct, bits))
        distinct, of_row = self._constants[predicate]
        table = self.tables[g.input_tables[i]]
        return distinct, of_row[facts.value_row[table.fact_row[g.inputs[i]]]]

    def inline(self, g, refs: list, mode):
        """``(layer, ordinal, weight)`` of each rule neuron's value when it needs no neuron, else None."""
        if mode is None:
            return None
        layer, ordinal = refs[mode[1]]
        if mode[0] == "input" or mode[2] is None:
            return layer, ordinal, np.full(g.size, NO_WEIGHT)
        distinct, inverse = mode[3], mode[4]
        ids = np.array([self.constant(v) for v in distinct.tolist()], np.int64)
        return layer, ordinal, ids[inverse]

    def atoms(self, table_name: str, atoms: np.ndarray, rules: list, suffix: str) -> None:
        """Atom neurons of ``atoms`` (sorted atom ids of one table): the rules that derive each, in template order."""
        predicate = self.tables[table_name].predicate
        plan = self.plan
        owner, layer, ordinal, weight, rank = [], [], [], [], []
        for g, (heads, agg_layer, agg_ordinal) in rules:   # heads: sorted, some of the atoms; distinct but a family's
            if g.joined:  # sorted by rule, then head: per run its rule's head weight and template position
                run_rule = g.member[g.head_starts]
                owner.append(np.searchsorted(atoms, heads))
                head_weight, rule_index = self.family_weights(g.family)
                weight.append(head_weight[run_rule])
                rank.append(rule_index[run_rule])
            elif g.family:  # sorted by head, then rule: per grounding its rule's head weight and template position
                # (alone, it derives every atom here: as many heads as atoms is one grounding per atom, in order)
                owner.append(np.arange(atoms.size) if len(rules) == 1 and heads.size == atoms.size else
                             np.searchsorted(atoms, heads))
                head_weight, rule_index = self.family_weights(g.family)
                weight.append(head_weight[g.member])
                rank.append(rule_index[g.member])
            else:
                owner.append(np.arange(atoms.size) if heads.size == atoms.size else np.searchsorted(atoms, heads))
                weight.append(np.full(heads.size, self.weight(plan.rule_weights[(g.rule.index, "head")])))
                rank.append((g.rule.index, heads.size))   # made an array only if needed (below)
            layer.append(agg_layer)
            ordinal.append(agg_ordinal)
        owner = owner[0] if len(rules) == 1 else np.concatenate(owner)
        counts = np.bincount(owner, minlength=atoms.size)
        one_each = owner.size == atoms.size and counts.max(initial=0) == 1
        if len(rules) == 1 and not rules[0][0].joined:  # one rule (or family): sorted by head (then rule)
            order = None
        elif one_each:  # each atom derived by one rule: owner is a permutation
            order = np.empty_like(owner)
            order[owner] = np.arange(owner.size)
        else:
            rank = [np.full(r[1], r[0]) if isinstance(r, tuple) else r for r in rank]
            order = np.lexsort((np.concatenate(rank), owner))
        layer, ordinal, weight = (parts[0] if len(parts) == 1 else np.concatenate(parts)
                                  for parts in (layer, ordinal, weight))
        if order is not None:
            owner, layer, ordinal, weight = owner[order], layer[order], ordinal[order], weight[order]
        weighted = weight != NO_WEIGHT if one_each else \
            np.bincount(owner, weights=(weight != NO_WEIGHT).astype(float), minlength=atoms.size) > 0
        offset = np.where(weighted, self.weight(plan.predicate_offsets.get(predicate)), NO_WEIGHT)
        transformation = plan.atom_transformation(predicate)
        ref_layer, ref_ordinal = self.ref[table_name]
        build = None   # all
        if self.prune and self.is_identity(transformation):
            single = (counts == 1) & (offset == NO_WEIGHT)
            first = np.concatenate([[0], np.cumsum(counts)[:-1]])
            single &= weight[np.minimum(first, weight.size - 1)] == NO_WEIGHT
            ref_layer[atoms[single]], ref_ordinal[atoms[single]] = layer[first[single]], ordinal[first[single]]
            build = ~single
        if build is None or build.all():
            index = self.neurons(f"{plan.label(predicate)}{suffix}", counts, layer, ordinal, weight, offset,
                                 plan.atom_combination(predicate), transformation, plan.shape[predicate])
            ref_layer[atoms], ref_ordinal[atoms] = index, np.arange(atoms.size)
        elif build.any():
            members = np.repeat(build, counts)
            index = self.neurons(f"{plan.label(predicate)}{suffix}", counts[build], layer[members], ordinal[members],
                                 weight[members], offset[build], plan.atom_combination(predicate), transformation,
                                 plan.shape[predicate])
            ref_layer[atoms[build]], ref_ordinal[atoms[build]] = index, np.arange(int(build.sum()))

    def family_weights(self, family: tuple) -> tuple[np.ndarray, np.ndarray]:
        """The head weight (an index into the weights) and the template position of each rule of a family, made once
        per plan: the plan's weights come first in every grounding's weights, in the same order."""
        memo_key = ("family weights",) + tuple(rule.index for rule in family)
        if memo_key not in self.plan.memo:
            self.plan.memo[memo_key] = (
                np.asarray([self.weight(self.plan.rule_weights[(r.index, "head")]) for r in family], np.int64),
                np.asarray([r.index for r in family], np.int64))
        return self.plan.memo[memo_key]

    # -- the graph -------------------------------------------------------------------------------------------------
    def graph(self, targets: dict) -> Graph:
        out_layer = np.empty(targets["atom"].size, np.int64)
        out_ordinal = np.empty(targets["atom"].size, np.int64)
        for name, rows, atoms in target_atoms(targets):
            out_layer[rows] = self.ref[name][0][atoms]
            out_ordinal[rows] = self.ref[name][1][atoms]
        layers = self.layers
        used_unit = (out_layer == _UNIT).any() or any(   # last first: atoms with a bias read it, late as a rule
            isinstance(layer, NeuronLayer) and (layer.input_layer == _UNIT).any() for layer in reversed(layers))
        if not used_unit:  # drop the unit fact and renumber
            layers = [replace(layer, input_layer=layer.input_layer - 1, copy=False) if isinstance(layer, NeuronLayer)
                      else layer for layer in layers[1:]]
            out_layer = out_layer - 1
        return Graph(layers, self.weights, out_layer, out_ordinal)


def _interleaved(columns: list, n: int | None = None) -> np.ndarray:
    """The edges of neurons with one input from each column, neuron by neuron: ``columns[0][j], columns[1][j], ...``
    (``np.stack(columns, axis=1).ravel()``; with ``n``, columns are scalars repeated for ``n`` neurons)."""
    k = len(columns)
    out = np.empty((len(columns[0]) if n is None else n) * k, np.int64)
    for i, column in enumerate(columns):
        out[i::k] = column
    return out


def _distinct_sorted(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True)``, without sorting when the values already increase."""
    if values.size < 2 or bool(np.all(values[1:] > values[:-1])):
        return values, np.arange(values.size)
    distinct, inverse = np.unique(values, return_inverse=True)
    return distinct, inverse.reshape(-1)
