"""`serve.adapter`: what each serving engine makes of the adapter, from adapter_config.json and the adapter's
safetensors alone (the base's weights are never read; its config.json only for `tie_word_embeddings`).

Per engine (vLLM, llama.cpp, TGI/LoRAX, SGLang; the rules in `engine_rules.yaml`, each citing the engine's source):
ERROR (will not load), FLAG (loads with a named server flag), SILENT (loads and computes another update) or OK.
The update each module adds, s·B·A, is compared under the engine's scale against PEFT's: B·A is the same tensor on
both sides, so the relative difference of the updates is |s_engine / s_peft - 1|, reported with ‖B·A‖ per module.
Verdict over the engines served on: pass, warn for ERROR or FLAG, fail for SILENT.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Any

from workbench.display.result import ProbeResult
from workbench.findings import Finding
from workbench.model.lora import adapter_module, lora_scaling, read_json, update_norm
from workbench.probes.serve.engine_rules import ENGINES_NOT_STATED, engine_rules, engine_scale, name_your_engines

CHECK = "serve.adapter"
SCALE_TOLERANCE = 1e-6  # relative: a scale equal up to float rounding is the same update
NORM_NAMES = ("_layernorm", ".norm")  # full tensors llama.cpp's converter keeps (mergekit-extract-lora)


@dataclasses.dataclass
class ModuleScale:
    module: str
    rank: int
    peft_scale: float
    ba_norm: float  # ‖B·A‖_F, unscaled


@dataclasses.dataclass
class EngineVerdict:
    engine: str
    name: str
    outcome: str  # OK | FLAG | ERROR | SILENT
    reasons: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    unconfirmed: list[str] = dataclasses.field(default_factory=list)
    max_relative_difference: float = 0.0
    factor: float | None = None  # PEFT's scale / the engine's, when one number for every module
    factors: tuple[float, float] | None = None  # (smallest, largest) when it varies per module
    fix: str = ""


@dataclasses.dataclass(repr=False)
class ServeAdapterResult(ProbeResult):
    adapter: str | None
    engines: list[EngineVerdict] = dataclasses.field(default_factory=list)
    features: dict[str, Any] = dataclasses.field(default_factory=dict)
    modules: list[ModuleScale] = dataclasses.field(default_factory=list)
    skipped: str | None = None
    seconds: float = 0.0
    engines_stated: bool = True  # False: the user named no engine, every engine was judged (a fail becomes a warn)

    def findings(self) -> list[Finding]:
        if self.skipped:
            return [Finding(CHECK, "skip", "No adapter to serve", self.skipped, {"adapter": self.adapter})]
        evidence = {"adapter": self.adapter, "features": self.features, "modules": len(self.modules),
                    "engines": {e.engine: self._evidence(e) for e in self.engines}, "seconds": round(self.seconds, 3)}
        silent = [e for e in self.engines if e.outcome == "SILENT"]
        loud = [e for e in self.engines if e.outcome in ("ERROR", "FLAG")]
        summary = "; ".join(f"{e.name}: {e.outcome}" for e in self.engines)
        if silent:
            title = "Served as-is, the adapter computes another update on " + ", ".join(
                f"{e.name} ({self._how(e)})" for e in silent)
            fix = " ".join(f"{e.name}: {e.fix}" for e in silent + loud if e.fix)
            detail = summary + ". " + " ".join(self._detail(e) for e in silent + loud)
            if not self.engines_stated:  # a verdict about engines the user may not serve on
                return [Finding(CHECK, "warn", f"If served on {', '.join(e.name for e in silent)}: {title[0].lower()}"
                                f"{title[1:]}", f"{detail} Not a fail: {ENGINES_NOT_STATED}.", evidence,
                                name_your_engines(fix))]
            return [Finding(CHECK, "fail", title, detail, evidence, fix)]
        if loud:
            title = "The adapter needs a change to load on " + ", ".join(f"{e.name} ({e.outcome})" for e in loud)
            return [Finding(CHECK, "warn", title, summary + ". " + " ".join(self._detail(e) for e in loud),
                            evidence, " ".join(f"{e.name}: {e.fix}" for e in loud if e.fix))]
        note = [f"{e.name}: not confirmed for {', '.join(e.unconfirmed)}" for e in self.engines if e.unconfirmed]
        return [Finding(CHECK, "pass", f"Served on {', '.join(e.name for e in self.engines)}, the adapter loads and "
                        "computes the update PEFT trained", summary + (". " + "; ".join(note) if note else ""),
                        evidence)]

    @staticmethod
    def _evidence(e: EngineVerdict) -> dict[str, Any]:
        return {"outcome": e.outcome, "max_relative_difference": e.max_relative_difference, "factor": e.factor,
                "factors": e.factors, "reasons": e.reasons, "unconfirmed": e.unconfirmed}

    @staticmethod
    def _how(e: EngineVerdict) -> str:
        if e.factor is not None:
            return (f"scale {e.factor:.3g}x too small" if e.factor > 1 else f"scale {1 / e.factor:.3g}x too large")
        if e.factors is not None:
            return f"scale off by {e.factors[0]:.3g}x to {e.factors[1]:.3g}x per module"
        return ", ".join(r["feature"] for r in e.reasons if r["outcome"] == "SILENT")

    @staticmethod
    def _detail(e: EngineVerdict) -> str:
        parts = [f"{r['label']} -> {r['outcome']}" + (f" (\"{r['message']}\")" if r.get("message") else "")
                 + f" [{r['source']}" + (f"; {r['issue']}" if r.get("issue") else "") + "]" for r in e.reasons]
        if e.max_relative_difference > SCALE_TOLERANCE:
            parts.append(f"max relative difference of s·B·A against PEFT {e.max_relative_difference:.3g}")
        return f"{e.name}: " + "; ".join(parts) + "."

    def table(self) -> list[dict[str, Any]]:
        return [{"engine": e.name, "outcome": e.outcome,
                 "features": ", ".join(f"{r['feature']}={r['outcome']}" for r in e.reasons) or "-",
                 "max rel. diff of s·B·A": f"{e.max_relative_difference:.3g}",
                 "PEFT/engine scale": (f"{e.factor:.4g}" if e.factor is not None else
                                       f"{e.factors[0]:.4g}..{e.factors[1]:.4g}" if e.factors else "1"),
                 "fix": e.fix or "-"} for e in self.engines]

    def details(self):
        from workbench.display.nodes import Display, Paragraph, Table

        rules = engine_rules()
        return Display(Table.from_records(self.table()),
                       Paragraph("Rules read from: " + "; ".join(f"{rules.engines[e.engine]['name']} "
                                                                 f"{rules.engines[e.engine]['snapshot']}"
                                                                 for e in self.engines)))


def adapter_features(config: dict[str, Any], tensors: dict[str, tuple[int, ...]],
                     base_config: dict[str, Any] | None) -> dict[str, Any]:
    """The features of the adapter the engines' rules are about, read from its config and its tensor names."""
    r = int(config.get("r", 8))
    alpha = config.get("lora_alpha", 8)
    ranks = {m: shape[0] for name, shape in tensors.items()
             if (parsed := adapter_module(name)) and parsed[1] in ("lora_A", "lora_embedding_A")
             for m in [parsed[0]]}
    # `.base_layer.weight`: PEFT's save_embedding_layers copy of an adapted embedding/lm_head (the base's own
    # values); llama.cpp's converter skips it, the others never read it
    full = [n for n in tensors if adapter_module(n) is None and ".base_layer." not in n]
    text = (base_config or {}).get("text_config") or {}
    tied = (base_config or {}).get("tie_word_embeddings", text.get("tie_word_embeddings"))
    return {
        "r": r, "lora_alpha": alpha, "max_rank": max(ranks.values(), default=r),
        "rslora": bool(config.get("use_rslora")),
        "rank_pattern": {k: v for k, v in (config.get("rank_pattern") or {}).items() if v != r},
        "alpha_pattern": {k: v for k, v in (config.get("alpha_pattern") or {}).items() if v != alpha},
        "dora": bool(config.get("use_dora")) or any(".lora_magnitude_vector" in n for n in tensors),
        "modules_to_save": list(config.get("modules_to_save") or []),
        "full_tensors": full,
        "bias": config.get("bias", "none") not in (None, "none") or bool(config.get("lora_bias")),
        "lm_head_lora": sorted(m for m in ranks if m.rsplit(".", 1)[-1] == "lm_head"),
        "tied_base": tied,
    }


