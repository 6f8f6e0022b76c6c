"""The saved files of a target, read once for every check of notebook 00: headers, JSON configs, the tokenizer and
a meta-device skeleton of the base. No weight of the base is read; the adapter's values are read by
`adapter_weights` alone (adapters are small).

    files = saved_files_probe(target)
    files.tensor("lm_head.weight")           # the header entry of the base's lm_head, under its module path
    files.tokenizer                          # loaded from the adapter folder if it carries one, else the base's
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from pathlib import Path
from typing import Any

from workbench.display.result import ProbeResult
from workbench.model.checkpoint import CheckpointInspection, inspect_checkpoint
from workbench.model.lora import read_json
from workbench.model.safetensors_header import SafetensorsHeader, TensorEntry

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
SAMPLE_BYTES = 4096


@dataclasses.dataclass(repr=False)
class SavedFiles(ProbeResult):
    """What one target's folders hold, parsed; `bytes_read` counts every byte read to answer notebook 00."""

    model_dir: Path
    adapter_dir: Path | None
    config: dict[str, Any] | None
    generation_config: dict[str, Any] | None
    generation_config_path: Path | None
    adapter_config: dict[str, Any] | None
    base: CheckpointInspection
    adapter: CheckpointInspection | None
    tokenizer_dir: Path | None
    trust_remote_code: bool = False
    bytes_read: dict[str, int] = dataclasses.field(default_factory=dict)
    skeleton_error: str | None = None
    tokenizer_error: str | None = None

    def count(self, what: str, nbytes: int) -> None:
        self.bytes_read[what] = self.bytes_read.get(what, 0) + int(nbytes)

    # -- the base, as transformers builds it (meta device) --------------------------------------------------------
    @functools.cached_property
    def skeleton(self):
        """(model on the meta device, map_key, classifier), or None when the architecture cannot be built here."""
        from workbench.model.checkpoint import checkpoint_key_mapper
        from workbench.model.components import ComponentClassifier
        from workbench.model.loading import auto_config, meta_model

        try:
            from transformers.initialization import no_init_weights
        except ImportError:  # another transformers release: initialise (on meta it is only slower)
            no_init_weights = contextlib.nullcontext
        try:
            with no_init_weights():  # nothing to initialise on the meta device; 7B: 1.2 s -> 0.3 s
                model, _ = meta_model(auto_config(self.model_dir, trust_remote_code=self.trust_remote_code))
        except Exception as exc:  # noqa: BLE001 - the checks that need it say why they could not run
            self.skeleton_error = f"{type(exc).__name__}: {exc}"
            return None
        map_key, _ = checkpoint_key_mapper(model)
        return model, map_key, ComponentClassifier.from_model(model)

    def component(self, module_path: str) -> str:
        sk = self.skeleton
        return sk[2].component_of(module_path) if sk else "other"

    def map_key(self, key: str) -> str:
        sk = self.skeleton
        return sk[1](key) if sk else key

    @functools.cached_property
    def base_tensors(self) -> dict[str, tuple[SafetensorsHeader, TensorEntry]]:
        """The base's header entries under the model's module paths (saved keys renamed as transformers loads them)."""
        out = {}
        for header in self.base.headers:
            for t in header.tensors:
                out[self.map_key(t.name)] = (header, t)
        return out

    def tensor(self, module_path: str) -> tuple[SafetensorsHeader, TensorEntry] | None:
        return self.base_tensors.get(module_path)

    @functools.cached_property
    def embedding_modules(self) -> dict[str, str | None]:
        """{"input": module path of the input embeddings, "output": of the lm head} in the skeleton (None: absent)."""
        out: dict[str, str | None] = {"input": None, "output": None}
        sk = self.skeleton
        if sk is None:
            for key in self.base_tensors:
                if key.endswith(("embed_tokens.weight", "wte.weight", "word_embeddings.weight")):
                    out["input"] = out["input"] or key.removesuffix(".weight")
                elif key.endswith("lm_head.weight"):
                    out["output"] = key.removesuffix(".weight")
            return out
        model = sk[0]
        names = {id(m): n for n, m in model.named_modules()}
        for kind, getter in (("input", "get_input_embeddings"), ("output", "get_output_embeddings")):
            try:
                module = getattr(model, getter)()
            except (AttributeError, NotImplementedError, TypeError, ValueError):
                module = None
            out[kind] = names.get(id(module)) if module is not None else None
        return out

    def sampled(self, header: SafetensorsHeader, t: TensorEntry) -> bytes:
        """The first and last SAMPLE_BYTES of a tensor's data (a fine-tune changes every element: enough to tell
        two tensors apart without reading them)."""
        start = 8 + header.header_size + t.start
        if not Path(header.path).exists():  # the weights stayed on the Hub (headers read by range): not compared
            return b""
        with open(header.path, "rb") as fh:
            fh.seek(start)
            head = fh.read(min(SAMPLE_BYTES, t.nbytes))
            tail = b""
            if t.nbytes > SAMPLE_BYTES:
                fh.seek(start + max(SAMPLE_BYTES, t.nbytes - SAMPLE_BYTES))
                tail = fh.read(min(SAMPLE_BYTES, t.nbytes - SAMPLE_BYTES))
        self.count("sampled tensor bytes", len(head) + len(tail))
        return head + tail

    # -- the adapter ----------------------------------------------------------------------------------------------
    @property
    def adapter_tensors(self) -> list[TensorEntry]:
        return [t for h in (self.adapter.headers if self.adapter else []) for t in h.tensors]

    # -- the tokenizer --------------------------------------------------------------------------------------------
    @functools.cached_property
    def tokenizer(self):
        """The tokenizer as transformers loads it (None: no tokenizer files, or it could not load: tokenizer_error)."""
        if self.tokenizer_dir is None:
            return None
        from transformers import AutoTokenizer

        try:
            tok = AutoTokenizer.from_pretrained(str(self.tokenizer_dir), local_files_only=True,
                                                trust_remote_code=self.trust_remote_code)
        except Exception as exc:  # noqa: BLE001 - the tokenizer checks report it as an error of theirs
            self.tokenizer_error = f"{type(exc).__name__}: {exc}"
            return None
        for name in (*TOKENIZER_FILES, "special_tokens_map.json", "added_tokens.json", "chat_template.jinja",
                     "chat_template.json", "merges.txt"):
            path = self.tokenizer_dir / name
            if path.exists():
                self.count("tokenizer files", path.stat().st_size)
        return tok

    # -- the config as a mapping ----------------------------------------------------------------------------------
    def text_config(self) -> dict[str, Any]:
        """The language model's part of config.json (the top level for a text model)."""
        config = self.config or {}
        text = config.get("text_config") or config.get("llm_config") or {}
        return {**config, **text} if isinstance(text, dict) else config

    def files_table(self) -> list[dict[str, Any]]:
        rows = []
        for label, folder in (("base", self.model_dir), ("adapter", self.adapter_dir)):
            if folder is None:
                continue
            for p in sorted(folder.iterdir()):
                if p.is_file() and not p.name.startswith("."):
                    rows.append({"folder": label, "file": p.name, "bytes": p.stat().st_size})
        return rows

    def details(self):
        from workbench.display.nodes import Code, Display, Paragraph, Table

        read = ", ".join(f"{k}: {v:,}" for k, v in self.bytes_read.items()) or "nothing yet"
        return Display(
            Paragraph("Base ", Code(str(self.model_dir)),
                      *((", adapter ", Code(str(self.adapter_dir))) if self.adapter_dir else ()),
                      *((", tokenizer from ", Code(str(self.tokenizer_dir))) if self.tokenizer_dir
                        else (", no tokenizer files",)),
                      f". Bytes read so far: {read}."),
            Table.from_records(self.files_table(), ["folder", "file", "bytes"]))


