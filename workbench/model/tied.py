"""Tied weights: one tensor reachable under several names (`lm_head.weight` is `model.embed_tokens.weight`).

Asked from the model itself, never from names: `named_parameters(remove_duplicate=False)` lists every name a
parameter object is reachable under, and the first one is the name `named_parameters()` keeps (the one every
census counts). A skeleton built on the meta device is tied as from_pretrained ties it (`meta_model` calls
transformers' `tie_weights()`, which follows `all_tied_weights_keys` and the config's `tie_word_embeddings`).

    >>> tied_aliases(model)                      # doctest: +SKIP
    {'lm_head.weight': 'model.embed_tokens.weight'}
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn


def tied_aliases(model: nn.Module) -> dict[str, str]:
    """alias name -> the canonical name of the same parameter object, for every parameter reachable twice."""
    first: dict[int, str] = {}
    aliases: dict[str, str] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        canonical = first.setdefault(id(param), name)
        if canonical != name:
            aliases[name] = canonical
    return aliases


def tied_notes(aliases: dict[str, str]) -> list[str]:
    """'lm_head.weight = model.embed_tokens.weight' lines, one per canonical tensor (aliases joined)."""
    by_canonical: dict[str, list[str]] = {}
    for alias, canonical in aliases.items():
        by_canonical.setdefault(canonical, []).append(alias)
    return [" = ".join([*sorted(alias_list), canonical]) for canonical, alias_list in sorted(by_canonical.items())]


def weight_partners(model: nn.Module, module: str) -> list[str]:
    """The other modules whose `weight` is the same parameter object as `module`'s, canonical first.

    The tie as the model makes it, wherever it points: T5Gemma ties `lm_head.out_proj` to the decoder's
    `model.decoder.embed_tokens` (its `_tied_weights_keys`), while its `get_input_embeddings()` is the encoder's;
    an EncoderDecoderModel's BERT decoder ties `decoder.cls.predictions.decoder` to `decoder.bert.embeddings
    .word_embeddings`. Tied tensors are saved once, so a caller looks the partners up in the file (the canonical
    name, the one `named_parameters()` keeps, is the one the tiny checkpoints of both save).
    """
    aliases = tied_aliases(model)
    weight = f"{module}.weight"
    canonical = aliases.get(weight, weight)
    sharers = [canonical, *sorted(alias for alias, target in aliases.items() if target == canonical)]
    return [name.removesuffix(".weight") for name in sharers if name != weight and name.endswith(".weight")]
