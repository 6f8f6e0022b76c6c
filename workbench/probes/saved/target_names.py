"""Module names as target_modules lists name them, and which names play the same role: what `adapter.targets`
uses to say what an entry that matches nothing meant, and to build fixes from the base's own names.

    is_counterpart("gate_proj", "gate_up_proj")   # True: the fused projection holds its parts
    is_counterpart("q_proj", "qkv_proj")          # True: a one-letter role among few
    shares_role("qkv_proj", "q_proj")             # True either way round: nothing is missed
"""

from __future__ import annotations

import re

ALTERNATION = re.compile(r"\((?:\?:)?(\w+(?:\|\w+)+)\)")  # a regex's `(a|b|c)` group of plain names
_GENERIC = {"proj", "projection", "layer", "linear", "dense"}  # name parts that say nothing about the role


def _letter_role(parts: list[str], others: list[str]) -> bool:
    """A one-letter role (`q` of q_proj) found in a short or leading part of the other name (`qkv`, `query`)."""
    if len(parts) != 1 or len(parts[0]) != 1:
        return False
    letter = parts[0]
    return any(letter in t and t.isalpha() and (t.startswith(letter) or len(t) <= 3) for t in others)


def leaf(path: str) -> str:
    """A module's name as a target_modules list names it: the last part (`q_proj`), with its parent when the last
    part is an index (`mlp.0`)."""
    parts = path.split(".")
    return ".".join(parts[-2:]) if parts[-1].isdigit() and len(parts) > 1 else parts[-1]


def anchored_regex(prefixes: list[str], names: list[str] | None) -> str | None:
    """`prefix\\.(?:.*\\.)?(name|name)` for PEFT's fullmatch: the names under those module paths only (None: no
    path to anchor to). names None: everything under the paths."""
    prefixes = [p for p in dict.fromkeys(prefixes) if p]
    if not prefixes:
        return None if names is None else r"(?:.*\.)?(" + "|".join(re.escape(n) for n in names) + ")"
    where = "|".join(re.escape(p) for p in prefixes)
    where = f"(?:{where})" if len(prefixes) > 1 else where
    if names is None:
        return where + r"\..*"
    return where + r"\.(?:.*\.)?(" + "|".join(re.escape(n) for n in names) + ")"


def common_parts(paths: list[list[str]]) -> list[str]:
    out = []
    for parts in zip(*paths):
        if len(set(parts)) != 1:
            break
        out.append(parts[0])
    return out


def is_counterpart(entry: str, name: str) -> bool:
    """Whether a base's module name plausibly plays the role of a target name it lacks: it holds the entry's
    parts (gate_proj, up_proj → gate_up_proj), or a one-letter role among few (q_proj, k_proj → qkv_proj;
    o_proj → out_proj)."""
    entry_parts, name_parts = re.split(r"[._]", entry), re.split(r"[._]", name)
    if entry == name or (entry_parts[-1] in _GENERIC and name_parts[-1] != entry_parts[-1]):
        return False  # gate_proj never stands for a MoE router named `gate`
    want = [t for t in entry_parts if t and t not in _GENERIC]
    have = [t for t in name_parts if t and t not in _GENERIC]
    if not want:
        return False
    return set(want) <= set(have) or _letter_role(want, have)


def _role_parts(name: str) -> list[str]:
    return [t for t in re.split(r"[._]", name) if t and t not in _GENERIC]


def shares_role(a: str, b: str) -> bool:
    """Looser than is_counterpart, either way round: one name's parts within the other's (qkv_proj and q_proj,
    query and q_proj): an unmatched entry that shares its role with a trained module misses nothing."""
    pa, pb = _role_parts(a), _role_parts(b)
    if not pa or not pb:
        return False
    return set(pa) <= set(pb) or set(pb) <= set(pa) or _letter_role(pa, pb) or _letter_role(pb, pa)