def tokenizer_folder(*folders: Path | None) -> Path | None:
    """The first folder holding tokenizer files: the adapter's (tokens added in training are saved there), else
    the base's."""
    for folder in folders:
        if folder is not None and any((folder / n).exists() for n in TOKENIZER_FILES):
            return folder
    return None


def saved_files(model_dir: Path, adapter_dir: Path | None = None, trust_remote_code: bool = False) -> SavedFiles:
    model_dir, adapter_dir = Path(model_dir), Path(adapter_dir) if adapter_dir else None
    base = inspect_checkpoint(model_dir)
    adapter = inspect_checkpoint(adapter_dir) if adapter_dir else None
    gen_path = model_dir / "generation_config.json"
    files = SavedFiles(
        model_dir=model_dir, adapter_dir=adapter_dir, config=read_json(model_dir / "config.json"),
        generation_config=read_json(gen_path), generation_config_path=gen_path if gen_path.exists() else None,
        adapter_config=read_json(adapter_dir / "adapter_config.json") if adapter_dir else None,
        base=base, adapter=adapter, tokenizer_dir=tokenizer_folder(adapter_dir, model_dir),
        trust_remote_code=trust_remote_code)
    files.count("safetensors headers", base.bytes_read + (adapter.bytes_read if adapter else 0))
    for path in (model_dir / "config.json", gen_path, model_dir / "model.safetensors.index.json",
                 adapter_dir / "adapter_config.json" if adapter_dir else None):
        if path is not None and path.exists():
            files.count("JSON configs", path.stat().st_size)
    return files


def saved_files_probe(target) -> SavedFiles:
    """The target's saved files: the base (or full checkpoint) folder, the adapter folder, the tokenizer's."""
    return saved_files(target.model_dir, target.adapter_dir, target.trust_remote_code)
