"""Which component (vision / projector / language / encoder / decoder / head / other) a tensor belongs to, read
from the model's structure.

Name substrings drift between releases (transformers 5 moved Qwen2-VL's decoder to `model.language_model`),
so the split comes from the objects themselves, first claim wins, the longest module path decides:

1. sub-models whose `config` is the model's vision / text / audio sub-config (a VLM's tower and language model);
2. an encoder-decoder (`config.is_encoder_decoder`, T5): `get_encoder()` -> encoder, `get_decoder()` -> decoder;
3. `get_output_embeddings()` -> head; `get_decoder()` and `get_input_embeddings()` -> language;
4. the backbone, `model.base_model` (the `base_model_prefix` sub-module), -> its modality (`main_input_name`:
   input_ids -> language, pixel_values -> vision) when no sub-config split it; every other top-level child that
   holds tensors (BERT's `classifier`, a `score` layer) -> head; a model that is its own backbone (a bare
   `BertModel`) is that modality as a whole;
5. in a model split by sub-configs (a VLM), the trunk's other children that hold tensors (LLaVA's and Gemma 3's
   `multi_modal_projector`) -> projector.

Regex patterns from a parameters file take precedence.

    >>> classifier = ComponentClassifier.from_model(model)          # doctest: +SKIP
    >>> classifier.component_of("model.language_model.layers.0.mlp.up_proj.weight")  # doctest: +SKIP
    'language'
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from typing import TYPE_CHECKING, Iterable, Mapping

if TYPE_CHECKING:  # torch is imported by whoever hands us a model; reading a saved classifier needs none
    from torch import nn

COMPONENTS = ("vision", "projector", "language", "encoder", "decoder", "head", "other")
_SUBCONFIG_COMPONENT = {"vision_config": "vision", "text_config": "language", "audio_config": "audio"}
_INPUT_MODALITY = {"input_ids": "language", "pixel_values": "vision", "input_features": "audio",
                   "input_values": "audio"}


@dataclasses.dataclass(frozen=True)
class ComponentClassifier:
    prefixes: tuple[tuple[str, str], ...]  # (module path, component), longest first
    patterns: tuple[tuple[re.Pattern[str], str], ...] = ()  # user overrides, checked first

    @classmethod
    def from_model(cls, model: nn.Module, overrides: Mapping[str, Iterable[str]] | None = None) -> ComponentClassifier:
        from torch import nn

        root, root_prefix = unwrap_model(model)
        found: dict[str, str] = {}
        names = {id(m): n for n, m in root.named_modules()}
        config = getattr(root, "config", None)

        sub_configs = getattr(config, "sub_configs", None) or {}
        wanted = {}
        for key in sub_configs:
            sub = getattr(config, key, None)
            if sub is not None:
                wanted[id(sub)] = _SUBCONFIG_COMPONENT.get(key, key.removesuffix("_config"))
        for name, module in root.named_modules():
            component = wanted.get(id(getattr(module, "config", None)))
            if name and component and not any(name.startswith(p + ".") for p in found):
                found[name] = component

        def claim(getter: str, component: str) -> None:
            try:
                module = getattr(root, getter)()
            except (AttributeError, NotImplementedError, TypeError, ValueError):
                return
            name = names.get(id(module)) if module is not None else None
            if name:  # the root itself ("") is never a component prefix
                found.setdefault(name, component)

        split_by_sub_configs = bool(found)
        encoder_decoder = bool(getattr(config, "is_encoder_decoder", False))
        if encoder_decoder:
            claim("get_encoder", "encoder")
            claim("get_decoder", "decoder")
        claim("get_output_embeddings", "head")
        claim("get_decoder", "language")
        claim("get_input_embeddings", "language")

        backbone = getattr(root, "base_model", root)
        modality = _INPUT_MODALITY.get(getattr(root, "main_input_name", None), "other")
        if isinstance(backbone, nn.Module) and backbone is not root and id(backbone) in names:
            if not split_by_sub_configs:
                found.setdefault(names[id(backbone)], modality)
            for child_name, child in root.named_children():
                holds = next(itertools.chain(child.parameters(), child.buffers()), None) is not None
                if child is not backbone and holds and not _covered(child_name, found):
                    found[child_name] = "head"
        elif not (split_by_sub_configs or encoder_decoder):
            found[""] = modality  # the model is its own backbone: every tensor not claimed above
        if split_by_sub_configs:  # a VLM's trunk: tower, language model, and what connects them
            trunk = backbone if isinstance(backbone, nn.Module) and id(backbone) in names else root
            for child_name, child in trunk.named_children():
                path = _join(names[id(trunk)], child_name)
                holds = next(itertools.chain(child.parameters(), child.buffers()), None) is not None
                if holds and not _covered(path, found) and not _inside(path, found):
                    found[path] = "projector"
        prefixes = [(_join(root_prefix, name), comp) for name, comp in found.items()]
        prefixes.sort(key=lambda pc: len(pc[0]), reverse=True)
        patterns = tuple(
            (re.compile(p), comp) for comp, plist in (overrides or {}).items() for p in plist
        )
        return cls(tuple(prefixes), patterns)

    def component_of(self, tensor_name: str) -> str:
        for pattern, component in self.patterns:
            if pattern.search(tensor_name):
                return component
        for prefix, component in self.prefixes:
            if not prefix or tensor_name == prefix or tensor_name.startswith(prefix + "."):
                return component
        return "other"

    def with_overrides(self, overrides: Mapping[str, Iterable[str]] | None) -> ComponentClassifier:
        patterns = tuple((re.compile(p), comp) for comp, plist in (overrides or {}).items() for p in plist)
        return dataclasses.replace(self, patterns=patterns)

    def describe(self) -> dict[str, str]:
        """Module path -> component: the evidence for how tensors were split."""
        return {prefix: comp for prefix, comp in sorted(self.prefixes)}


def unwrap_model(model: nn.Module) -> tuple[nn.Module, str]:
    """The transformers model inside PEFT / DDP / DataParallel wrappers, and its path from the outer model."""
    from torch import nn

    inner, path = model, ""
    for _ in range(8):
        if isinstance(inner, (nn.DataParallel, nn.parallel.DistributedDataParallel)) or (
            hasattr(inner, "module") and type(inner).__name__ in {"FullyShardedDataParallel", "DistributedDataParallel"}
        ):
            inner, path = inner.module, _join(path, "module")
        elif hasattr(inner, "get_base_model") and hasattr(inner, "peft_config"):
            base = inner.get_base_model()
            names = {id(m): n for n, m in inner.named_modules()}
            inner, path = base, _join(path, names.get(id(base), "base_model.model"))
        else:
            break
    return inner, path


def _covered(name: str, found: dict[str, str]) -> bool:
    """Whether module `name` or a module inside it already has a component."""
    return any(p == name or p.startswith(name + ".") for p in found)


def _inside(name: str, found: dict[str, str]) -> bool:
    """Whether module `name` lies inside a module that already has a component."""
    return any(p and name.startswith(p + ".") for p in found)


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix and name else prefix or name


def component_overrides(target) -> dict[str, list[str]]:
    return dict(target.params.get("components") or {})
