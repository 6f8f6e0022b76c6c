"""The probes of notebook 02 (DataParallel detection): `parallel.trainer_wrap` and `parallel.device_map`."""

from __future__ import annotations

import dataclasses
from typing import Any

import transformers

from workbench.display.nodes import Bullets, Display, Heading, Paragraph, Table
from workbench.display.result import ProbeResult
from workbench.findings import Finding
from workbench.model.batch import remember_forward, target_inputs
from workbench.model.components import unwrap_model
from workbench.model.dtypes import compute_dtype_of, off_compute_dtype
from workbench.model.loading import auto_config
from workbench.probes.parallel.device_map import (
    DeviceMapResult,
    default_max_memory,
    loaded_device_map,
    predict_device_map,
)
from workbench.probes.parallel.release_rules import release_line_for, verdicts_across_releases
from workbench.probes.parallel.replica import ForwardOutcome, replica_forward_check
from workbench.probes.parallel.trainer_wrap import (
    DEFAULT_DATASET_SIZE,
    DEFAULT_PER_DEVICE_BATCH,
    WrapObservation,
    observe_trainer,
    single_gpu_baseline,
)

PREDICTED_SPECS = ("auto", "balanced")
UNSTATED_GPUS = 2  # --gpus not given: the fewest GPUs one process must see for the Trainer to wrap DataParallel


def _quantized(model) -> tuple[bool, bool]:
    inner, _ = unwrap_model(model)
    return bool(getattr(inner, "is_loaded_in_4bit", False)), bool(getattr(inner, "is_loaded_in_8bit", False))


def _training_options(target) -> dict[str, int]:
    return {"dataset_size": int(target.params.get("dataset_size", DEFAULT_DATASET_SIZE)),
            "per_device_batch": int(target.params.get("per_device_train_batch_size", DEFAULT_PER_DEVICE_BATCH)),
            "accumulation": int(target.params.get("gradient_accumulation_steps", 1))}


def expected_device_map(prepared, target) -> tuple[dict | None, str]:
    """The hf_device_map the user's training run would have, and why we think so."""
    spec = target.device_map
    if isinstance(spec, dict):
        return spec, "--device-map as given"
    if isinstance(spec, int):
        return {"": spec}, "--device-map as given"
    if isinstance(spec, str) and spec != "cpu":
        budget, _ = default_max_memory(target.gpus, target.max_memory)
        predicted = predict_device_map(auto_config(target.model_dir), spec, target.gpus, budget, target.quant)
        return predicted.device_map, f'predicted for device_map="{spec}" on {target.gpus} GPU(s)'
    if any(_quantized(prepared.model)):
        return {"": 0}, ("bitsandbytes loads onto the current GPU when no device_map is given "
                         "(the quantizer's update_device_map sets {'': 0})")
    inner, _ = unwrap_model(prepared.model)
    return getattr(inner, "hf_device_map", None), "the loaded model's own hf_device_map"


