"""Where layers go: the loaded model's `hf_device_map`, and what `device_map="auto"|"balanced"|...` would give
on N GPUs, predicted on the meta device by transformers' own `_get_device_map` (accelerate underneath) — the
same call from_pretrained makes — without a GPU and without reading a weight.

A prediction that raises is asked again with memory no model exceeds: raising there too, the planner itself fails on
this model class whatever the budget (a bug of the library, named with the frame it raised in), which is not the
"does not fit / bitsandbytes refuses cpu entries" the user's budget decides.
"""

from __future__ import annotations

import dataclasses
import traceback
from typing import Any

from workbench.display.result import ProbeResult
from workbench.findings import Finding
from workbench.model.components import unwrap_model

DEFAULT_GPU_MEMORY = "80GiB"
DEFAULT_CPU_MEMORY = "64GiB"
UNBOUNDED_MEMORY = 2**50  # bytes (1 PiB), more than any model: a planner that still raises does so whatever the budget

# Crashes of transformers' own device-map planner, by (exception type, function it raised in): the upstream issue.
# transformers 5.23 integrations/accelerate.py:88 `get_module_size_with_ties` indexes the modules still to place for
# every tied parameter outside the current module; one already placed with an earlier tie group (UDOP: `shared` is
# placed with `encoder` and `decoder`, then `patch_embed` is tied into the encoder) leaves the list empty.
KNOWN_PLANNER_CRASHES: dict[tuple[str, str], str] = {
    ("IndexError", "get_module_size_with_ties"): "transformers #35824 (IndexError in get_module_size_with_ties)",
}


@dataclasses.dataclass
class DeviceMapSummary:
    scenario: str
    device_map: dict[str, Any] | None
    error: str | None = None
    planner_crash: dict[str, Any] | None = None  # the planner raises with unbounded memory too: where, and the issue

    @property
    def gpus(self) -> list[Any]:
        values = (self.device_map or {}).values()
        return sorted({v for v in values if v not in ("cpu", "disk", "meta")}, key=str)

    @property
    def offloaded(self) -> dict[str, Any]:
        return {k: v for k, v in (self.device_map or {}).items() if v in ("cpu", "disk", "meta")}

    @property
    def collapsed(self) -> bool:
        """Everything on one GPU: the `{'': 0}` "fits on one GPU, so no sharding" case."""
        return bool(self.device_map) and len(self.gpus) == 1 and not self.offloaded

    def as_row(self) -> dict[str, Any]:
        shown = self.device_map if self.device_map is None or len(self.device_map) <= 6 else \
            dict(list(self.device_map.items())[:6]) | {"…": f"{len(self.device_map) - 6} more"}
        return {"scenario": self.scenario, "gpus spanned": len(self.gpus), "cpu/disk entries": len(self.offloaded),
                "one GPU only": self.collapsed, "device_map": str(shown) if not self.error else self.error}


def default_max_memory(gpus: int, given: dict | None) -> tuple[dict, bool]:
    """The user's --max-memory, or an assumed budget (and say it was assumed)."""
    if given:
        return dict(given), False
    budget: dict[Any, str] = {i: DEFAULT_GPU_MEMORY for i in range(gpus)}
    budget["cpu"] = DEFAULT_CPU_MEMORY
    return budget, True


def predict_device_map(config, spec: str, gpus: int, max_memory: dict, quant: str = "none",
                       dtype=None) -> DeviceMapSummary:
    from transformers.integrations.accelerate import _get_device_map

    from workbench.model.loading import bnb_config, meta_model, model_class_for

    skeleton, hf_quantizer = meta_model(config, dtype, bnb_config(quant, model_class=model_class_for(config)))
    budget = {k: v for k, v in max_memory.items() if not isinstance(k, int) or k < gpus}
    scenario = f'device_map="{spec}" on {gpus} GPU(s) (predicted)'
    try:
        device_map = _get_device_map(skeleton, spec, budget, hf_quantizer)
    except Exception as exc:  # noqa: BLE001 - e.g. bitsandbytes refusing cpu/disk entries: that is the finding
        unbounded = {**{i: UNBOUNDED_MEMORY for i in range(gpus)}, "cpu": UNBOUNDED_MEMORY}
        try:
            _get_device_map(skeleton, spec, unbounded, hf_quantizer)
            crash = None
        except Exception as again:  # noqa: BLE001 - the same raise whatever the memory: the planner's own failure
            crash = planner_crash(again, type(skeleton).__name__) if type(again) is type(exc) else None
        return DeviceMapSummary(scenario, None, f"{type(exc).__name__}: {str(exc)[:300]}", crash)
    if device_map and len(set(device_map.values())) == 1:
        device_map = {"": next(iter(device_map.values()))}  # as from_pretrained records a one-device map
    return DeviceMapSummary(scenario, dict(device_map))


