"""The pre-flight: the checks a live Trainer can answer before its first step, with no model loaded again.

    diagnosis = Diagnosis(live_target(trainer, model), contract=...)
    ran = run_preflight(trainer, model, processing_class, diagnosis, report_folder)   # the parts it ran

Each check runs as the catalog's step of its notebook, a part of the callback's diagnosis (`report.diagnosis`: the
same `NotebookSession`, `FindingsRecorder` and answers rule as `workbench diagnose` and the panel); the catalog says
which (`Step.live`: True, or why the callback does not run it, which its report
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

from collections.abc import Mapping
from pathlib import Path

from workbench.catalog import notebook
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


def run_preflight(trainer, model, processing_class, diagnosis, folder: Path, *, loss_accumulation: bool = False,
                  data_samples: int | None = DATA_SAMPLES) -> list[str]:
    """Every pre-flight notebook's steps on the live Trainer, as parts of `diagnosis` (its target: `live_target`);
    the sidecars are written into `folder`. Returns the names of the parts run."""
    from workbench.model.setups import PreparedModel
    from workbench.probes.train.configuration import launch_of
    from workbench.report.diagnosis import plan_part

    launch = launch_of(trainer)  # first: the checks below build TrainingArguments, which reset what it reads
    target = diagnosis.target
    saved_files = _saved_files_part(source_folder(model), target)
    diagnosis.add(saved_files)
    diagnosis.run_in_process(folder, [saved_files])
    done = [saved_files.name]
    with untouched_run(trainer, model):
        batch_file = _first_batch_file(trainer, folder)
        if batch_file is not None:
            target.params["forward_inputs"] = str(batch_file)
        prepared = PreparedModel(model, processing_class or getattr(trainer, "processing_class", None), SETUP,
                                 f"the model of your {type(trainer).__name__ if trainer is not None else 'Trainer'}, "
                                 "live", trainer=trainer, launch=launch)
        live = {"seed": {"prepared": prepared}, "live_model": model}
        sharded = runs_sharded(trainer)

        def part(name: str, held_back: dict[str, str] | None = None, opted_in: tuple[str, ...] = ()):
            return diagnosis.add(plan_part(target, name, withheld=_withheld(name, sharded, held_back, opted_in)))

        data = part("07_data_path")
        diagnosis.run_in_process(folder, [data], replaced={"data_path": lambda *_a, **_k: live_data_path(
            trainer, processing_class, data_samples)}, **live)
        islands = part("01_dtype_distribution")
        diagnosis.run_in_process(folder, [islands], **live)
        # info: tensors off the compute dtype on purpose (kept so by the class, not reaching the activations)
        mixed = any(f.id == "dtype.fp32_islands" and f.verdict in ("warn", "fail") for f in diagnosis.findings)
        forward = part("04_forward_checks", held_back={} if mixed else {"forward": FORWARD_MATRIX_OFF})
        diagnosis.run_in_process(folder, [forward], **live)
        step = part("09_training_step", opted_in=("loss_accumulation",) if loss_accumulation else ())
        diagnosis.run_in_process(folder, [step], **live)
        done += [data.name, islands.name, forward.name, step.name]
    return done


def live_target(trainer, model):
    """The diagnosis' target for a live Trainer: the folder its model was loaded from (else the output_dir), the
    GPUs its process sees, the quantization its model carries; the set-up is the user's own."""
    from workbench.model.target import Target

    source = source_folder(model)
    output_dir = Path(trainer.args.output_dir if trainer is not None else ".").resolve()
    return Target(checkpoint=str(source or output_dir), model_dir=source or output_dir, quant=quant_of(model),
                  gpus=max(1, int(getattr(trainer.args, "_n_gpu", 1) or 1)) if trainer is not None else 1,
                  setup=SETUP, params={})


def _withheld(name: str, sharded: str | None, held_back: dict[str, str] | None, opted_in: tuple[str, ...]):
    """The steps of notebook `name` the callback does not run, each with why: the step's own `live` reason (unless
    opted in), a step this run does not need (`held_back`), or a step on the model of one rank of a sharded run."""
    from workbench.report.diagnosis import DIAGNOSE_A_SAVE, Withheld

    withheld = {}
    for step in notebook(name).steps:
        why = (held_back or {}).get(step.name) or (None if step.live is True or step.name in opted_in else step.live)
        if why:
            withheld[step.name] = Withheld("Not run by the callback", why, DIAGNOSE_A_SAVE)
        elif sharded and "prepared" in step.args:
            withheld[step.name] = Withheld("Not run on one rank of a sharded model", sharded, DIAGNOSE_A_SAVE)
    return withheld


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


def _saved_files_part(source: Path | None, live):
    """Notebook 00 on the folder the model was loaded from; every check a skip when it was built in memory or that
    folder cannot be read as a checkpoint."""
    from workbench.errors import UsageError
    from workbench.model.target import resolve_target
    from workbench.report.diagnosis import Withheld, plan_part

    name = "00_saved_files"
    why = ("the model does not name a local folder it was loaded from (config._name_or_path): there are no saved "
           "files to read")
    if source is not None:
        try:
            target = resolve_target(str(source))
            target.require_model()
        except UsageError as exc:
            why = f"the folder the model was loaded from cannot be read as a checkpoint: {exc}"
        else:
            return plan_part(target, name, part_target=target)
    return plan_part(live, name, withheld={s.name: Withheld("No saved files to read", why) for s in notebook(name).steps})


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
