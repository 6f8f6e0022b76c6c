"""The pre-flight: the checks a live Trainer can answer before its first step, with no model loaded again.

    runs = run_preflight(trainer, model, processing_class, report_folder)   # one NotebookRun per catalog notebook

Each check runs as the catalog's step of its notebook, through a `NotebookSession` and a `FindingsRecorder`, as
the panel runs them; the catalog says which (`Step.live`: True, or why the callback does not run it, which its report
then says as a `skip` on the step's checks — a check is never silently absent): notebook 00 on the folder the model was loaded from (when it is a local folder), the data
path (07) read from your Trainer's own dataloader and collator, fp32 islands (01), one `grad.flow` step (04) on a
row of the first batch your collator builds, the forward matrix (04) when fp32 islands finds tensors off the compute
dtype, and the training-step checks (09) from your Trainer's own arguments and its launch (`RunLaunch`: processes,
mixed precision, FSDP, read from its accelerator before anything else), which decide what applies to this run: DDP's
checkpointing hazard in one process is information, fp16's headroom is not read without fp16. The shared
model is the live one: steps that change it run under `guard.restored`, and the whole pre-flight under
`untouched_run` (random streams, buffer values, the accelerator's loaders), so training goes on as without it.

`train.loss_accumulation` runs the real Trainer twice on k micro-batches (two short trainings): it is opt-in
(`WorkbenchCallback(loss_accumulation=True)`), else a `skip` that says so.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from workbench.catalog import notebook
from workbench.findings import Finding
from workbench.integrations.live_trainer import (
    first_batch,
    quant_of,
    runs_sharded,
    source_folder,
    tensors_only,
    tokenizer_of,
    untouched_run,
)

IGNORE_INDEX = -100  # the label the loss skips (torch cross_entropy's ignore_index, the Trainer's collators)
SETUP = "your Trainer"  # the set-up name the live target carries: the model is the one your script built
DATA_SAMPLES = 20000  # rows of train_dataset the data path reads at most (parameters/defaults.yaml's example)
FORWARD_MATRIX_OFF = ("the forward matrix (train/eval, autocast on/off, adapters off) looks for the dtype breaks that "
                      "tensors off the compute dtype make; dtype.fp32_islands found none that is not on purpose, and "
                      "without one the matrix would repeat grad.flow's forward a dozen times")


@dataclasses.dataclass
class NotebookRun:
    """One catalog notebook's steps as the callback ran them: its recorder (the findings) and its results."""

    name: str
    recorder: Any
    results: list[tuple[str, Any]]
    seconds: float

    @property
    def findings(self) -> list[Finding]:
        return list(self.recorder.findings)


def run_preflight(trainer, model, processing_class, folder: Path, *, loss_accumulation: bool = False,
                  data_samples: int | None = DATA_SAMPLES) -> list[NotebookRun]:
    """Every pre-flight notebook's steps on the live Trainer; the sidecars are written into `folder`."""
    from workbench.model.setups import PreparedModel
    from workbench.model.target import Target
    from workbench.probes.train.configuration import launch_of

    launch = launch_of(trainer)  # first: the checks below build TrainingArguments, which reset what it reads
    source = source_folder(model)
    runs = [_saved_files(source, folder)]
    output_dir = Path(trainer.args.output_dir if trainer is not None else folder).resolve()
    with untouched_run(trainer, model):
        batch_file = _first_batch_file(trainer, folder)
        prepared = PreparedModel(model, processing_class or getattr(trainer, "processing_class", None), SETUP,
                                 f"the model of your {type(trainer).__name__ if trainer is not None else 'Trainer'}, "
                                 "live", trainer=trainer, launch=launch)
        target = Target(checkpoint=str(source or output_dir), model_dir=source or output_dir, quant=quant_of(model),
                        gpus=max(1, int(getattr(trainer.args, "_n_gpu", 1) or 1)) if trainer is not None else 1,
                        setup=SETUP, params={"forward_inputs": str(batch_file)} if batch_file else {})
        seed = {"prepared": prepared}
        runs.append(_data_path(trainer, processing_class, target, seed, folder, data_samples))
        sharded = runs_sharded(trainer)
        islands = _session(folder, "01_dtype_distribution", target, seed, skip_model=sharded)
        runs.append(islands)
        # info: tensors off the compute dtype on purpose (kept so by the class, not reaching the activations)
        mixed = any(f.id == "dtype.fp32_islands" and f.verdict in ("warn", "fail") for f in islands.findings)
        runs.append(_session(folder, "04_forward_checks", target, seed, skip_model=sharded,
                             held_back={} if mixed else {"forward": FORWARD_MATRIX_OFF}))
        runs.append(_session(folder, "09_training_step", target, seed, skip_model=sharded,
                             opted_in=("loss_accumulation",) if loss_accumulation else ()))
    return runs


