"""Writes the committed notebooks (no outputs). The notebooks are thin: parameters, calls, displays."""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

PARAMETERS = '''checkpoint = ""       # checkpoint or adapter folder; empty: the bundled demo's stage-2 adapter
adapter = ""          # a PEFT adapter to apply on checkpoint
base = ""             # override the base recorded in adapter_config.json
quant = "none"        # none | 4bit | 8bit
gpus = 1              # GPUs the training process sees
setup = "plain"       # plain | qlora | sft | module:function
device_map = ""
max_memory = ""
dtype = "auto"
params_json = "{}"    # contents of the --params file
trust_remote_code = False
allow_pickle = False
distributed = 0       # ranks for the torchrun probes (notebook 06); 0: not asked
findings_path = "findings.{name}.json"'''

OPEN_TARGET = '''import workbench as wb

wb.quiet_and_offline()
if not checkpoint:  # interactive use without a checkpoint: the demo, as `make diagnose` runs it
    demo = wb.demo_arguments()
    checkpoint, quant, setup, gpus, params_json = demo.checkpoint, demo.quant, demo.setup, demo.gpus, demo.params_json
rec = wb.FindingsRecorder(findings_path, notebook="{name}")
target = wb.resolve_target(checkpoint, adapter=adapter, base=base, quant=quant, gpus=gpus, setup=setup,
                           device_map=device_map, max_memory=max_memory, dtype=dtype, params_json=params_json,
                           trust_remote_code=trust_remote_code, allow_pickle=allow_pickle)
target'''