def _present(feature: str, f: dict[str, Any], engine: str) -> bool:
    if feature == "modules_to_save":
        if engine == "vllm":  # vLLM reads the config's field
            return bool(f["modules_to_save"])
        kept = [n for n in f["full_tensors"] if not any(s in n for s in NORM_NAMES)]
        return bool(kept) if engine == "llama.cpp" else bool(f["full_tensors"])
    if feature == "rank_limit":
        return f["max_rank"] > 16 or f["r"] > 16
    if feature == "lora_bias":
        return f["bias"]
    if feature == "tied_lm_head":
        return bool(f["lm_head_lora"]) and f["tied_base"] is True
    return bool(f.get(feature))


def _rank_flag(rule: dict[str, Any], rank: int) -> tuple[str, str]:
    allowed = [v for v in rule.get("allowed", []) if v >= rank]
    if rank <= rule.get("default", 16):
        return "OK", ""
    if not allowed:
        return "ERROR", f"rank {rank} is above the largest {rule['flag']} ({max(rule['allowed'])})"
    return "FLAG", f"{rule['flag']} {allowed[0]}"


def judge_engine(engine: str, config: dict[str, Any], f: dict[str, Any], modules: list[ModuleScale],
                 adapter_name: str) -> EngineVerdict:
    rules = engine_rules()
    spec = rules.engines[engine]
    verdict = EngineVerdict(engine, spec["name"], "OK")
    for feature, entry in rules.features.items():
        rule = rules.rule(feature, engine)
        if rule is None or not _present(feature, f, engine):
            continue
        if not rule.get("confirmed", False):
            verdict.unconfirmed.append(feature)
            continue
        outcome, flag = rule["outcome"], ""
        if feature == "rank_limit" and outcome == "FLAG":
            outcome, flag = _rank_flag(rule, max(f["max_rank"], f["r"]))
        if outcome == "OK":
            continue
        verdict.reasons.append({"feature": feature, "label": entry["label"], "outcome": outcome, "flag": flag,
                                "message": rule.get("message", ""), "source": rule["source"],
                                "issue": rule.get("issue", ""), "versions": rule.get("versions", "")})
    scale_unconfirmed = any(u in ("rank_pattern", "alpha_pattern", "rslora") for u in verdict.unconfirmed)
    kind = spec["base_scale"]["rslora" if f["rslora"] else "plain"]
    ratios = [m.peft_scale / engine_scale(kind, f["lora_alpha"], f["r"], m.rank)
              for m in modules if m.ba_norm > 0 and m.peft_scale > 0 and not scale_unconfirmed]
    if ratios:
        verdict.max_relative_difference = max(abs(1 / q - 1) for q in ratios)
        lo, hi = min(ratios), max(ratios)
        if verdict.max_relative_difference > SCALE_TOLERANCE:
            if hi - lo <= SCALE_TOLERANCE * hi:
                verdict.factor = hi
            else:
                verdict.factors = (lo, hi)
            if not any(r["outcome"] == "SILENT" for r in verdict.reasons):
                verdict.reasons.append({"feature": "scale", "label": f"LoRA scale ({kind})", "outcome": "SILENT",
                                        "source": spec["snapshot"], "issue": "", "message": ""})
    outcomes = {r["outcome"] for r in verdict.reasons}
    verdict.outcome = next((o for o in ("ERROR", "SILENT", "FLAG") if o in outcomes), "OK")
    verdict.fix = _fix(engine, verdict, f, kind, adapter_name)
    return verdict


