"""Deep stacks: a model whose decoder layers are all alike is measured at 2 and 4 layers and extended to its depth.

    measured = extended(setup, stepper)     # stepper(setup) -> StepMemory, run at SHORT_STACKS layers

Each figure of a step is affine in the number of identical layers — weights, gradients, optimizer states and saved
activations a layer, the step's peak moment repeating itself — and so is FSDP's per-rank share of them (each
layer's shard, the units gathered around the peak the same at any depth). The tests hold the extension against the
whole depth: exact on a 90M Qwen2 and a 70B-shaped Llama's peak, within a thousandth on a tiny model, where the
peak's moment shifts between categories; an FSDP step of a 70B-shaped Llama is affine category by category (2, 4
and 6 layers). Where the peak's moment moves between the two short copies — some category smaller at 4 layers than
at 2, which a fixed moment cannot give (seen on tiny models under FSDP, whose extension then gave negative
categories) — the extension would state false categories, so every layer is run instead. The CPU's allocator replay
is not affine, so a CPU plan runs every layer.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable

LAYER_COUNT = "num_hidden_layers"
SHORT_STACKS = (2, 4)  # the depths a deep homogeneous stack is measured at
# config fields that make a decoder stack non-uniform (a dense prefix before MoE layers, MoE every k-th layer, …):
# with any of them set, the whole depth is run
NON_UNIFORM = ("first_k_dense_replace", "mlp_only_layers", "decoder_sparse_step", "moe_layer_freq",
               "num_dense_layers", "dense_layers", "cross_attention_layers", "full_attn_idxs", "attn_layer_indices")


def uniform_depth(config) -> int | None:
    """The number of identical decoder layers, when every layer is alike (no per-layer list that differs, none of
    NON_UNIFORM set); None otherwise."""
    depth = getattr(config, LAYER_COUNT, None)
    if not isinstance(depth, int) or depth <= max(SHORT_STACKS):
        return None
    for key, value in config.to_dict().items():
        if key in NON_UNIFORM and value not in (None, 0, 1, [], False):
            return None
        if isinstance(value, list) and len(value) == depth and len({str(v) for v in value}) > 1:
            return None
    return depth


def extended(setup, stepper: Callable):
    """`stepper(setup)`, or for a deep uniform stack on a GPU (module docstring) its 2- and 4-layer copies'
    measurements extended to the depth: a StepMemory either way."""
    depth = uniform_depth(setup.config) if setup.device == "cuda" else None
    if depth is None:
        return stepper(setup)
    short = []
    for layers in SHORT_STACKS:
        config = copy.deepcopy(setup.config)
        setattr(config, LAYER_COUNT, layers)
        short.append(stepper(setup.replace(config=config)))
    (a, b), (ma, mb) = SHORT_STACKS, short
    if any(mb.breakdown.get(k, 0) < v for k, v in ma.breakdown.items()):
        whole = stepper(setup)  # the peak's moment moved between the short copies: not affine
        whole.notes.append(f"{depth} layers run whole: the peak's moment differs between the {a}- and {b}-layer "
                           "copies, so their figures do not extend")
        return whole

    def at_depth(x: float, y: float) -> int:
        return int(round(x + (y - x) / (b - a) * (depth - a)))

    breakdown = {k: at_depth(ma.breakdown.get(k, 0), mb.breakdown.get(k, 0)) for k in mb.breakdown}
    notes = [*mb.notes, f"{depth} identical layers: measured at {a} and {b} layers and extended to {depth} (every "
                        "figure is affine in the depth); the top modules are those of the 4-layer copy"]
    return dataclasses.replace(
        mb, peak_bytes=at_depth(ma.peak_bytes, mb.peak_bytes), breakdown=breakdown,
        first_step_peak_bytes=at_depth(ma.first_step_peak_bytes, mb.first_step_peak_bytes),
        weights_bytes=at_depth(ma.weights_bytes, mb.weights_bytes),
        trainable_parameters=at_depth(ma.trainable_parameters, mb.trainable_parameters),
        parameters=at_depth(ma.parameters, mb.parameters), seconds=ma.seconds + mb.seconds, notes=notes,
        allocator_peak_bytes=None, timeline_layers=b)
