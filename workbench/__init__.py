"""Diagnostic workbench for fine-tuning Hugging Face models: loaders, probes, findings, reports.

The curated surface below is what notebooks and the README use.
"""

from workbench.census import DtypeCensus, dtype_census, predicted_quantized_census
from workbench.checkpoint import inspect_checkpoint, static_census
from workbench.components import ComponentClassifier
from workbench.demo import build_demo, build_demo_recipes, demo_arguments
from workbench.distributed_report import DistributedReport, distributed_report
from workbench.dtype_report import (checkpoint_report, fp32_island_report, loaded_census_report,
                                    quantized_census_report, with_loaded_row)
from workbench.errors import UsageError
from workbench.evaluation import evaluate_recipes
from workbench.findings import Finding
from workbench.grad_flow import grad_flow_report
from workbench.inputs import load_vlm_parts, vlm_inputs
from workbench.islands import fp32_islands
from workbench.lineage import adapter_lineage_report
from workbench.mp_buffers import mixed_precision_buffer_report
from workbench.panel import Panel, panel
from workbench.tracer import DtypeTracer
from workbench.params import load_params
from workbench.parallel_report import device_map_report, trainer_wrap_report
from workbench.placement import placement_report
from workbench.recipes import recipes_for
from workbench.peft_report import peft_attribute_report, peft_layer_status_report, with_setup_attributes
from workbench.recorder import Failed, FindingsRecorder
from workbench.runtime import quiet_and_offline
from workbench.safetensors_header import read_header
from workbench.scenarios import forward_scenarios_report
from workbench.setups import PreparedModel, prepare_model
from workbench.target import Target, resolve_target

__all__ = [
    "ComponentClassifier",
    "DistributedReport",
    "DtypeCensus",
    "DtypeTracer",
    "Failed",
    "Finding",
    "FindingsRecorder",
    "Panel",
    "PreparedModel",
    "Target",
    "UsageError",
    "adapter_lineage_report",
    "build_demo",
    "build_demo_recipes",
    "checkpoint_report",
    "demo_arguments",
    "device_map_report",
    "distributed_report",
    "dtype_census",
    "evaluate_recipes",
    "forward_scenarios_report",
    "fp32_island_report",
    "fp32_islands",
    "grad_flow_report",
    "inspect_checkpoint",
    "load_params",
    "load_vlm_parts",
    "loaded_census_report",
    "mixed_precision_buffer_report",
    "panel",
    "peft_attribute_report",
    "peft_layer_status_report",
    "placement_report",
    "predicted_quantized_census",
    "prepare_model",
    "quantized_census_report",
    "quiet_and_offline",
    "read_header",
    "recipes_for",
    "resolve_target",
    "static_census",
    "trainer_wrap_report",
    "vlm_inputs",
    "with_loaded_row",
    "with_setup_attributes",
]