@dataclasses.dataclass(repr=False)
class TrainerWrapResult(ProbeResult):
    headline: WrapObservation
    map_reason: str
    scenarios: list[WrapObservation]
    releases: list[dict[str, Any]]
    replica: list[ForwardOutcome]
    baseline_steps: int
    installed: str
    # --gpus not stated: what the installed Trainer does when one process sees UNSTATED_GPUS GPUs (plain `python
    # train.py` on a multi-GPU machine); a crash there is a warn naming that condition, not a fail
    unstated: WrapObservation | None = None
    unstated_replica_note: str | None = None  # why the replica forward of that launch was not run

    def to_frame(self):
        import pandas as pd

        more = [self.unstated] if self.unstated is not None else []
        return pd.DataFrame([o.as_row() for o in [self.headline, *self.scenarios, *more]])

    def fixes(self) -> list[dict[str, str]]:
        h = self.headline
        four_bit = any(r.get("is_loaded_in_4bit") for r in self.releases[:1])
        return [
            {"fix": "training_args._n_gpu = 1 (or CUDA_VISIBLE_DEVICES with one GPU)",
             "trade-off": "stops the wrap and keeps device_map sharding; an unsharded model then trains on one GPU "
                          "while the other idles", "applies": "yes" if h.wraps_data_parallel or
             (h.n_gpu or 1) > 1 else "not needed"},
            {"fix": "force sharding: device_map='balanced' with max_memory below the model size per GPU",
             "trade-off": "the Trainer sees model parallelism (n_gpu=1); layers run one GPU after another, so no "
                          "speed-up", "applies": "yes" if h.wraps_data_parallel else "not needed"},
            {"fix": "launch with torchrun --nproc_per_node N (DDP), device_map={'': local_rank}",
             "trade-off": "one full model copy per GPU (memory), autocast in every process; the recommended way "
                          "to use N GPUs", "applies": "yes" if h.wraps_data_parallel else "optional"},
            {"fix": "upgrade transformers to >= 5.6", "trade-off": "5.6 stops wrapping 4-bit models; other models "
             "are still wrapped", "applies": "yes, if the failing run used an older release" if four_bit
             else "no (not a 4-bit model)"},
        ]

    def findings(self) -> list[Finding]:
        h = self.headline
        evidence = {"installed_transformers": self.installed, "observed": h.as_row(), "simulated": h.simulated,
                    "device_map_reason": self.map_reason, "scenarios": [o.as_row() for o in self.scenarios],
                    "releases": self.releases, "replica_forward": [r.as_row() for r in self.replica],
                    "single_gpu_steps_per_epoch": self.baseline_steps, "fixes": self.fixes()}
        steps = f"{self.baseline_steps} → {h.steps_per_epoch} steps per epoch"
        would_wrap = [r["release"] for r in self.releases if r["wraps_data_parallel"]]
        replica_failed = next((r for r in self.replica if not r.ok and "replica" in r.scenario), None)
        others = f" Encoded release lines that would wrap it: {', '.join(would_wrap)}." if would_wrap else \
            " No encoded release line would wrap it."
        if would_wrap and not h.wraps_data_parallel and replica_failed:
            others += (f" Under those releases its replica-thread forward fails — {replica_failed.error} — the "
                       "'float != BFloat16' of a run made with them.")
        fix = "; ".join(f["fix"] for f in self.fixes() if f["applies"].startswith("yes")) or "none needed"
        if h.wraps_data_parallel:
            crash = (f" The replica-thread forward fails: {replica_failed.error}" if replica_failed else
                     " The replica-thread forward ran (this model has no dtype island on its path), but the "
                     "replicas get no autocast.")
            return [Finding(
                "parallel.trainer_wrap", "fail" if replica_failed else "warn",
                f"transformers {self.installed} wraps this model in nn.DataParallel on {h.gpus} GPUs ({steps})",
                f"is_model_parallel={h.is_model_parallel}, n_gpu={h.n_gpu}, train batch {h.train_batch_size}. "
                "Autocast reaches the model only through accelerator.prepare, which the Trainer skips for a "
                "DataParallel-wrapped model, and autocast state is thread-local to the replica threads." + crash
                + others, evidence, fix)]
        if (h.n_gpu or 1) > 1:
            return [Finding(
                "parallel.trainer_wrap", "warn",
                f"No DataParallel, but the train batch is multiplied by {h.n_gpu} ({steps})",
                f"transformers {self.installed} does not wrap this model (quantized models are not "
                f"DataParallel-able) yet args.n_gpu={h.n_gpu} still multiplies the train batch: "
                f"{h.train_batch_size} samples per step run on one device, so each step is {h.n_gpu}x larger than "
                "configured and the other GPU idles." + others, evidence,
                "training_args._n_gpu = 1 (or one visible GPU) for the configured batch; torchrun (DDP) to use "
                "every GPU.")]
        more = self.unstated
        if more is not None:
            evidence["gpus_not_stated"] = {"judged_on": h.gpus, "observed_with": more.as_row()}
        if more is not None and more.wraps_data_parallel and replica_failed:
            return [Finding(
                "parallel.trainer_wrap", "warn",
                f"If one training process sees {more.gpus} or more GPUs, transformers {self.installed} wraps this "
                "model in nn.DataParallel and its replica forward fails",
                f"--gpus was not given, so one GPU was judged (no wrap). Launched with plain `python` on a machine "
                f"with {more.gpus}+ visible GPUs, the Trainer sets n_gpu={more.n_gpu} and wraps the model "
                f"({self.baseline_steps} → {more.steps_per_epoch} steps per epoch); autocast does not reach the "
                f"replica threads, and the replica forward fails: {replica_failed.error}" + others, evidence,
                f"Launch with torchrun (DDP) or make one GPU visible (CUDA_VISIBLE_DEVICES=0); pass --gpus "
                f"{more.gpus} to judge that launch as a fail, or --gpus 1 to state a one-GPU run.")]
        note = ""
        if more is not None and (more.wraps_data_parallel or (more.n_gpu or 1) > 1):
            replica_ran = self.unstated_replica_note or "its replica forward runs"
            note = (f" GPUs not stated (--gpus): with {more.gpus} visible to one process the Trainer would "
                    + (f"wrap it in nn.DataParallel; {replica_ran}" if more.wraps_data_parallel
                       else f"multiply the train batch by {more.n_gpu} without a wrap")
                    + f" ({self.baseline_steps} → {more.steps_per_epoch} steps per epoch).")
        return [Finding("parallel.trainer_wrap", "pass",
                        f"transformers {self.installed} does not wrap this model (n_gpu={h.n_gpu})",
                        f"is_model_parallel={h.is_model_parallel}; {h.steps_per_epoch} steps per epoch." + others
                        + note, evidence)]

    def details(self):
        simulated = self.headline.simulated
        return Display(Heading("What the installed Trainer does"),
                       Paragraph(f"Map: {self.map_reason}."),
                       Paragraph("Simulated on this machine:") if simulated else None, Bullets(simulated),
                       Table.from_frame(self.to_frame()), Heading("Forward as a DataParallel replica runs it"),
                       Table.from_records([r.as_row() for r in self.replica]),
                       Heading("Other transformers release lines"), Table.from_records(self.releases),
                       Heading("Fixes"), Table.from_records(self.fixes()))


