"""Diagnostic workbench for fine-tuning Hugging Face models: loaders, probes, findings, reports.

The curated surface below is what notebooks, scripts and the README use. It is lazy (PEP 562): `import
workbench` imports neither torch nor transformers; a name is imported from its module on first use.

    import workbench as wb
    nb = wb.open_notebook("01_dtype_distribution", checkpoint="path/to/ckpt")
    target = wb.resolve_target("path/to/ckpt"); prepared = wb.prepare_model(target)
    wb.loaded_census_probe(prepared, target)
"""

from __future__ import annotations

import importlib
from typing import Any

_SURFACE: dict[str, str] = {
    # the causes of an error text (a callable package: `wb.explain(text)`)
    "explain": "workbench.explain",
    # the IPython magic (`%load_ext workbench`: %workbench explain)
    "load_ipython_extension": "workbench.interactive.magic",
    # the catalog and the notebook contract
    "CHECKS": "workbench.catalog",
    "NOTEBOOKS": "workbench.catalog",
    "open_notebook": "workbench.notebook",
    # what is diagnosed, and the model as the set-up prepares it
    "Target": "workbench.model.target",
    "resolve_target": "workbench.model.target",
    "PreparedModel": "workbench.model.setups",
    "prepare_model": "workbench.model.setups",
    "ComponentClassifier": "workbench.model.components",
    "inspect_checkpoint": "workbench.model.checkpoint",
    "static_census": "workbench.model.checkpoint",
    "read_header": "workbench.model.safetensors_header",
    "load_vlm_parts": "workbench.model.inputs",
    "vlm_inputs": "workbench.model.inputs",
    "load_params": "workbench.params",
    # probes, by area
    "checkpoint_probe": "workbench.probes.dtype.headers",
    "loaded_census_probe": "workbench.probes.dtype.probes",
    "quantized_census_probe": "workbench.probes.dtype.probes",
    "fp32_island_probe": "workbench.probes.dtype.probes",
    "with_loaded_row": "workbench.probes.dtype.probes",
    "DtypeCensus": "workbench.probes.dtype.census",
    "dtype_census": "workbench.probes.dtype.census",
    "predicted_quantized_census": "workbench.probes.dtype.census",
    "fp32_islands": "workbench.probes.dtype.islands",
    "DtypeTracer": "workbench.model.tracer",
    "mixed_precision_buffer_probe": "workbench.probes.forward.mixed_precision_buffers",
    "trainer_wrap_probe": "workbench.probes.parallel.probes",
    "device_map_probe": "workbench.probes.parallel.probes",
    "peft_attribute_probe": "workbench.probes.peft.probes",
    "peft_layer_status_probe": "workbench.probes.peft.probes",
    "with_setup_attributes": "workbench.probes.peft.probes",
    "grad_flow_probe": "workbench.probes.forward.grad_flow",
    "forward_scenarios_probe": "workbench.probes.forward.scenarios",
    "recipes_for": "workbench.probes.evaluation.recipes",
    "evaluate_recipes": "workbench.probes.evaluation.evaluate",
    "adapter_lineage_probe": "workbench.probes.evaluation.lineage",
    "placement_probe": "workbench.probes.evaluation.placement",
    "DistributedResult": "workbench.distributed.probes",
    "distributed_probe": "workbench.distributed.probes",
    # findings and running probes
    "Finding": "workbench.findings",
    "Failed": "workbench.recorder",
    "FindingsRecorder": "workbench.recorder",
    "UsageError": "workbench.errors",
    "NotApplicable": "workbench.errors",
    "quiet_and_offline": "workbench.runtime",
    # the demo and interactive use
    "build_demo": "workbench.demo.build",
    "build_demo_recipes": "workbench.demo.build",
    "demo_arguments": "workbench.demo.build",
    "Panel": "workbench.interactive.panel",
    "panel": "workbench.interactive.panel",
}

__all__ = sorted(_SURFACE)


def __getattr__(name: str) -> Any:
    module = _SURFACE.get(name)
    if module is None:
        raise AttributeError(f"module 'workbench' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
