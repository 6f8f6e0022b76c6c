"""config.json and generation_config.json against the tensors they describe.

- `config.tied_embeddings`: the tie against the tensors. Whether the head is tied is asked from the model as
  from_pretrained builds it (the meta skeleton, tied by transformers' own `tie_weights()`: the class's
  `_tied_weights_keys` under its sub-configs' `tie_word_embeddings`), not read from the top-level flag alone: CPM-Ant
  declares `tie_word_embeddings` and ties nothing, an encoder-decoder composite ties its decoder's head under the
  decoder's config. A tied head with an adapter that trains or saves lm_head / embed_tokens separately (after merge
  and reload the tie overwrites one with the other: peft #2777, #1750); a tied head saved apart from, and different
  from, its embeddings; an untied head the checkpoint lacks (it loads randomly initialised); identical tensors left
  untied. Tensors are compared by shape and sampled bytes (the first and last 4 KiB of each).
- `config.quantization`: quantization_config against the dtypes in the weights: a 16-bit (merged) model still
  declaring bitsandbytes 4-bit (unsloth #1601), quantized weights with no declaration, an adapter whose base is
  pre-quantized (merging into it rounds the update away: transformers #31293, peft #2321).
- `config.generation`: generation_config.json validated as `save_pretrained` validates it at the end of training
  (do_sample=False with a temperature set raised at the first checkpoint save: transformers #29988).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from workbench.display.nodes import facts_table
from workbench.display.result import ProbeResult
from workbench.findings import Finding
from workbench.model.lora import adapter_module
from workbench.model.tied import weight_partners
from workbench.probes.saved.files import SavedFiles

TIED = "config.tied_embeddings"
QUANT = "config.quantization"
GENERATION = "config.generation"


# --- config.tied_embeddings --------------------------------------------------------------------------------------
@dataclasses.dataclass(repr=False)
class TiedEmbeddingsResult(ProbeResult):
    config_path: str
    tie_word_embeddings: bool | None = None  # config.json's flag (the text config's for a VLM)
    tied_by_model: bool | None = None  # the built head shares its parameter with embeddings (None: not built)
    model_class: str | None = None
    input_module: str | None = None  # the embeddings the built head is tied to, else get_input_embeddings()
    output_module: str | None = None
    input_tensor: str | None = None  # in the checkpoint's headers
    output_tensor: str | None = None
    same_bytes: bool | None = None  # shapes equal and sampled bytes equal
    adapter_touches: list[str] = dataclasses.field(default_factory=list)  # how the adapter trains head/embeddings
    ensure_weight_tying: bool = False
    # config.json declares the head untied, the config class overrides that to tied (transformers 5.x T5Config and
    # MT5Config: "official weights have False serialized, but we have to tie always"), and both tensors are saved
    # with different values: from_pretrained keeps them apart (modeling_utils `tie_weights`: "both are present in the
    # checkpoints with different values, so we will NOT tie them"), the model as the checkpoint declares it (T5 v1.1,
    # mT5, Flan-T5 as published)
    kept_apart_at_load: bool = False

    def findings(self) -> list[Finding]:
        evidence = dataclasses.asdict(self)
        tied = self.tied
        ties = f"{self.model_class} ties them" if self.tied_by_model else "config.json ties them"
        if tied and self.adapter_touches and not self.ensure_weight_tying:
            return [Finding(TIED, "fail", "The adapter trains the head / embeddings separately while the model "
                            "ties them",
                            f"{ties}, and the adapter {'; '.join(self.adapter_touches)}."
                            " After merge_and_unload and a reload, the tie copies one matrix over the other: the "
                            "trained head (or embeddings) is overwritten (peft #2777, #1750).", evidence,
                            "Train both as one: `LoraConfig(..., ensure_weight_tying=True)` (PEFT ≥ 0.18), or untie "
                            "before training and save that: `model.config.tie_word_embeddings = False`.")]
        if tied and self.input_tensor and self.output_tensor and self.same_bytes is False:
            return [Finding(TIED, "fail", "The model ties the embeddings, but the checkpoint's head differs from "
                            "them", f"{self.output_tensor} and {self.input_tensor} are both saved and differ, and "
                            f"{ties} (tie_word_embeddings: {self.tie_word_embeddings}). transformers 5.x then keeps "
                            "both and warns (modeling_utils `tie_weights`: 'both are present in the checkpoints with "
                            "different values, so we will NOT tie them'); transformers 4.x ties them, replacing the "
                            "trained head by the embeddings.", evidence,
                            "Set `\"tie_word_embeddings\": false` in config.json (the saved head is the trained "
                            "one), or re-save from the training run with the tie it had.")]
        if tied is False and self.output_module and self.input_tensor and not self.output_tensor:
            untied_by = (f"{self.model_class} ties no head to its embeddings" if self.tied_by_model is False
                         else "tie_word_embeddings is false")
            return [Finding(TIED, "fail", f"Untied embeddings, but the checkpoint has no {self.output_module}",
                            f"{untied_by} and no head tensor is saved: from_pretrained initialises the head at random "
                            "(a warning lists it as newly initialized).", evidence,
                            "Save the head (`model.save_pretrained(folder)` saves it when untied)"
                            + ("" if self.tie_word_embeddings else ", or set `\"tie_word_embeddings\": true` in "
                               "config.json if the model was tied") + ".")]
        if tied is False and self.input_tensor and self.output_tensor and self.same_bytes:
            return [Finding(TIED, "warn", "Identical embeddings and head, left untied",
                            f"{self.input_tensor} and {self.output_tensor} hold the same values but the model does "
                            "not tie them: it carries two copies, and training will let them drift apart where the "
                            "original model kept one.", evidence,
                            "If the model was tied, set `\"tie_word_embeddings\": true` in config.json.")]
        state = {True: "tied", False: "untied", None: "no tie_word_embeddings"}[tied]
        flag_note = (f"; {self.model_class} as transformers builds it {'ties the head' if tied else 'ties no head'}"
                     f" to its embeddings (config.json's top-level tie_word_embeddings: {self.tie_word_embeddings})"
                     if self.tied_by_model is not None and self.tie_word_embeddings is not None
                     and self.tied_by_model != self.tie_word_embeddings else "")
        if self.kept_apart_at_load:
            flag_note = (f"; config.json declares them untied and {self.model_class}'s config class ties them "
                         "whatever it declares, but with both saved and different from_pretrained keeps them apart "
                         "(transformers' tie_weights; it prints \"both are present in the checkpoints with different "
                         "values, so we will NOT tie them\", which this checkpoint can ignore)")
        return [Finding(TIED, "pass", f"Embeddings {state}, consistent with the tensors",
                        f"Head {self.output_tensor or 'not saved'}, embeddings {self.input_tensor or 'not saved'}"
                        + flag_note
                        + ("; the adapter keeps the tie (ensure_weight_tying)" if self.ensure_weight_tying and
                           self.adapter_touches else "") + ".", evidence)]

    @property
    def tied(self) -> bool | None:
        """The tie from_pretrained makes: the built model's answer, else config.json's flag."""
        if self.kept_apart_at_load:
            return False
        return self.tie_word_embeddings if self.tied_by_model is None else self.tied_by_model

    def details(self):
        return facts_table([
            ("tie_word_embeddings", self.tie_word_embeddings), ("head tied once built", self.tied_by_model),
            ("input embeddings", self.input_tensor),
            ("output embeddings (head)", self.output_tensor), ("same values (sampled)", self.same_bytes),
            ("adapter", "; ".join(self.adapter_touches) or None)])


def tie_setting(files: SavedFiles) -> bool | None:
    config = files.config or {}
    if "tie_word_embeddings" in config:
        return bool(config["tie_word_embeddings"])
    text = files.text_config()
    if "tie_word_embeddings" in text:
        return bool(text["tie_word_embeddings"])
    sk = files.skeleton
    if sk is not None:
        cfg = sk[0].config
        value = getattr(cfg, "tie_word_embeddings", None)
        return None if value is None else bool(value)
    return None


def tied_embeddings_probe(files: SavedFiles) -> TiedEmbeddingsResult:
    """tie_word_embeddings against the saved head and embeddings, and against what the adapter trains."""
    result = TiedEmbeddingsResult(str(files.model_dir / "config.json"), tie_setting(files))
    result.input_module = files.embedding_modules.get("input")
    result.output_module = files.embedding_modules.get("output")
    if files.skeleton is not None and result.input_module and result.output_module:
        skeleton = files.skeleton[0]
        result.model_class = type(skeleton).__name__
        partners = weight_partners(skeleton, result.output_module)
        result.tied_by_model = bool(partners)
        if partners and result.input_module not in partners:
            # the head is tied to other embeddings than get_input_embeddings() (an encoder-decoder's decoder side):
            # that tie is the one to check, under the name the checkpoint saves it
            result.input_module = next((m for m in partners if files.tensor(f"{m}.weight")), partners[0])
    entries = {}
    for kind in ("input", "output"):
        module = getattr(result, f"{kind}_module")
        entry = files.tensor(f"{module}.weight") if module else None
        if entry is not None:
            setattr(result, f"{kind}_tensor", entry[1].name)
            entries[kind] = entry
    if len(entries) == 2:
        (h1, t1), (h2, t2) = entries["input"], entries["output"]
        a, b = (files.sampled(h1, t1), files.sampled(h2, t2)) if t1.shape == t2.shape else (b"", b"x")
        # all-zero samples (an unwritten, sparse file) tell nothing about tying: not compared
        result.same_bytes = None if a == b and not a.strip(b"\0") else (t1.dtype == t2.dtype and a == b)
    if result.tied_by_model and result.same_bytes is False and (files.config or {}).get("tie_word_embeddings") is False:
        built = getattr(files.skeleton[0].config, "tie_word_embeddings", None)
        result.kept_apart_at_load = built is True  # the class overrode the declared flag (see the field)
    raw = files.adapter_config or {}
    result.ensure_weight_tying = bool(raw.get("ensure_weight_tying"))
    leaves = {m.rsplit(".", 1)[-1] for m in (result.input_module, result.output_module) if m}
    for pattern in raw.get("modules_to_save") or []:
        if pattern.rsplit(".", 1)[-1] in leaves:
            result.adapter_touches.append(f"saves {pattern} in modules_to_save")
    lora_on = sorted({adapter_module(t.name)[0].rsplit(".", 1)[-1] for t in files.adapter_tensors
                      if adapter_module(t.name)} & leaves)
    if lora_on:
        result.adapter_touches.append(f"puts LoRA on {', '.join(lora_on)}")
    if raw.get("trainable_token_indices"):
        result.adapter_touches.append("trains token rows (trainable_token_indices)")
    return result


# --- config.quantization -----------------------------------------------------------------------------------------
QUANT_SUFFIXES = (".absmax", ".quant_map", ".nested_absmax", ".nested_quant_map", ".SCB", ".weight_format",
                  ".qweight", ".qzeros", ".scales", ".g_idx", ".weight_scale", ".weight_scale_inv")


@dataclasses.dataclass(repr=False)
class QuantizationConfigResult(ProbeResult):
    config_path: str
    declared: dict[str, Any] | None = None  # quantization_config
    dtypes: dict[str, int] = dataclasses.field(default_factory=dict)  # dtype -> tensors (headers)
    quantized_tensors: list[str] = dataclasses.field(default_factory=list)  # tensors that only quantization makes
    adapter: str | None = None

    @property
    def method(self) -> str | None:
        if not self.declared:
            return None
        method = self.declared.get("quant_method")
        if method == "bitsandbytes" or self.declared.get("load_in_4bit") or self.declared.get("load_in_8bit"):
            return "bitsandbytes " + ("4-bit" if self.declared.get("load_in_4bit") else "8-bit")
        return str(method)

    def findings(self) -> list[Finding]:
        evidence = {"config": self.config_path, "quantization_config": self.declared, "dtypes": self.dtypes,
                    "quantized_tensors": self.quantized_tensors[:10], "adapter": self.adapter}
        sixteen = {d for d in self.dtypes if d in ("bfloat16", "float16", "float32")}
        if self.declared and not self.quantized_tensors and (self.method or "").startswith("bitsandbytes"):
            return [Finding(QUANT, "fail", f"config.json declares {self.method}, the weights are "
                            f"{'/'.join(sorted(sixteen)) or 'not quantized'}",
                            "A merged 16-bit model saved with the quantization_config of the 4-bit base it was "
                            "trained on (unsloth #1601). transformers 5.x loads it as a pre-quantized save without "
                            "quantizing it: its bitsandbytes layers hold the 16-bit weights with no quant state, the "
                            "first forward raises a bare AssertionError in bitsandbytes and a LoRA on them \"no "
                            "attribute 'compress_statistics'\"; older releases quantize it again on the fly, so the "
                            "model served is not the one you merged.", evidence,
                            "Delete `quantization_config` from config.json (or `del model.config.quantization_config`"
                            " before `save_pretrained`), so it loads as the 16-bit model it is.")]
        if not self.declared and self.quantized_tensors:
            return [Finding(QUANT, "fail", "Quantized weights, but config.json declares no quantization_config",
                            f"Tensors such as {', '.join(self.quantized_tensors[:3])} exist only in a quantized "
                            "save; without a quantization_config from_pretrained loads them as plain tensors and "
                            "the model is garbage or fails to load.", evidence,
                            "Re-save from the quantized model (`model.save_pretrained(folder)` writes the "
                            "quantization_config), or copy the base's quantization_config into config.json.")]
        if self.declared and self.adapter:
            return [Finding(QUANT, "warn", f"The adapter's base is pre-quantized ({self.method})",
                            "Training QLoRA on it is fine; merging the adapter into this base (merge_and_unload) "
                            "rounds the update into 4/8-bit weights, and the merged model scores below the adapter "
                            "(transformers #31293, peft #2321).", evidence,
                            "Merge into the 16-bit original instead: load the unquantized base in bf16, "
                            "`PeftModel.from_pretrained(base, adapter).merge_and_unload()`, then quantize if needed.")]
        if self.declared:
            return [Finding(QUANT, "pass", f"Quantized ({self.method}) and declared so",
                            f"quantization_config and the weights agree ({', '.join(self.quantized_tensors[:2])}).",
                            evidence)]
        return [Finding(QUANT, "pass", "No quantization declared, none in the weights",
                        "Weight dtypes: " + ", ".join(f"{d} {n}" for d, n in self.dtypes.items()) + ".", evidence)]

    def details(self):
        return facts_table([("quantization_config", self.declared), ("weight dtypes", self.dtypes),
                                            ("quantization tensors", self.quantized_tensors[:5] or None)])


def quantization_probe(files: SavedFiles) -> QuantizationConfigResult:
    """quantization_config against the dtypes and the quantization tensors in the weights."""
    declared = (files.config or {}).get("quantization_config") or files.text_config().get("quantization_config")
    result = QuantizationConfigResult(str(files.model_dir / "config.json"), declared if isinstance(declared, dict) else None,
                                adapter=str(files.adapter_dir) if files.adapter_dir else None)
    for header in files.base.headers:
        for t in header.tensors:
            result.dtypes[t.dtype] = result.dtypes.get(t.dtype, 0) + 1
            if (t.name.endswith(QUANT_SUFFIXES) or ".quant_state." in t.name
                    or (t.dtype.startswith("float8") and t.name.endswith(".weight"))):
                result.quantized_tensors.append(t.name)
    return result


# --- config.generation -------------------------------------------------------------------------------------------
@dataclasses.dataclass(repr=False)
class GenerationConfigResult(ProbeResult):
    path: str | None
    values: dict[str, Any] | None = None
    error: str | None = None  # raised even by the lenient validation: loading or generate() fails
    issues: str | None = None  # raised by save_pretrained's strict validation

    def findings(self) -> list[Finding]:
        evidence = {"file": self.path, "generation_config": self.values, "error": self.error, "issues": self.issues}
        if self.path is None:
            return [Finding(GENERATION, "skip", "No generation_config.json",
                            "transformers derives one from config.json when the model loads.", evidence)]
        fix = ("Fix it before training, so the checkpoint saves succeed: e.g. for do_sample=false drop the sampling "
               "flags (`model.generation_config.temperature = None; model.generation_config.top_p = None`) or set "
               "`do_sample=True`; then `model.generation_config.save_pretrained(folder)`.")
        if self.error:
            return [Finding(GENERATION, "fail", "generation_config.json is invalid", self.error, evidence, fix)]
        if self.issues:
            first = self.issues.splitlines()[1] if len(self.issues.splitlines()) > 1 else self.issues
            return [Finding(GENERATION, "warn", f"save_pretrained refuses this generation config once anything "
                            f"changes it: {first.strip('- ')[:120]}",
                            "GenerationConfig.save_pretrained validates strictly: older transformers releases always, "
                            "this release as soon as the config was modified (a training script setting "
                            "max_new_tokens is enough). The Trainer saves it at every checkpoint, so the first save "
                            f"after hours of training raises (transformers #29988). {self.issues}", evidence, fix)]
        return [Finding(GENERATION, "pass", "generation_config.json validates as save_pretrained validates it",
                        ", ".join(f"{k}={v}" for k, v in (self.values or {}).items()
                                  if not k.startswith(("_", "transformers_version")))[:300], evidence)]

    def details(self):
        return facts_table([(k, v) for k, v in (self.values or {}).items()])


def generation_config_probe(files: SavedFiles) -> GenerationConfigResult:
    """generation_config.json through GenerationConfig's strict validation (what save_pretrained runs)."""
    if files.generation_config_path is None:
        return GenerationConfigResult(None)
    result = GenerationConfigResult(str(files.generation_config_path), files.generation_config)
    if files.generation_config is None:
        result.error = f"{files.generation_config_path.name} is not a JSON object"
        return result
    from transformers import GenerationConfig

    try:
        config = GenerationConfig.from_dict(dict(files.generation_config))
        config.validate(strict=False)
    except Exception as exc:  # noqa: BLE001 - any refusal is the finding
        result.error = f"{type(exc).__name__}: {exc}"
        return result
    try:
        config.validate(strict=True)
    except ValueError as exc:
        result.issues = str(exc)
    return result