def _fix(engine: str, v: EngineVerdict, f: dict[str, Any], kind: str, adapter: str) -> str:
    fixes = []
    features = {r["feature"] for r in v.reasons}
    if v.outcome == "ERROR" or features & {"dora", "modules_to_save", "tied_lm_head"}:
        fixes.append("merge the adapter into the base (`PeftModel.from_pretrained(base, \"" + adapter
                     + "\").merge_and_unload().save_pretrained(...)`) and serve the merged model"
                     + (", then convert it with convert_hf_to_gguf.py" if engine == "llama.cpp" else ""))
    flags = [r["flag"] for r in v.reasons if r.get("flag") and r["outcome"] == "FLAG"]
    if flags:
        fixes.append("start the server with " + " ".join(f"`{x}`" for x in flags))
    if v.factor is not None:
        alpha = f["lora_alpha"] * v.factor
        if engine == "llama.cpp":
            fixes.append(f"compensate with `--lora-scaled {Path(adapter).name}.gguf:{v.factor:.4g}` "
                         f"(builds that take two values: `--lora-scaled FILE {v.factor:.4g}`), or convert a copy "
                         f"whose adapter_config.json says \"lora_alpha\": {alpha:.6g}, \"use_rslora\": false")
        else:
            fixes.append(f"serve a copy whose adapter_config.json says \"lora_alpha\": {alpha:.6g}"
                         + (", \"use_rslora\": false" if f["rslora"] and kind == "alpha_over_r" else "")
                         + f" (the engine's {kind.replace('_', ' ')} then equals PEFT's scale)")
    elif v.factors is not None:
        fixes.append("no single scale fits every module (rank_pattern/alpha_pattern): merge the adapter "
                     "(`merge_and_unload()`) and serve the merged model")
    return "; ".join(dict.fromkeys(fixes))


