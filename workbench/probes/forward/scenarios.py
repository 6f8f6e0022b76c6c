"""Notebook 04's forward matrix (`forward.scenarios`) and the traced break (`forward.dtype_flow`).

Cells: eval / train mode x (no autocast | autocast in the main thread | a replica thread started under autocast)
x (the prepared model | its base with adapters disabled, when PEFT is involved). Each cell records pass/fail, the
exception, output dtype and shape, NaN/inf. Only distinct forwards run: the eval / no-autocast cell is the forward
that accepted the batch (`model.batch`), read from it, and so is a cell another probe already ran on that batch
(grad.flow's training step is the train / autocast forward, forward.mixed_precision_buffers' traced forward the
train / no-autocast one where its cast changed nothing); a context that is no autocast for this
model and this torch takes its mode's no-autocast result (`same_as`) — the replica thread, where a thread started
under autocast runs without it (asked of torch in such a thread: its state is per thread, how DataParallel's
replicas lose it), and autocast itself for a compute dtype it does not cast to (fp32). The train / no-autocast cell
runs under the dtype tracer; a cell that fails before it is run again under the tracer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from typing import Any

import torch
from torch import nn

from workbench.display.nodes import Bullets, Details, Display, Heading, Paragraph, Table
from workbench.display.nodes import Cell as ShadedCell
from workbench.display.result import ProbeResult
from workbench.findings import Finding
from workbench.model.batch import accepted_batch
from workbench.model.bnb_cpu_layout import held_layout_note, keep_training_layout
from workbench.model.dtypes import compute_dtype_of
from workbench.model.finiteness import all_finite
from workbench.model.forward import autocast_reaches_a_new_thread, device_type_of, logits_of, run_forward
from workbench.model.memory import free_memory
from workbench.model.tracer import DtypeTracer
from workbench.probes.forward.library_dtype_break import library_break_fix, library_dtype_break

CONTEXTS = ("no autocast", "autocast", "replica thread under autocast")
DTYPE_ERROR = re.compile(r"dtype|BFloat16|Half|Float|Double", re.I)


@dataclasses.dataclass
class Cell:
    variant: str
    mode: str
    context: str
    ok: bool
    error: str | None = None
    dtype: str | None = None
    shape: tuple | None = None
    nonfinite: bool = False
    same_as: str | None = None  # the context whose forward this cell is (not run again), and why

    @property
    def label(self) -> str:
        return f"{self.variant} / {self.mode} / {self.context}"

    def as_row(self) -> dict[str, Any]:
        return {"variant": self.variant, "mode": self.mode, "context": self.context,
                "result": "pass" if self.ok and not self.nonfinite else "fail",
                "output": f"{self.dtype} {list(self.shape)}" if self.dtype else "",
                "NaN/inf": self.nonfinite, "error": self.error or "", "same forward as": self.same_as or ""}


def _variants(model: nn.Module):
    yield "as prepared", contextlib.nullcontext()
    if hasattr(model, "disable_adapter") and hasattr(model, "peft_config"):
        yield "base (adapters disabled)", model.disable_adapter()


def _describe(exc: BaseException) -> str:
    if isinstance(exc, torch.OutOfMemoryError):
        return f"out of memory: {str(exc)[:200]}"
    return f"{type(exc).__name__}: {str(exc)[:300]}"


def same_forward_as(context: str, device_type: str, compute_dtype: torch.dtype) -> tuple[str, str] | None:
    """(the context whose forward `context` runs for this model and this torch, why); None where it is its own."""
    if context == "no autocast":
        return None
    if compute_dtype not in (torch.bfloat16, torch.float16):
        return "no autocast", f"autocast does not cast to {str(compute_dtype).removeprefix('torch.')}: no context"
    if context == "replica thread under autocast" and not autocast_reaches_a_new_thread(device_type, compute_dtype):
        return "no autocast", ("a thread started under autocast runs without it (torch keeps autocast's state per "
                               "thread; read in such a thread)")
    return None


TRACED = ("as prepared", "train", "no autocast")  # the cell the dtype flow traces when no cell fails before it


def run_matrix(model: nn.Module, inputs: dict, compute_dtype: torch.dtype,
               ran_before: dict[tuple[str, str], tuple[tuple[str, tuple, bool], str, Any]] | None = None,
               ) -> tuple[list[Cell], DtypeTracer]:
    """The cells, and the dtype tracer of the TRACED cell's forward. `ran_before` (`AcceptedBatch.forwards`):
    forwards of the model as prepared on these inputs that ran already (the batch check's, other steps'), by (mode,
    context): ((logits dtype, shape, all finite), what ran it, the dtype tracer it ran under or None); each is its
    cell, not run again — the TRACED one only where it ran under a tracer, whose flow the dtype flow reads."""
    ran_before = ran_before or {}
    known = {("as prepared", mode, context): (summary, f"{by} ({mode}, {context}, these inputs)")
             for (mode, context), (summary, by, _tracer) in ran_before.items()}
    _, _, traced_before = ran_before.get(TRACED[1:], (None, None, None))  # TRACED's (mode, context)
    if traced_before is None:
        known.pop(TRACED, None)
    cells: list[Cell] = []
    was_training = model.training
    same = {c: same_forward_as(c, device_type_of(model), compute_dtype) for c in CONTEXTS}
    traced = traced_before or DtypeTracer(model)
    try:
        for variant, ctx in _variants(model):
            with ctx:
                for mode in ("eval", "train"):
                    model.train(mode == "train")
                    ran: dict[str, Cell] = {}
                    for context in CONTEXTS:
                        if same[context]:
                            base, why = same[context]
                            cells.append(dataclasses.replace(ran[base], context=context, same_as=f"{base} ({why})"))
                            continue
                        if (variant, mode, context) in known:
                            (dtype, shape, finite), by = known[(variant, mode, context)]
                            ran[context] = Cell(variant, mode, context, True, None, dtype, shape, not finite,
                                                same_as=by)
                            cells.append(ran[context])
                            continue
                        with traced if (variant, mode, context) == TRACED else contextlib.nullcontext():
                            out, exc = run_forward(model, inputs, context, compute_dtype)
                        if exc is not None:
                            cells.append(Cell(variant, mode, context, False, _describe(exc)))
                            if isinstance(exc, torch.OutOfMemoryError):
                                free_memory()
                        else:
                            logits = logits_of(out)
                            cells.append(Cell(variant, mode, context, True, None,
                                              str(logits.dtype).removeprefix("torch."), tuple(logits.shape),
                                              not all_finite(logits)))
                        ran[context] = cells[-1]
    finally:
        model.train(was_training)
    return cells, traced


def fix_for(diagnosis: dict[str, Any] | None) -> str:
    if not diagnosis:
        return "Run the forward under autocast with the compute dtype (TrainingArguments(bf16=True)), one process per GPU."
    producer, module = diagnosis.get("producer") or "", diagnosis["module"]
    if "norm" in producer.lower():
        return (f"Keep `{producer}` and `{module}` in the same dtype (cast the norm to the compute dtype, or the head "
                "to fp32), or run every forward under autocast — which DataParallel replicas and a Trainer that "
                "wrapped the model do not get: train with one process per GPU (torchrun) or _n_gpu=1.")
    return (f"Cast `{producer or module}` (its parameters and buffers) to {diagnosis['module_weight']}, or run the "
            "forward under autocast in every thread (no DataParallel).")


@dataclasses.dataclass(repr=False)
class ForwardResult(ProbeResult):
    cells: list[Cell]
    inputs_how: str
    compute_dtype: str
    traced_cell: str | None
    diagnosis: dict[str, Any] | None
    flow: list[dict[str, Any]]
    failing_module: str | None = None  # innermost module that raised in the traced cell
    layout_note: str | None = None  # set when bitsandbytes' CPU inference repack was held back for the diagnosis
    library_break: dict[str, Any] | None = None  # the traced dtype break is the library class's own doing

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame([c.as_row() for c in self.cells])

    def findings(self) -> list[Finding]:
        failed = [c for c in self.cells if not c.ok or c.nonfinite]
        out_of_memory = [c for c in failed if (c.error or "").startswith("out of memory")]
        if out_of_memory:
            return [Finding(i, "error", "The forward ran out of memory", out_of_memory[0].error or "",
                            {"cells": [c.as_row() for c in out_of_memory]},
                            "Memory was freed; diagnose with a smaller input, 4-bit, or more GPU memory.")
                    for i in ("forward.scenarios", "forward.dtype_flow")]
        evidence = {"inputs": self.inputs_how, "compute_dtype": self.compute_dtype,
                    "cells": [c.as_row() for c in self.cells]}
        if self.layout_note:
            evidence["bitsandbytes_cpu_layout"] = self.layout_note
        fix = fix_for(self.diagnosis)
        library = self.library_break
        if library:
            evidence["library_class"] = library
            fix = library_break_fix(library, self.compute_dtype)
        if failed:
            by_error: dict[str, list[str]] = {}
            for c in failed:
                by_error.setdefault(c.error or "NaN/inf in the output", []).append(c.label)
            passing = sorted({c.context for c in self.cells if c.ok and not c.nonfinite})
            where = (f" in transformers' own {library['class']}, not in your checkpoint" if library
                     else f", e.g. {failed[0].label}")
            scenarios = Finding("forward.scenarios", "fail",
                                f"{len(failed)} of {len(self.cells)} forward scenarios fail{where}",
                                (f"{library['how']} ({library['source']}, transformers {library['transformers']}). "
                                 if library else "")
                                + " ".join(f"{err} — in {len(labels)} cell(s): {', '.join(labels[:4])}"
                                         + ("…" if len(labels) > 4 else "") + "." for err, labels in by_error.items())
                                + (f" Passing contexts: {', '.join(passing)}." if passing else ""),
                                evidence, fix)
        else:
            scenarios = Finding("forward.scenarios", "pass", f"All {len(self.cells)} forward scenarios pass",
                                f"Inputs: {self.inputs_how}; outputs {self.cells[0].dtype if self.cells else '-'}.",
                                evidence)
        flow_evidence = {"traced": self.traced_cell, "diagnosis": self.diagnosis, "flow": self.flow,
                         **({"bitsandbytes_cpu_layout": self.layout_note} if self.layout_note else {})}
        traced_error = next((c.error for c in failed if c.label == self.traced_cell), None) or ""
        if library:
            flow_evidence["library_class"] = library
            flow = Finding("forward.dtype_flow", "fail",
                           f"transformers' {library['class']} (`{library['module']}`) breaks the "
                           f"{self.compute_dtype} forward",
                           f"Traced {self.traced_cell}: {library['how']} ({library['source']}, transformers "
                           f"{library['transformers']}); {traced_error}", flow_evidence, fix)
        elif self.diagnosis and self.diagnosis["raised"] and DTYPE_ERROR.search(traced_error):
            flow = Finding("forward.dtype_flow", "fail", self.diagnosis["summary"],
                           f"Traced {self.traced_cell}: `{self.diagnosis['module']}` receives "
                           f"{self.diagnosis['input_dtype']} against its {self.diagnosis['module_weight']} weight"
                           + (f"; the {self.diagnosis['input_dtype']} activation comes from "
                              f"`{self.diagnosis['producer']}`." if self.diagnosis.get("producer") else "."),
                           flow_evidence, fix)
        elif failed:
            where = f" in `{self.failing_module}`" if self.failing_module else ""
            flow = Finding("forward.dtype_flow", "warn", f"A scenario fails{where}, and not on a dtype mismatch",
                           f"{self.traced_cell}: {traced_error}", flow_evidence,
                           "Read the exception and the traced flow; this is not a dtype problem.")
        else:
            flow = Finding("forward.dtype_flow", "pass", "No forward breaks on a dtype mismatch",
                           "The traced forward ran to the end." + (
                               f" First module whose input dtype differs from its weight: "
                               f"{self.diagnosis['summary']} (handled by the module)." if self.diagnosis else ""),
                           flow_evidence)
        return [scenarios, flow]

    def details(self):
        grid = self.to_frame()
        table = grid.pivot_table(index=["variant", "mode"], columns="context", values="result", aggfunc="first")
        table = table[[c for c in CONTEXTS if c in table.columns]]
        colour = {"pass": "#c8e6c9", "fail": "#ffcdd2"}
        cells = [[f"{v} / {m}", *(ShadedCell(table.loc[(v, m), c], background=colour.get(table.loc[(v, m), c], "#fff"),
                                       align="center") for c in table.columns)] for v, m in table.index]
        flow = (Table.from_records(self.flow) if self.flow
                else Paragraph("No module with a weight was traced."))
        shared = {c.label: c.same_as for c in self.cells if c.same_as}
        return Display(Paragraph(f"Inputs: {self.inputs_how}"),
                       Table(["", *table.columns], cells, css_class="wb-grid", row_headers=True),
                       Bullets([f"{cell}: not run again, the same forward as {forward}"
                                for cell, forward in shared.items()]),
                       Heading(f"Dtype flow ({self.traced_cell or 'train / no autocast'})"), flow,
                       Details("all cells", Table.from_frame(grid)))


def forward_scenarios_probe(prepared, target) -> ForwardResult:
    model = prepared.model
    keep_training_layout(model)  # the eval cells must not repack 4-bit weights the train cells then run on
    compute = compute_dtype_of(model)
    batch = accepted_batch(model, target)  # a batch the model accepts, or BatchNotAccepted: an `error`
    inputs, how = batch.labeled, batch.how
    cells, tracer = run_matrix(model, inputs, compute, batch.forwards)
    failing = next((c for c in cells if not c.ok), None)
    chosen = failing or Cell(*TRACED, True)
    if (chosen.variant, chosen.mode, chosen.context) != TRACED:  # a cell before it failed: trace that forward
        was_training = model.training
        variants = dict(_variants(model))
        try:
            with variants.get(chosen.variant, contextlib.nullcontext()):
                model.train(chosen.mode == "train")
                with DtypeTracer(model) as tracer:
                    run_forward(model, inputs, chosen.context, compute)
        finally:
            model.train(was_training)
    failing_call = tracer.failing_call()
    library = (library_dtype_break(model, tracer, compute)
               if failing is not None and DTYPE_ERROR.search(failing.error or "") else None)
    return ForwardResult(cells, how, str(compute).removeprefix("torch."), chosen.label, tracer.diagnosis(),
                         tracer.flow(), failing_call.path if failing_call else None, held_layout_note(model), library)
