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


def shares_weight(model: nn.Module, first_module: str, second_module: str) -> bool:
    """Whether two modules' `weight` is one parameter object in `model` (a head tied to its input embeddings)."""
    aliases = tied_aliases(model)
    first, second = f"{first_module}.weight", f"{second_module}.weight"
    return aliases.get(first, first) == aliases.get(second, second)