def _read_adapter(adapter_dir: Path) -> tuple[dict[str, tuple[int, ...]], list[ModuleScale], dict[str, Any]]:
    """Tensor shapes, and per module the rank and ‖B·A‖ (from the lora_A/lora_B values alone)."""
    from safetensors import safe_open

    config = read_json(adapter_dir / "adapter_config.json") or {}
    shapes: dict[str, tuple[int, ...]] = {}
    pairs: dict[str, dict[str, Any]] = {}
    files = sorted(adapter_dir.glob("adapter_model*.safetensors"))
    for path in files:
        with safe_open(str(path), framework="pt") as fh:
            for name in fh.keys():
                shapes[name] = tuple(fh.get_slice(name).get_shape())
                parsed = adapter_module(name)
                if parsed and parsed[1] in ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B"):
                    pairs.setdefault(parsed[0], {})["A" if parsed[1].endswith("A") else "B"] = fh.get_tensor(name)
    modules = []
    for module, ab in pairs.items():
        if "A" not in ab or "B" not in ab:
            continue
        rank = int(ab["A"].shape[0])
        modules.append(ModuleScale(module, rank, lora_scaling(config, module, rank), update_norm(ab["A"], ab["B"])))
    return shapes, modules, config


def serve_adapter_probe(target, engines: str | list[str] | None = None) -> ServeAdapterResult:
    """Per serving engine: will the adapter load, with which flag, and does it compute PEFT's update."""
    adapter_dir = getattr(target, "adapter_dir", None)
    if adapter_dir is None:
        return ServeAdapterResult(None, skipped="The checkpoint is a full model: no adapter to serve.")
    adapter_dir = Path(adapter_dir)
    if not any(adapter_dir.glob("adapter_model*.safetensors")):
        return ServeAdapterResult(str(adapter_dir), skipped="No adapter_model.safetensors in the adapter folder "
                                  "(adapter.weights reports what is there).")
    import torch

    start = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # r x r products: threads only add waiting
    try:
        shapes, modules, config = _read_adapter(adapter_dir)
    finally:
        torch.set_num_threads(threads)
    base_config = read_json(Path(target.model_dir) / "config.json") if getattr(target, "model_dir", None) else None
    features = adapter_features(config, shapes, base_config)
    chosen = engine_rules().resolve(engines)
    result = ServeAdapterResult(str(adapter_dir), features=_jsonable(features), modules=modules,
                                engines_stated=bool(engines))
    result.engines = [judge_engine(e, config, features, modules, str(adapter_dir)) for e in chosen]
    result.seconds = time.perf_counter() - start
    return result


def _jsonable(features: dict[str, Any]) -> dict[str, Any]:
    out = dict(features)
    out["full_tensors"] = out["full_tensors"][:20]
    json.dumps(out, default=str)
    return {k: (v if not isinstance(v, float) or math.isfinite(v) else str(v)) for k, v in out.items()}