def trainer_wrap_probe(prepared, target) -> TrainerWrapResult:
    model = prepared.model
    options = _training_options(target)
    device_map, reason = expected_device_map(prepared, target)
    headline = observe_trainer(model, target.gpus, scenario="your run", device_map=device_map, **options)
    scenarios = [observe_trainer(model, target.gpus, scenario="device_map={'': 0}", device_map={"": 0}, **options),
                 observe_trainer(model, target.gpus, scenario="device_map={'': 1}", device_map={"": 1}, **options)]
    if target.gpus > 1:
        split = {"first half": 0, "second half": 1}
        scenarios.append(observe_trainer(model, target.gpus, scenario="a map spanning GPUs 0 and 1",
                                         device_map=split, **options))
    inner, _ = unwrap_model(model)
    four, eight = _quantized(model)
    releases = verdicts_across_releases(n_gpu=target.gpus, hf_device_map=device_map, is_loaded_in_4bit=four,
                                        is_loaded_in_8bit=eight,
                                        is_parallelizable=bool(getattr(inner, "is_parallelizable", False)),
                                        model_parallel=bool(getattr(inner, "model_parallel", False)))
    for row in releases:
        row["is_loaded_in_4bit"] = four
    unstated = None
    if not getattr(target, "gpus_stated", True):
        unstated = observe_trainer(model, UNSTATED_GPUS, scenario=f"{UNSTATED_GPUS} GPUs in one process (not stated)",
                                   device_map=device_map, **options)
    replica: list[ForwardOutcome] = []
    replica_note = None
    def ran_without_autocast(inputs: dict):
        """The replica's forward is the forward matrix's train / no-autocast cell, traced: kept for notebook 04."""
        return lambda out, tracer: remember_forward(model, target, inputs, "train", "no autocast", out,
                                                    "02's replica thread forward", tracer=tracer)

    if headline.wraps_data_parallel or any(r["wraps_data_parallel"] for r in releases):
        inputs, _how = target_inputs(model, target)  # labels that fit the head: T5 cannot run its decoder without
        replica = replica_forward_check(model, inputs, compute_dtype_of(model), ran_without_autocast(inputs))
    elif unstated is not None and unstated.wraps_data_parallel and \
            next(off_compute_dtype(model, compute_dtype_of(model)), None) is None:
        # every floating tensor in the compute dtype: a replica thread without autocast computes in it as the caller
        # does, so there is no dtype break to look for (and no forward to pay for)
        replica_note = ("every floating tensor is in the compute dtype, so its replicas, without autocast, compute "
                        "in it too")
    elif unstated is not None and unstated.wraps_data_parallel:
        try:  # what a launch nobody stated would do: without a batch this model accepts, only the wrap is said
            inputs, _how = target_inputs(model, target)
            replica = replica_forward_check(model, inputs, compute_dtype_of(model), ran_without_autocast(inputs))
        except Exception as exc:  # noqa: BLE001 - the stated verdict does not depend on it
            replica_note = f"its replica forward was not run ({type(exc).__name__}: {str(exc)[:160]})"
    baseline = single_gpu_baseline(options["dataset_size"], options["per_device_batch"], options["accumulation"])
    installed = transformers.__version__
    line = release_line_for(installed)
    if line is not None:
        releases = [dict(r, installed=(r["release"] == line.since)) for r in releases]
    return TrainerWrapResult(headline, reason, scenarios, releases, replica, baseline, installed, unstated,
                             replica_note)


def device_map_probe(prepared, target) -> DeviceMapResult:
    budget, assumed = default_max_memory(target.gpus, target.max_memory)
    config = auto_config(target.model_dir, trust_remote_code=target.trust_remote_code)
    specs = list(PREDICTED_SPECS)
    if isinstance(target.device_map, str) and target.device_map not in specs + ["cpu"]:
        specs.append(target.device_map)
    predictions = [predict_device_map(config, spec, target.gpus, budget, target.quant) for spec in specs]
    return DeviceMapResult(loaded_device_map(prepared.model), predictions, target.gpus, budget, assumed)