def _first_batch_file(trainer, folder: Path) -> Path | None:
    """One row of the first batch your collator builds, saved for the model checks (`forward_inputs`): the first row
    that supervises a token (a row whose labels are all -100 has a NaN loss and no gradient anywhere, which says
    nothing about the model; data.labels names it). One row: which tensors get a gradient, which scenario raises and
    which dtype flows where do not depend on the batch size, and each check runs several forwards. A batch whose
    tensors do not share one batch dimension (a VLM's flattened image patches) is kept whole; one with no supervised
    row, or the batch of a trl trainer whose batches are pairs or prompts (DPO, GRPO, …: no input of the model's
    forward), is not used, and the model checks use the workbench's own batch."""
    if trainer is None or getattr(trainer, "train_dataset", None) is None:
        return None
    from safetensors.torch import save_file

    from workbench.errors import NotApplicable
    from workbench.probes.data.batches import refuse_unsupervised_batches

    try:
        refuse_unsupervised_batches(trainer)  # trl's pairs and prompts are no inputs of the model's forward
    except NotApplicable:
        return None
    batch = first_batch(trainer)
    if not isinstance(batch, Mapping):
        return None
    batch = tensors_only(batch)
    labels = batch.get("labels")
    sizes = {v.shape[0] for v in batch.values() if v.dim()}
    if labels is None or labels.dim() == 0:  # no labels to read: every row counts (one batch size, else whole)
        supervised = list(range(next(iter(sizes)))) if len(sizes) == 1 else [0]
    else:
        supervised = [i for i in range(labels.shape[0]) if bool((labels[i] != IGNORE_INDEX).any())]
    if not supervised:
        return None
    rows = {v.shape[0] for v in batch.values() if v.dim()}
    if len(rows) == 1:
        row = supervised[0]
        batch = {k: v[row:row + 1].contiguous() if v.dim() else v for k, v in batch.items()}
    path = folder / "first_batch.safetensors"
    save_file(batch, str(path))
    return path