def notebook(name: str, title: str, checks: list[str], cells: list) -> nbformat.NotebookNode:
    nb = new_notebook()
    params = new_code_cell(PARAMETERS.replace("{name}", name))
    params.metadata["tags"] = ["parameters"]
    nb.cells = [new_markdown_cell(f"# {title}\n\nChecks: " + ", ".join(f"`{c}`" for c in checks)), params,
                new_code_cell(OPEN_TARGET.replace("{name}", name)), *cells,
                new_markdown_cell("## Findings"), new_code_cell("rec")]
    nb.metadata["kernelspec"] = {"name": "workbench", "display_name": "Python (workbench)", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    nb.metadata["workbench"] = {"checks": checks}
    for i, cell in enumerate(nb.cells):  # stable ids: regenerating an unchanged notebook changes no byte
        cell.id = f"{name[:2]}-{i:02d}"
    return nb


NOTEBOOKS = {
    "01_dtype_distribution": notebook(
        "01_dtype_distribution", "01 · Dtype distribution",
        ["checkpoint.integrity", "dtype.census", "dtype.quantized_census", "dtype.fp32_islands"],
        [
            new_markdown_cell("## Checkpoint files and their census from the safetensors headers\n"
                              "No weight is loaded: dtypes, shapes and bytes per component come from the headers."),
            new_code_cell("static = rec.run(wb.checkpoint_report, target)\nstatic"),
            new_markdown_cell("## Under 4-bit and 8-bit\nPredicted on the meta device by transformers' own "
                              "bitsandbytes quantizer; verified by a real load (each freed before the next) when the "
                              "checkpoint is small."),
            new_code_cell("quantized = rec.run(wb.quantized_census_report, target, None, static or None)"),
            new_markdown_cell("## The model as the set-up prepares it\n"
                              "Parameters **and** buffers, per component found from the model's structure."),
            new_code_cell("prepared = rec.run(wb.prepare_model, target)\n"
                          "census = rec.run(wb.loaded_census_report, prepared, target, static or None)\n"
                          "display(prepared)\ncensus"),
            new_markdown_cell("### All scenarios side by side (the seeds' comparison table)"),
            new_code_cell("rec.run(wb.with_loaded_row, quantized, census)"),
            new_markdown_cell("## fp32 islands\nFloating tensors whose dtype differs from the compute dtype, "
                              "frozen modules and buffers first; intentional ones are marked."),
            new_code_cell("islands = rec.run(wb.fp32_island_report, prepared, target)\nislands"),
        ]),
    "02_dataparallel": notebook(
        "02_dataparallel", "02 · DataParallel detection",
        ["parallel.trainer_wrap", "parallel.device_map"],
        [
            new_markdown_cell("## Will the Trainer wrap the model in DataParallel?\n"
                              "Asked of the installed `transformers.Trainer` itself, with the GPU count the training "
                              "process would see; what had to be simulated on this machine is listed. The replica "
                              "check runs a forward in a worker thread started under autocast, as DataParallel does."),
            new_code_cell("prepared = rec.run(wb.prepare_model, target)\n"
                          "wrap = rec.run(wb.trainer_wrap_report, prepared, target)\nwrap"),
            new_markdown_cell("## Device maps\nThe loaded model's `hf_device_map`, and what `device_map=\"auto\"` / "
                              "`\"balanced\"` would give on the GPUs, predicted on the meta device."),
            new_code_cell("maps = rec.run(wb.device_map_report, prepared, target)\nmaps"),
        ]),
    "03_peft_attributes": notebook(
        "03_peft_attributes", "03 · PEFT attribute preservation",
        ["peft.attributes", "peft.layer_status"],
        [
            new_markdown_cell("## What the Trainer reads, after each wrapping step\n"
                              "Raw model → k-bit preparation → PEFT → Trainer (→ your set-up). `↪ forwarded` marks "
                              "values reached only through `__getattr__`."),
            new_code_cell("attributes = rec.run(wb.peft_attribute_report, target)  # loads, walks the chain, frees\n"
                          "prepared = rec.run(wb.prepare_model, target)\n"
                          "attributes = rec.run(wb.with_setup_attributes, attributes, prepared, target)\nattributes"),
            new_markdown_cell("## Adapter layers, as PEFT reports them\n`get_model_status` / `get_layer_status`, "
                              "plus what PEFT does not report: LoRA A/B dtypes against the base layer's compute "
                              "dtype."),
            new_code_cell("layers = rec.run(wb.peft_layer_status_report, prepared)\nlayers"),
        ]),
    "04_forward_checks": notebook(
        "04_forward_checks", "04 · Forward, dtype flow and gradients",
        ["grad.flow", "forward.mixed_precision_buffers", "forward.scenarios", "forward.dtype_flow"],
        [
            new_markdown_cell("## One training step: which trainable tensors get no gradient\n"
                              "Runs first: bitsandbytes 0.50.2 repacks 4-bit weights on the CPU after an "
                              "inference-mode forward, and a training step after that fails on the CPU only."),
            new_code_cell("prepared = rec.run(wb.prepare_model, target)\n"
                          "grads = rec.run(wb.grad_flow_report, prepared, target)\ngrads"),
            new_markdown_cell("## FSDP-style mixed precision: parameters cast, buffers not"),
            new_code_cell("buffers = rec.run(wb.mixed_precision_buffer_report, prepared, target)\nbuffers"),
            new_markdown_cell("## The forward matrix and the dtype flow\n"
                              "eval / train × no autocast / autocast / a replica thread started under autocast "
                              "(× adapters on / off); the first failing cell is traced module by module."),
            new_code_cell("forward = rec.run(wb.forward_scenarios_report, prepared, target)\nforward"),
        ]),
    "05_evaluation": notebook(
        "05_evaluation", "05 · Evaluation across recipes",
        ["eval.metrics", "eval.memory", "adapter.base_model", "placement.offload"],
        [
            new_markdown_cell("## Recipes\nFrom the recipes file (`--recipes`, or `recipes:` in `--params`), else the "
                              "checkpoint itself; the original base is evaluated as a reference row."),
            new_code_cell("recipes = rec.run(wb.recipes_for, target, target.params.get(\"recipes\"))\nrecipes"),
            new_markdown_cell("## Evaluation, one recipe at a time\n"
                              "Memory is freed before each recipe; each adapter is matched to the base it was trained "
                              "on (`adapter.base_model`); where the base landed is read before the adapter goes on "
                              "(`placement.offload`); then greedy answers are parsed and scored, and the reference "
                              "answers are scored teacher-forced."),
            new_code_cell("evaluation = rec.run(wb.evaluate_recipes, recipes, target)\nevaluation"),
        ]),
    "06_distributed": notebook(
        "06_distributed", "06 · Distributed: DDP and FSDP2 under torchrun",
        ["distributed.ddp", "distributed.fsdp"],
        [
            new_markdown_cell("## The set-up on every rank, under `torchrun`\n"
                              "`--distributed N` launches N ranks (gloo on CPU, nccl with a GPU per rank) on a free "
                              "loopback port; each rank prepares the model with your set-up, wraps it in DDP and then "
                              "in FSDP2 `fully_shard` with `MixedPrecisionPolicy(param_dtype=compute dtype)`, and runs "
                              "training steps. Per-rank results side by side; a crashed or hung rank is an error "
                              "with its traceback."),
            new_code_cell("dist = rec.run(wb.distributed_report, target, ranks=distributed,\n"
                          "                  ddp_find_unused_parameters=target.params.get(\"ddp_find_unused_parameters\"))\n"
                          "dist"),
        ]),
}


def panel_notebook() -> nbformat.NotebookNode:
    """The interactive entry point `make lab` opens first: no parameters, one widget cell (not run by diagnose)."""
    nb = new_notebook()
    nb.cells = [
        new_markdown_cell("# Workbench panel\n\nRun the cell below (Shift+Enter). It opens on the bundled demo: "
                          "press **Run probes**, or type another checkpoint folder first. The numbered notebooks "
                          "beside this one are what `make diagnose` runs into a report."),
        new_code_cell("import workbench as wb\n\nwb.quiet_and_offline()\nwb.panel()"),
    ]
    nb.metadata["kernelspec"] = {"name": "workbench", "display_name": "Python (workbench)", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    for i, cell in enumerate(nb.cells):
        cell.id = f"panel-{i:02d}"
    return nb


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    nbformat.write(panel_notebook(), out / "panel.ipynb")
    for name, nb in NOTEBOOKS.items():
        nbformat.validate(nb)
        nbformat.write(nb, out / f"{name}.ipynb")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "notebooks")
