"""How a checkpoint's tensor names map to module paths and components, learned once from a meta skeleton.

The header census needs two facts only the model class knows: transformers' renaming of saved keys (Qwen2-VL is
saved as `model.layers.*`, built as `model.language_model.layers.*`) and the component prefixes found from the
model's structure (`ComponentClassifier`), and which tensors from_pretrained ties (`tied_aliases`: saved once,
counted once). Building the skeleton costs importing torch and the model's module
(~5 s as a process); the answer depends only on config.json, the tensor names and the transformers release, so it
is cached under that fingerprint (outside the checkpoint: the workbench never writes there). A second census of the
same checkpoint imports neither torch nor transformers.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from importlib import metadata
from pathlib import Path
from typing import Iterable

from workbench.model.components import ComponentClassifier
from workbench.paths import cache_root


@dataclasses.dataclass(frozen=True)
class HeaderMap:
    prefixes: tuple[tuple[str, str], ...]  # (module path, component), as ComponentClassifier.from_model found them
    renamed: dict[str, str]  # saved key -> module path, where transformers renames it
    how: str  # how keys were mapped (the transformers release and its rule count)
    tied: dict[str, str] = dataclasses.field(default_factory=dict)  # alias -> canonical, as from_pretrained ties
    from_cache: bool = False

    def classifier(self, overrides=None) -> ComponentClassifier:
        return ComponentClassifier(self.prefixes).with_overrides(overrides)

    def map_key(self, key: str) -> str:
        return self.renamed.get(key, key)


def cache_dir() -> Path:
    return cache_root() / "header-maps"


SCHEMA = b"2"  # bumped when what a map holds or how components are found changes: older entries are rebuilt


def fingerprint(model_dir: Path, keys: Iterable[str], trust_remote_code: bool) -> str:
    digest = hashlib.sha256()
    for part in (SCHEMA, Path(model_dir, "config.json").read_bytes(), _release("transformers").encode(),
                 str(bool(trust_remote_code)).encode(), "\n".join(sorted(set(keys))).encode()):
        digest.update(len(part).to_bytes(8, "little"))
        digest.update(part)
    return digest.hexdigest()[:32]


def _release(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "absent"


def header_map(model_dir: str | Path, keys: Iterable[str], *, trust_remote_code: bool = False) -> HeaderMap:
    """The map for these saved keys of the model in `model_dir`: from the cache, else from a meta skeleton."""
    keys = sorted(set(keys))
    path = cache_dir() / f"{fingerprint(Path(model_dir), keys, trust_remote_code)}.json"
    try:
        data = json.loads(path.read_text())
        return HeaderMap(tuple(tuple(p) for p in data["prefixes"]), data["renamed"], data["how"], data["tied"],
                         from_cache=True)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    found = _from_skeleton(Path(model_dir), keys, trust_remote_code)
    try:
        from workbench.findings import write_json_atomic

        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, {"prefixes": found.prefixes, "renamed": found.renamed, "how": found.how,
                                 "tied": found.tied})
    except OSError:
        pass  # a read-only home: the census still works, just not faster next time
    return found


def _from_skeleton(model_dir: Path, keys: list[str], trust_remote_code: bool) -> HeaderMap:
    from workbench.model.checkpoint import checkpoint_key_mapper
    from workbench.model.loading import auto_config, meta_model
    from workbench.model.tied import tied_aliases

    config = auto_config(model_dir, trust_remote_code=trust_remote_code)
    skeleton, _ = meta_model(config)
    classifier = ComponentClassifier.from_model(skeleton)
    map_key, how = checkpoint_key_mapper(skeleton)
    renamed = {k: mapped for k in keys if (mapped := map_key(k)) != k}
    return HeaderMap(classifier.prefixes, renamed, how, tied_aliases(skeleton))