def planner_crash(exc: BaseException, model_class: str) -> dict[str, Any]:
    """Where the device-map planner raised (its innermost frame), with the upstream issue when it is a known one."""
    import transformers

    frame = traceback.extract_tb(exc.__traceback__)[-1]
    where = f"{frame.filename.rsplit('site-packages/', 1)[-1]}:{frame.lineno} ({frame.name})"
    return {"model_class": model_class, "exception": f"{type(exc).__name__}: {str(exc)[:200]}", "raised_in": where,
            "transformers": transformers.__version__,
            "upstream": KNOWN_PLANNER_CRASHES.get((type(exc).__name__, frame.name))}


def loaded_device_map(model) -> DeviceMapSummary:
    inner, _ = unwrap_model(model)
    return DeviceMapSummary("as loaded", getattr(inner, "hf_device_map", None))


@dataclasses.dataclass(repr=False)
class DeviceMapResult(ProbeResult):
    """`parallel.device_map`: the loaded model's map and what device_map would give on the asked GPUs."""

    loaded: DeviceMapSummary
    predictions: list[DeviceMapSummary]
    gpus: int
    budget: dict
    assumed: bool

    def findings(self) -> list[Finding]:
        evidence = {"loaded": self.loaded.as_row(), "predicted": [p.as_row() for p in self.predictions],
                    "max_memory": {str(k): v for k, v in self.budget.items()}, "max_memory_assumed": self.assumed}
        budget_note = (f" (assumed {DEFAULT_GPU_MEMORY} per GPU; pass --max-memory for yours)" if self.assumed else "")
        offloads = [s for s in [self.loaded, *self.predictions] if s.offloaded]
        errors = [s for s in self.predictions if s.error]
        collapsed = [s for s in self.predictions if s.collapsed] if self.gpus > 1 else []
        if self.loaded.offloaded:
            names = ", ".join(list(self.loaded.offloaded)[:5])
            return [Finding("parallel.device_map", "warn",
                            f"{len(self.loaded.offloaded)} module(s) of the loaded model are "
                            f"on cpu/disk: {names}", "Offloaded layers run slowly and break kernels that need every "
                            "tensor on the GPU (flash-attention: 'q must be on CUDA'; bitsandbytes refuses cpu entries "
                            "for 4-bit without llm_int8_enable_fp32_cpu_offload).", evidence,
                            "Free GPU memory before loading (gc.collect(); torch.cuda.empty_cache()), give max_memory "
                            "room, or quantize; check hf_device_map after every load.")]
        crashes = [s for s in self.predictions if s.planner_crash]
        if crashes:
            crash = crashes[0].planner_crash
            upstream = f"; upstream: {crash['upstream']}" if crash["upstream"] else ""
            evidence["planner_crash"] = crash
            return [Finding("parallel.device_map", "warn",
                            f"{crashes[0].scenario} raises inside transformers' own planner for "
                            f"{crash['model_class']}, whatever the memory",
                            f"{crash['exception']} in {crash['raised_in']} (transformers {crash['transformers']}), "
                            f"with the given budget and with unbounded memory alike: the library's planner fails on "
                            f"the {crash['model_class']} class, not on your checkpoint or budget{upstream}.", evidence,
                            "Do not load this class with device_map=\"auto\"/\"balanced\": on one GPU pass "
                            "device_map={\"\": 0}; to shard, write the device_map dict yourself, keeping tied "
                            "modules on one device.")]
        if errors or offloads:
            first = (errors or offloads)[0]
            return [Finding("parallel.device_map", "warn", f"{first.scenario} would offload or fail{budget_note}",
                            first.error or f"cpu/disk entries: {list(first.offloaded)[:5]}", evidence,
                            "Give each GPU more memory in max_memory, add GPUs, or load in 4-bit.")]
        if collapsed:
            return [Finding("parallel.device_map", "info",
                            f"{collapsed[0].scenario} keeps the whole model on one GPU{budget_note}",
                            "The model fits on one GPU, so device_map does not shard it: hf_device_map becomes "
                            "{'': 0}, the Trainer does not see model parallelism, and with more than one visible GPU "
                            "it wraps the model in DataParallel (see parallel.trainer_wrap).", evidence,
                            "To really shard, cap max_memory below the model's size per GPU; to use both GPUs for data "
                            "parallelism, launch with torchrun (DDP).")]
        spanned = ", ".join(f"{p.scenario}: {len(p.gpus)} GPU(s)" for p in self.predictions)
        return [Finding("parallel.device_map", "pass", "No offload; placement as expected" + budget_note,
                        f"as loaded: {self.loaded.device_map or 'no device map (one device)'}; {spanned}", evidence)]

    def details(self):
        from workbench.display.nodes import Display, Table

        rows = [self.loaded.as_row(), *[p.as_row() for p in self.predictions]]
        return Display(Table.from_records(rows))


