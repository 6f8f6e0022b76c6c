"""The serving engines' rules as data (`engine_rules.yaml`): what each engine does with each adapter feature, with
the engine's source file and issue, and the LoRA scale each engine computes.

    rules = engine_rules()
    rules.engines["llama.cpp"]["base_scale"]["rslora"]     # 'alpha_over_rank'
    rules.rule("rslora", "llama.cpp")["outcome"]          # 'SILENT'
"""

from __future__ import annotations

import dataclasses
import functools
import math
from pathlib import Path
from typing import Any

RULES_FILE = Path(__file__).with_name("engine_rules.yaml")
OUTCOMES = ("OK", "FLAG", "ERROR", "SILENT")
ENGINE_ALIASES = {"vllm": "vllm", "llama.cpp": "llama.cpp", "llamacpp": "llama.cpp", "llama_cpp": "llama.cpp",
                  "gguf": "llama.cpp", "ollama": "llama.cpp", "tgi": "tgi", "lorax": "tgi",
                  "text-generation-inference": "tgi", "sglang": "sglang"}


@dataclasses.dataclass(frozen=True)
class EngineRules:
    engines: dict[str, dict[str, Any]]
    features: dict[str, dict[str, Any]]

    def rule(self, feature: str, engine: str) -> dict[str, Any] | None:
        return (self.features.get(feature, {}).get("rules") or {}).get(engine)

    def resolve(self, engines: str | list[str] | tuple[str, ...] | None) -> list[str]:
        """The user's `serve_engines` (a list, a comma-separated string, or None for all) as rule keys."""
        if not engines:
            return list(self.engines)
        names = engines.split(",") if isinstance(engines, str) else list(engines)
        out = []
        for name in (n.strip() for n in names if n and n.strip()):
            key = ENGINE_ALIASES.get(name.lower())
            if key is None:
                raise ValueError(f"unknown serving engine {name!r}: use one of {', '.join(self.engines)}")
            if key not in out:
                out.append(key)
        return out


ENGINES_NOT_STATED = ("no serving engine was named (serve_engines in --params, or --serve ENGINE …), so every engine "
                      "the rules know was judged: what holds only for an engine you may not use is a warn, not a "
                      "fail")


def name_your_engines(fix: str) -> str:
    """A fix for a verdict judged over every engine: the engine fixes, then how to state yours."""
    return f"{fix} Name the engines you serve on (`--serve vllm llama.cpp`) to judge your deployment.".strip()


@functools.lru_cache(maxsize=1)
def engine_rules() -> EngineRules:
    import yaml

    data = yaml.safe_load(RULES_FILE.read_text())
    return EngineRules(data["engines"], data["features"])


def engine_scale(kind: str, alpha: float, config_r: int, tensor_rank: int) -> float:
    """The LoRA scale an engine applies to one module (the `scale` kinds of engine_rules.yaml)."""
    if kind == "alpha_over_r":
        return alpha / config_r if config_r else 0.0
    if kind == "alpha_over_sqrt_r":
        return alpha / math.sqrt(config_r) if config_r else 0.0
    if kind == "alpha_over_rank":
        return alpha / tensor_rank if tensor_rank else 0.0
    raise ValueError(f"unknown scale kind {kind!r} in {RULES_FILE.name}")
