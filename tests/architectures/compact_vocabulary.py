"""Tiny checkpoints of VLMs with their special token ids moved into a 256-row vocabulary, for the census sample.

`tiny_config` keeps a row for every special token id a config names, as the published checkpoints have them:
PaliGemma's image token 256000, Gemma 3's 262144 and Qwen2.5-VL's 151655 keep 151k–262k rows, and the logits over
them were most of the census sample's time (PaliGemma alone ~74 s of CPU for its two set-ups, against ~13 s here).
The sample builds those checkpoints with each such id remapped to a free row at the top of the 256 rows and the
vocabulary cut to 256; their verdicts are the committed census' (docs/families.json, built with the full rows),
which the sample's test asserts. `make families` still runs the full vocabularies.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from workbench.architectures import tiny_config as tiny
from workbench.architectures.checkpoints import build_tiny_checkpoint
from workbench.architectures.model_types import architectures

# the sample's VLMs whose special ids hold the tiny vocabulary above 150k rows
COMPACTED = ("paligemma", "qwen2_5_vl", "gemma3")


def compact_token_ids(config, vocab: int = tiny.VOCAB):
    """`config` with every special token id at or above `vocab` moved to a free row below it (the highest first),
    at every level, and every larger `vocab_size` cut to `vocab`. Returns the config, changed in place."""
    ids = sorted(set(tiny.config_token_ids(config)))
    free = [i for i in range(vocab - 1, -1, -1) if i not in ids]
    moved = {old: free.pop(0) for old in ids if old >= vocab}

    def remap(level) -> None:
        for key, value in list(vars(level).items()):
            if key.startswith("_"):
                continue
            if tiny._is_config(value):
                remap(value)
            elif key.endswith(tiny.TOKEN_ID_SUFFIXES) and isinstance(value, list):
                setattr(level, key, [moved.get(v, v) for v in value])
            elif key.endswith(tiny.TOKEN_ID_SUFFIXES) and isinstance(value, int) and not isinstance(value, bool):
                setattr(level, key, moved.get(value, value))
            elif key == "vocab_size" and isinstance(value, int) and value > vocab:
                setattr(level, key, vocab)

    remap(config)
    return config


@contextlib.contextmanager
def compact_tiny_configs(monkeypatch) -> Iterator[None]:
    """Within the block, `build_tiny_checkpoint` builds on `tiny_config` followed by `compact_token_ids`."""
    full = tiny.tiny_config
    with monkeypatch.context() as patch:
        patch.setattr(tiny, "tiny_config", lambda *args, **kwargs: compact_token_ids(full(*args, **kwargs)))
        yield


def build_compact_checkpoints(model_types: tuple[str, ...], parent: Path, monkeypatch) -> None:
    """The tiny checkpoints of `model_types` under `parent`, compacted; `run_census` reuses a checkpoint it finds."""
    wanted = [arch for arch in architectures() if arch.model_type in model_types]
    assert {arch.model_type for arch in wanted} == set(model_types)
    with compact_tiny_configs(monkeypatch):
        for arch in wanted:
            folder = build_tiny_checkpoint(arch, parent)
            assert max(tiny.config_token_ids(_saved_config(folder))) < tiny.VOCAB, arch.model_type


def _saved_config(folder: Path):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(folder)
