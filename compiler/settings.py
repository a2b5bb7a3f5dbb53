"""Compiler settings: one pydantic model with every knob, and the named presets.

    Settings()                         # the `default` preset
    Settings.preset("unoptimized")     # the Vectorizer's output, as is
    Settings.preset("upward-17-aggressive")
    list_presets()                     # every preset name, in order

The presets `upward-00-free` ... `upward-17-aggressive` are the 18 strengths of
upward gather propagation (thesis 5.2.7, 6.2.1): from "only propagate gathers
that duplicate nothing" to "remove every gather, whatever the memory".
"""
from __future__ import annotations

import difflib
from typing import Iterator, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["Settings", "list_presets", "iter_presets", "PRESETS", "REASSOCIATING", "unknown_settings"]


class Settings(BaseModel):
    """How to compile a graph. Unknown fields are an error naming the closest field; instances
    are immutable. Values are taken as they are, never coerced: a switch is True or False (not
    ``"no"`` or 1), a number is a number (not True or ``"0.5"``); numpy scalars count as numbers and
    booleans, a list of fact layers as a tuple.

    Every optimization can be switched off on its own; passes keep the module's
    function under any combination (tested against the reference engine).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    @model_validator(mode="before")
    @classmethod
    def _plain_values(cls, data):
        if isinstance(data, dict):
            unknown = [key for key in data if key not in cls.model_fields]
            if unknown:
                raise ValueError(unknown_settings(unknown))
            data = {key: value.item() if isinstance(value, np.generic) else
                    tuple(value) if key == "dynamic_facts" and isinstance(value, list) else value
                    for key, value in data.items()}
        return data

    # -- inputs and checking -----------------------------------------------------------
    dynamic_facts: tuple[str, ...] = Field(
        (), description="Fact layers whose values may be replaced at call time "
                        "(`module(facts={name: tensor})`); no pass optimizes using their values. "
                        "Only these layers can be replaced: the passes fold every other fact into constants.")
    verify: bool = Field(True, description="Check the program's shapes and indices after every pass.")

    # -- unit facts (5.2.8) ----------------------------------------------------------------
    merge_unit_facts: bool = Field(True, description="Merge all unit facts into one single-row unit fact.")
    simplify_unit_linear: bool = Field(
        True, description="Drop the product in linear ops whose value side is all unit: W . 1 = W.")

    # -- deduplication (5.2.6) --------------------------------------------------------------
    dedup_facts: bool = Field(True, description="Keep one row per distinct fact value (static facts only).")
    iso_compression: bool = Field(
        True, description="Isomorphic compression: merge the rows of one layer that are provably equal "
                          "(same structure, same weights, inputs equal as multisets, facts equal bit for "
                          "bit). Exact: nothing is evaluated, no tolerance.")
    dedup_linear: bool = Field(True, description="Compute each distinct (weight, value) pair of a linear op once.")
    dedup_aggregations: bool = Field(
        True, description="Compute each distinct group of aggregated inputs once (downward gather propagation).")

    # -- linear layers (5.2.3 - 5.2.5) ----------------------------------------------------------
    linear_padding: Literal["off", "none", "left", "right", "both", "advanced", "auto"] = Field(
        "auto", description="Reordering/padding of linear ops so their sides repeat: a fixed strategy, or "
                            "'auto' to pick the one with the smallest summed gather length (thesis cost proxy).")
    linear_broadcasting: bool = Field(
        True, description="Where a side of a linear op repeats, gather only its period and broadcast.")

    # -- upward gather propagation (5.2.7) --------------------------------------------------------
    upward: bool = Field(True, description="Move gathers into preceding layers.")
    upward_growth_abs: int | None = Field(
        0, ge=0, description="Rows a layer may grow by when a gather moves into it (None: unlimited).")
    upward_growth_rel: float | None = Field(
        0.0, ge=0, description="Relative growth allowed on top of `upward_growth_abs` (None: unlimited).")
    upward_max_depth: int | None = Field(
        None, ge=0, description="How many layers up one gather may travel (None: unlimited).")
    upward_before_linear: bool = Field(
        False, description="Run upward propagation before the linear symmetry passes (padding and "
                           "broadcasting), instead of after them.")

    # -- gathers, reductions, clean-up (5.2.1, 5.2.2, 5.2.9, 5.2.10) ---------------------------
    simplify_gathers: bool = Field(
        True, description="Replace gathers by nothing, slices, tiles or interleaves where possible.")
    transposed_reductions: bool = Field(
        True, description="Reduce along axis 0 of a (k, n) view where that removes a gather (5.2.9).")
    remove_identity: bool = Field(True, description="Remove identity ops and merge chains of indexing ops.")
    preconcatenate: bool = Field(
        True, description="Pre-concatenate facts or weights that are always used together.")

    # -- algebra: using what is known at compile time --------------------------------------------
    reduce_coefficients: bool = Field(
        True, description="Fixed scalar factors of summed or averaged inputs become per-edge coefficients "
                          "of the reduction (a weighted sparse matrix) instead of per-edge products.")
    unstack_weights: bool = Field(
        True, description="A single weight sliced out of a stack of weights is read as itself (no stack).")
    split_products: bool = Field(
        True, description="Products whose rows use one of a few weight matrices (GraphSAGE's W_l, W_r): "
                          "one GEMM per matrix instead of per-row batched products.")
    relation_products: bool = Field(
        True, description="Products whose rows use one of many weight matrices (RGCN's relations): rows "
                          "chunked by weight, one batched GEMM over the chunks.")
    sum_parts: bool = Field(
        True, description="A sum of k inputs per neuron, the t-th from the same value for every neuron: "
                          "k - 1 additions instead of gathering k n rows.")
    reorder_linear: bool = Field(
        True, description="Commute products with a shared weight and sums, means, indexing and additions, "
                          "whichever order makes the aggregated rows narrower (estimated cost).")
    fold_constants: bool = Field(
        True, description="Compute values that depend only on static facts and fixed weights once, at "
                          "compile time (float64).")
    broadcast_adds: bool = Field(
        True, description="Add a bias shared by all rows as its one row (broadcast), not repeated to every row.")

    compose_gathers: bool = Field(
        True, description="A gather of a fused sparse sum's rows picks the sparse matrix's rows instead, where "
                          "that adds fewer edges than the gather has rows (undoes a deduplication that saved little).")

    join_sums: bool = Field(
        True, description="An addition of a fused sparse sum and another sum, gather or value of its rows "
                          "(GraphSAGE's neighbour mean plus the node's own term) as one sparse sum over both "
                          "sources side by side.")

    compose_sums: bool = Field(
        True, description="A sum or mean of a fused sparse sum's rows (GCN's readout of its last layer) as one "
                          "sparse sum over the product of both matrices, where that has no more entries than the two.")

    stack_products: bool = Field(
        True, description="Shared-weight products of one value that a sparse sum or gather reads side by side "
                          "(GraphSAGE's last layer) as one GEMM against the stacked weights.")

    fuse_fact_products: bool = Field(
        True, description="A sum of two shared-weight products of static facts (GraphSAGE's first layer) as one "
                          "GEMM over the facts side by side.")

    sparse_fact_density: float = Field(
        0.1, ge=0.0, le=1.0, description="A product of a static fact matrix with at most this fraction of nonzeros "
        "by a weight (Cora's bag of words: 1-5%) runs as a sparse sum of the weight's columns (products over 32 "
        "wide: proportionally less); 0 never.")

    # -- kernels ------------------------------------------------------------------------------------
    reduce_kernel: Literal["auto", "scatter", "segment", "dense", "sparse_mm"] = Field(
        "auto", description="Kernel for segment reductions: chosen per layer by a cost model, or forced.")

    def for_dtype(self, dtype) -> "Settings":
        """The settings a module computing in ``dtype`` (a torch dtype or its name) is compiled with:
        in float16 the reassociating passes (``REASSOCIATING``) are off (NOTE: [half range])."""
        name = str(dtype).removeprefix("torch.")
        if name != "float16" or not any(getattr(self, switch) for switch in REASSOCIATING):
            return self
        return self.model_copy(update={switch: False for switch in REASSOCIATING})

    @classmethod
    def preset(cls, name: str, **overrides) -> "Settings":
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; expected one of {list_presets()}")
        return cls(**{**PRESETS[name], **overrides})


# NOTE: [half range] float16 ends at 65504. A shared weight moved after a sum (reorder_linear:
# ``W (x_1 + ... + x_k)`` for ``W x_1 + ... + W x_k``) or two sums composed into one
# (compose_sums: the products of their coefficients, summed once) add up other, possibly larger,
# terms than the neuron-by-neuron order: facts of 3e4 summed six times before a weight of 0.02 give
# inf where every neuron of the graph is finite. So a module compiled for float16 is compiled without
# them. bfloat16 keeps float32's exponent range, where these sums overflow no sooner than in float32.
REASSOCIATING = ("reorder_linear", "compose_sums")

# Every switch that is on by default off (``verify`` is a check, not an optimization), and the
# non-switch knobs at their "nothing" values: a new switch is off here without being listed.
_ALL_OFF = {name: False for name, field in Settings.model_fields.items() if field.default is True and name != "verify"}
_ALL_OFF.update(linear_padding="off", sparse_fact_density=0.0, reduce_kernel="scatter")

# The 18 upward-propagation strengths: (name, absolute margin, relative margin, depth, before linear).
_UPWARD = [
    ("free", 0, 0.0, None, False),
    ("rel-0.01", 0, 0.01, None, False),
    ("rel-0.05", 0, 0.05, None, False),
    ("rel-0.1", 0, 0.1, None, False),
    ("rel-0.25", 0, 0.25, None, False),
    ("rel-0.5", 0, 0.5, None, False),
    ("rel-1", 0, 1.0, None, False),
    ("rel-2", 0, 2.0, None, False),
    ("rel-4", 0, 4.0, None, False),
    ("abs-1k", 1000, 0.0, None, False),
    ("abs-10k", 10000, 0.0, None, False),
    ("abs-100k", 100000, 0.0, None, False),
    ("depth-1", None, None, 1, False),
    ("depth-2", None, None, 2, False),
    ("depth-3", None, None, 3, False),
    ("before-linear-rel-1", 0, 1.0, None, True),
    ("before-linear-unlimited", None, None, None, True),
    ("aggressive", None, None, None, False),
]

PRESETS: dict[str, dict] = {"unoptimized": _ALL_OFF, "default": {}}
for _k, (_name, _abs, _rel, _depth, _before) in enumerate(_UPWARD):
    PRESETS[f"upward-{_k:02d}-{_name}"] = dict(
        upward_growth_abs=_abs, upward_growth_rel=_rel, upward_max_depth=_depth, upward_before_linear=_before)


def unknown_settings(keys) -> str:
    """The error for settings that are not fields: each named, with the closest field if any."""
    fields = list(Settings.model_fields)
    hints = []
    for key in keys:
        close = difflib.get_close_matches(str(key), fields, 1)
        hints.append(f"{key!r} (did you mean {close[0]!r}?)" if close else repr(key))
    return f"unknown settings {', '.join(hints)}; Settings has the fields {sorted(fields)}"


def list_presets() -> list[str]:
    """Every preset name: `unoptimized`, `default`, then the 18 upward strengths, weakest first."""
    return list(PRESETS)


def iter_presets() -> Iterator[tuple[str, Settings]]:
    for name in PRESETS:
        yield name, Settings.preset(name)