def _session(folder: Path, name: str, target, seed: dict[str, Any], *, skip_model: str | None = None,
             before=None, held_back: dict[str, str] | None = None, opted_in: tuple[str, ...] = ()) -> NotebookRun:
    """Run the live steps of the catalog notebook `name` (`Step.live` True, and those `opted_in`) in one session whose
    results start from `seed`. Every check of a step it does not run is answered `skip` with the reason: the step's
    own `live` text, or `held_back`'s (a step this run does not need)."""
    from workbench.model.guard import restored
    from workbench.notebook import NOTEBOOK_PARAMETERS, NotebookSession
    from workbench.recorder import FindingsRecorder

    start = time.perf_counter()
    spec = notebook(name)
    recorder = FindingsRecorder(folder / f"findings.{name}.json", notebook=name, autosave=False)
    session = NotebookSession(spec, target, recorder, {**NOTEBOOK_PARAMETERS, **target.options()})
    session.results.update(seed)
    shown: list[tuple[str, Any]] = list(before(session)) if before is not None else []
    held_back = held_back or {}
    for step in spec.steps:
        if step.name in session.results:  # seeded (the live model) or read by `before`
            continue
        why = held_back.get(step.name) or (None if step.live is True or step.name in opted_in else step.live)
        if why or (skip_model and "prepared" in step.args):
            recorder.add(*(Finding(c, "skip", "Not run by the callback" if why else
                                   "Not run on one rank of a sharded model", why or skip_model, {"step": step.name},
                                   "Run `workbench diagnose` on a checkpoint your run saves.")
                           for c in step.reports), step=step.name)
            continue
        model = getattr(seed.get("prepared"), "model", None)
        guard = restored(model) if model is not None and not step.mutates and "prepared" in step.args else None
        if guard is None:
            result = session.run(step.name)
        else:  # a step the catalog does not mark as changing the model still runs on the live one: guarded too
            with guard:
                result = session.run(step.name)
        shown.append((step.label, result))
    recorder.save()
    return NotebookRun(name, recorder, shown, time.perf_counter() - start)


def _saved_files(source: Path | None, folder: Path) -> NotebookRun:
    """Notebook 00 on the folder the model was loaded from; every check a skip when it was built in memory."""
    spec = notebook("00_saved_files")
    if source is None:
        return _skipped(folder, spec, "the model does not name a local folder it was loaded from "
                                      "(config._name_or_path): there are no saved files to read")
    from workbench.errors import UsageError
    from workbench.model.target import resolve_target

    try:
        target = resolve_target(str(source))
        target.require_model()
    except UsageError as exc:
        return _skipped(folder, spec, f"the folder the model was loaded from cannot be read as a checkpoint: {exc}")
    return _session(folder, spec.name, target, {})


def _skipped(folder: Path, spec, why: str) -> NotebookRun:
    from workbench.recorder import FindingsRecorder

    recorder = FindingsRecorder(folder / f"findings.{spec.name}.json", notebook=spec.name, autosave=False)
    recorder.add(*(Finding(c, "skip", "No saved files to read", why, {}, "") for c in spec.checks))
    recorder.save()
    return NotebookRun(spec.name, recorder, [], 0.0)


def live_data_path(trainer, processing_class, samples: int | None):
    """notebook 07's `data_path` for the live Trainer: its train_dataset through its own dataloader and collator."""
    from workbench.errors import NotApplicable
    from workbench.probes.data.batches import DataBatches, refuse_unsupervised_batches, template_markers

    if trainer is None or getattr(trainer, "train_dataset", None) is None:
        raise NotApplicable("the callback found no Trainer with a train_dataset to read batches from",
                            "no train_dataset")
    refuse_unsupervised_batches(trainer)
    tokenizer = tokenizer_of(trainer, processing_class)
    if tokenizer is None:
        raise NotApplicable("your Trainer has no processing_class and its collator no tokenizer: the data path "
                            "needs the tokenizer the run pads with (pass processing_class=tokenizer)", "no tokenizer")
    marker, stops = template_markers(tokenizer)
    args = trainer.args
    return DataBatches(None, "trainer", tokenizer, getattr(args, "max_length", None),
                       getattr(args, "truncation_mode", "keep_start"), trainer=trainer, samples=samples,
                       batch_size=args.per_device_train_batch_size, marker=marker, stop_ids=frozenset(stops))


def _data_path(trainer, processing_class, target, seed, folder: Path, samples: int | None) -> NotebookRun:
    def read_batches(session) -> list[tuple[str, Any]]:
        step = notebook("07_data_path").step("data_path")
        result = session.recorder.run(live_data_path, trainer, processing_class, samples, step=step.name)
        session.results[step.name] = result
        return [(step.label, result)]

    return _session(folder, "07_data_path", target, seed, before=read_batches)
