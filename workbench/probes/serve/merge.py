"""`serve.merge`: `merge_and_unload()` against the unmerged adapter on the same batch, on the prepared model.

PEFT's own merge runs (`merge_adapter(safe_merge=True)`: every merged weight is a new tensor, and on a 4-bit base
bitsandbytes' `Params4bit` is rebuilt from dequantize(W) + s·B·A, as `merge_and_unload()` does), the logits are
compared with the unmerged forward, and the prepared model is put back: every parameter object, its tensor, each
LoRA layer's merged state (`workbench.model.guard.restored` plus the base layers' weight objects). No load, no copy.

- a 4-bit base: the merge re-quantizes W + s·B·A, so the merged model differs from what training computed
  (dequantize(W) + s·B·A) by the 4-bit rounding of the sum (transformers #31293, peft #2321); the fix is to merge
  into a base loaded in bf16/fp16 (dequantize, then merge);
- a tied head: LoRA on lm_head or the embeddings of a base whose lm_head is its embedding matrix: the merge writes
  the delta into the shared tensor, so it reaches both ends of the model.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

from workbench.display.result import ProbeResult
from workbench.findings import Finding

CHECK = "serve.merge"
# max |Δ logit| / max |logit| within which the merge is the same model up to the dtype's rounding
ROUNDING = {"float32": 1e-4, "float64": 1e-8, "bfloat16": 3e-2, "float16": 5e-3}
TOP1_FAIL = 0.9  # top-1 agreement below this: the merged model answers differently


@dataclasses.dataclass(repr=False)
class ServeMergeResult(ProbeResult):
    skipped: str | None = None
    batch: str = ""
    dtype: str = ""
    quantized_4bit: bool = False
    tied_head: list[str] = dataclasses.field(default_factory=list)
    max_logit_difference: float = 0.0
    relative_difference: float = 0.0
    top1_agreement: float = 1.0
    tokens: int = 0
    # positions whose top-1 token differs, and the widest gap, in the unmerged logits, between the two tokens of such
    # a flip: a flip within the dtype's rounding is a near-tie the rounding alone can turn
    top1_flips: int = 0
    widest_flip_gap: float = 0.0
    merged_layers: int = 0
    base_name: str = ""
    base_class: str = "AutoModelForCausalLM"  # the base model's own class, for the fix
    adapter_name: str = "ADAPTER"  # the adapter folder, for the fix
    context: str = "no autocast"  # the forward context both the unmerged and the merged forward ran in

    @property
    def tolerance(self) -> float:
        return ROUNDING.get(self.dtype, 3e-2)

    def findings(self) -> list[Finding]:
        evidence = {k: getattr(self, k) for k in ("batch", "dtype", "quantized_4bit", "tied_head",
                                                  "max_logit_difference", "relative_difference", "top1_agreement",
                                                  "top1_flips", "widest_flip_gap", "tokens", "merged_layers",
                                                  "context")}
        evidence["tolerance"] = self.tolerance
        if self.skipped:
            return [Finding(CHECK, "skip", "No adapter to merge", self.skipped, evidence)]
        numbers = (f"max |Δ logit| {self.max_logit_difference:.3g} ({self.relative_difference:.2%} of the largest "
                   f"logit; {self.dtype} rounding allows {self.tolerance:.2%}), top-1 agreement "
                   f"{self.top1_agreement:.1%} over {self.tokens} positions, {self.merged_layers} LoRA layers merged "
                   f"with PEFT's merge_adapter(safe_merge=True); batch: {self.batch}")
        if self.relative_difference <= self.tolerance:
            # every logit moved by at most the dtype's rounding: a top-1 token that changes had a runner-up within
            # twice that (a tiny or untrained model's flat logits), which rounding alone turns; not a different model
            gap = (f"their logits at most {self.widest_flip_gap:.3g} apart before the merge" if self.widest_flip_gap
                   else "their logits equal before the merge")
            ties = (f"; top-1 differs at {self.top1_flips} of {self.tokens} positions, each a near-tie ({gap}), which "
                    f"{self.dtype} rounding alone can turn" if self.top1_flips else "")
            return [Finding(CHECK, "pass", "merge_and_unload() gives the model the adapter trained"
                            + (f", within {self.dtype} rounding" if self.top1_flips else ""), numbers + ties,
                            evidence)]
        causes, fixes = [], []
        if self.quantized_4bit:
            causes.append("the base is 4-bit: PEFT re-quantizes dequantize(W) + s·B·A, so the merged weights carry "
                          "a new 4-bit rounding the unmerged adapter never had (transformers #31293, peft #2321)")
            fixes.append(f"Merge into the base loaded in bf16 (dequantize, then merge): `base = {self.base_class}"
                         f".from_pretrained(\"{self.base_name}\", dtype=torch.bfloat16)`, `PeftModel.from_pretrained("
                         f"base, \"{self.adapter_name}\").merge_and_unload().save_pretrained(OUT)`; quantize the merged model "
                         "afterwards if it must be 4-bit.")
        if self.tied_head:
            causes.append(f"LoRA on {', '.join(self.tied_head)} of a base whose lm_head is its input embedding: "
                          "the merge writes the delta into the one shared matrix, so it changes both the input "
                          "embeddings and the output head")
            fixes.append("Untie before merging (`model.config.tie_word_embeddings = False` and give lm_head its own "
                         "copy: `model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.clone())`), or "
                         "train without LoRA on lm_head/embed_tokens of a tied model.")
        # a 4-bit base's requantization is what merging into the 4-bit base does, a choice the user did not state
        # (merging into the base loaded in bf16 is the usual way): a warn naming that condition, never a fail
        only_if_merged_in_4bit = self.quantized_4bit and not self.tied_head
        verdict = "fail" if self.top1_agreement < TOP1_FAIL and not only_if_merged_in_4bit else "warn"
        title = (f"If merged into the 4-bit base, the model differs from the unmerged adapter (top-1 agreement "
                 f"{self.top1_agreement:.1%})" if only_if_merged_in_4bit else
                 f"The merged model differs from the unmerged adapter beyond {self.dtype} rounding (top-1 agreement "
                 f"{self.top1_agreement:.1%})")
        return [Finding(CHECK, verdict, title,
                        numbers + (". Cause: " + "; ".join(causes) if causes else
                                   ". No known cause (not a 4-bit base, no tied head): look at the adapter's "
                                   "non-LoRA tensors and at layers PEFT merges with a variant (DoRA)."),
                        evidence, " ".join(fixes) or "Serve the unmerged adapter, or compare the merge per layer.")]

    def details(self):
        from workbench.display.nodes import Display, Table

        if self.skipped:
            return None
        return Display(Table.from_records([{"max |Δ logit|": f"{self.max_logit_difference:.3g}",
                                            "relative": f"{self.relative_difference:.3g}",
                                            "tolerance": f"{self.tolerance:.3g}",
                                            "top-1 agreement": f"{self.top1_agreement:.1%}",
                                            "4-bit base": self.quantized_4bit,
                                            "tied head": ", ".join(self.tied_head) or "-"}]))


def _lora_layers(model) -> list:
    from peft.tuners.lora import LoraLayer

    return [m for m in model.modules() if isinstance(m, LoraLayer)]


@contextlib.contextmanager
def _lora_state_kept(layers: list):
    """Put back each LoRA layer's base weight and bias objects and its merged state (a 4-bit merge replaces the
    Parameter itself, which `restored` alone, keeping tensors of known Parameters, would not see)."""
    kept = [(layer, layer.get_base_layer(), dict(layer.get_base_layer()._parameters), list(layer.merged_adapters))
            for layer in layers]
    try:
        yield
    finally:
        for layer, base, params, merged in kept:
            base._parameters.clear()
            base._parameters.update(params)
            layer.merged_adapters[:] = merged


def _tied_lora(model, layers: list) -> list[str]:
    get_in, get_out = getattr(model, "get_input_embeddings", None), getattr(model, "get_output_embeddings", None)
    try:
        inp, out = get_in(), get_out()
    except (AttributeError, NotImplementedError, TypeError):
        return []
    w_in = getattr(inp, "weight", None)
    w_out = getattr(out, "weight", None)
    if w_in is None or w_out is None or w_in is not w_out:
        return []
    ends = {id(inp), id(out), id(getattr(inp, "weight", None))}
    return [name for name, m in model.named_modules()
            if any(m is layer for layer in layers) and (id(m) in ends or id(m.get_base_layer()) in ends)]


def serve_merge_probe(prepared, target) -> ServeMergeResult:
    """merge_and_unload() on the CPU against the unmerged adapter: max logit difference and top-1 agreement."""
    import torch

    from workbench.model.batch import target_inputs
    from workbench.model.dtypes import compute_dtype_of
    from workbench.model.forward import logits_of, run_forward
    from workbench.model.guard import restored

    model = prepared.model
    if not hasattr(model, "peft_config") or not hasattr(model, "base_model"):
        return ServeMergeResult(skipped="The prepared model carries no PEFT adapter: nothing to merge.")
    layers = _lora_layers(model)
    if not layers:
        return ServeMergeResult(skipped="The PEFT model has no LoRA layer (another PEFT method): merge not compared.")
    # the batch proven to run, labels included: an encoder-decoder's decoder reads the decoder inputs its model
    # makes from the labels (Whisper's shift_tokens_right, modeling_whisper.py:1106), and without labels or
    # decoder_input_ids it has nothing to read (Whisper raises 'cannot specify both decoder_input_ids and
    # decoder_inputs_embeds'); the logits compared are the same with or without the loss beside them
    inputs, how = target_inputs(model, target)
    four_bit = any(type(layer.get_base_layer()).__name__ == "Linear4bit" for layer in layers)
    result = ServeMergeResult(batch=how, quantized_4bit=four_bit, tied_head=_tied_lora(model, layers),
                              base_name=str(getattr(target, "model_dir", "")),
                              base_class=type(model.get_base_model()).__name__,
                              adapter_name=str(getattr(target, "adapter_dir", None) or "ADAPTER"))
    compute = compute_dtype_of(model)
    with restored(model), _lora_state_kept(layers), torch.no_grad():
        model.eval()
        # the batch's own context: eval without autocast, else under autocast (a set-up whose dtypes only work
        # under autocast, the defect notebook 04 names, is still compared); both forwards in the same context
        for context in ("no autocast", "autocast"):
            out, exc = run_forward(model, inputs, context, compute)
            if exc is None:
                break
        else:
            raise exc
        unmerged = logits_of(out).float()
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # PEFT warns that a 4-bit merge rounds: that is what is measured
            model.base_model.merge_adapter(safe_merge=True)
        out, exc = run_forward(model.base_model.model, inputs, context, compute)
        if exc is not None:
            raise exc
        merged = logits_of(out).float()
    result.context = context
    result.merged_layers = len(layers)
    result.dtype = str(logits_of_dtype(layers)).removeprefix("torch.")
    diff = (merged - unmerged).abs()
    result.max_logit_difference = float(diff.max())
    result.relative_difference = result.max_logit_difference / max(float(unmerged.abs().max()), 1e-12)
    top_u, top_m = unmerged.argmax(-1), merged.argmax(-1)
    result.tokens = int(top_u.numel())
    result.top1_agreement = float((top_u == top_m).float().mean())
    flipped = top_u != top_m
    result.top1_flips = int(flipped.sum())
    if result.top1_flips:
        gaps = unmerged.gather(-1, top_u.unsqueeze(-1)) - unmerged.gather(-1, top_m.unsqueeze(-1))
        result.widest_flip_gap = float(gaps.squeeze(-1)[flipped].max())
    return result


def logits_of_dtype(layers: list) -> Any:
    """The dtype the adapted layers compute in (the 4-bit compute dtype for Linear4bit)."""
    base = layers[0].get_base_layer()
    compute = getattr(base, "compute_dtype", None)
    return compute if compute is not None else base.weight.dtype
