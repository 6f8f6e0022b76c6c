"""The plan: the measured step, what fake tensors cannot see as cited lines, and against a memory budget whether it
fits, the largest batch and sequence length that fit, and which toggle would make it fit by how much.

    plan = make_plan(setup, budget_bytes=…, budget_name="h100")
    plan.peak_bytes, plan.fits, plan.largest_batch, plan.toggles

Every number the plan states comes from a fake-tensor step of the user's model code (`step.fake_step`), except the
`unseen.yaml` terms, which are shown as their own lines with their sources. The largest batch is read from two steps
(the memory above the weights and states grows linearly with the batch: activations); the largest sequence length
from three (attention can grow with its square). A toggle is another step with that one change, except the optimizer
ones, whose states are arithmetic on the trainable parameters (bitsandbytes' 8-bit Adam: 2 bytes a parameter for its
two states plus the blockwise statistics). FSDP — the training arguments' `fsdp` / `fsdp_config`, or a DeepSpeed ZeRO-3
configuration planned as FSDP's full sharding, over `--gpus N` — is a fake step of one rank under accelerate's own
FSDP2 preparation (`fsdp_step.sharded_step`), and so is the toggle "FSDP over N GPUs"; only when that step cannot run
does the toggle fall back to arithmetic on the measured single-GPU categories (`fsdp_peak`), and it says so.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from pathlib import Path
from typing import Any

from workbench.display.result import Displayable
from workbench.errors import UsageError

UNSEEN = Path(__file__).with_name("unseen.yaml")
GPUS = Path(__file__).with_name("gpus.yaml")
GIB = 2**30


@functools.cache
def unseen_terms() -> tuple[dict[str, Any], ...]:
    import yaml

    return tuple(yaml.safe_load(UNSEEN.read_text()))


@functools.cache
def gpu_table() -> dict[str, dict[str, Any]]:
    import yaml

    return {name: row for row in yaml.safe_load(GPUS.read_text()) for name in row["names"]}


def gpu_bytes(name: str) -> int:
    row = gpu_table().get(name.lower().replace(" ", "-"))
    if row is None:
        raise UsageError(f"--gpu {name}: not a GPU this planner knows; pass --memory BYTES (e.g. 24GiB) or one of "
                         f"{', '.join(sorted({r['names'][0] for r in gpu_table().values()}))}")
    return int(row["gib"] * GIB)


def parse_bytes(text: str) -> int:
    """'24GiB', '80GB', '1.5e10' -> bytes."""
    import re

    m = re.fullmatch(r"\s*([\d.]+(?:e\d+)?)\s*(b|kib|mib|gib|tib|kb|mb|gb|tb)?\s*", text.lower())
    if not m:
        raise UsageError(f"--memory {text}: a size such as 24GiB, 80GB or 25769803776")
    units = {None: 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "kb": 10**3, "mb": 10**6,
             "gb": 10**9, "tb": 10**12}
    return int(float(m.group(1)) * units[m.group(2)])


@dataclasses.dataclass
class Term:
    id: str
    bytes: int
    low: int | None
    high: int | None
    what: str
    source: list[str]
    read_from: str
    measured: bool

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def activation_bytes(step) -> int:
    return step.breakdown.get("activations", 0) + step.breakdown.get("temporaries", 0)


def terms_for(setup, step, gpus: int, heap=None, retained_per_activation: float | None = None) -> list[Term]:
    """The unseen.yaml lines that apply to this device and launch, in bytes (`when: ddp`: several GPUs without FSDP,
    whose own buffers the sharded step measures). glibc's line on a CPU: with `heap` (`host_heap.measured_heap`
    measured it) the measured rise less the planned tensors; a variant of the measured set-up (a toggle, another
    batch or length) is given `retained_per_activation` instead, the measured retention scaled by its own
    activations; else the replay of the planned tensors' trace."""
    scale = {"activation_bytes": activation_bytes(step),
             "trainable_gradient_bytes": step.trainable_parameters * 4}
    out = []
    for row in unseen_terms():
        if row["device"] not in ("any", setup.device):
            continue
        if row["when"] == "distributed" and gpus <= 1:
            continue
        if row["when"] == "ddp" and (gpus <= 1 or setup.sharded):
            continue
        if "per" in row:
            base = scale[row["per"]]
            amount, low, high = (int(base * row["factor"]), int(base * row.get("low_factor", row["factor"])),
                                 int(base * row.get("high_factor", row["factor"])))
        else:
            amount, low, high = int(row["bytes"]), row.get("low"), row.get("high")
        what, read_from = " ".join(row["what"].split()), row["read_from"]
        if row["id"] == "glibc_heap":
            above = step.peak_bytes - step.weights_bytes
            if heap is not None and heap.rise_bytes is not None:
                amount = max(0, heap.rise_bytes - above)
                what = ("what this host's malloc keeps resident beyond the planned tensors: the measured resident "
                        "rise of a real step less the tensors the plan counts")
                read_from = heap.describe()
            elif retained_per_activation is not None:
                amount = int(retained_per_activation * activation_bytes(step))
                read_from = "the measured set-up's retention, scaled by this step's activations"
            elif step.allocator_peak_bytes is not None:
                amount = max(0, step.allocator_peak_bytes - above)
        out.append(Term(row["id"], amount, low, high, what, list(row["source"]), read_from,
                        bool(row.get("measured"))))
    return out


@dataclasses.dataclass(repr=False)
class Plan(Displayable):
    setup: Any
    step: Any
    terms: list[Term]
    gpus: int
    budget_bytes: int | None = None
    budget_name: str | None = None
    largest_batch: int | None = None
    largest_seq: int | None = None
    toggles: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    # planned peaks at other sequence lengths, each a step measured once: the largest-sequence fit and the
    # half-sequence toggle both read s/2
    peaks_at_seq: dict[int, int] = dataclasses.field(default_factory=dict)
    heap: Any = None  # host_heap.HostHeap: a CPU plan's malloc retention, measured (or why not)

    @property
    def retained_per_activation(self) -> float | None:
        """The measured retention per byte of the step's activations, which the variants of the set-up scale."""
        term = next((t for t in self.terms if t.id == "glibc_heap"), None)
        if self.heap is None or self.heap.rise_bytes is None or term is None:
            return None
        return term.bytes / max(1, activation_bytes(self.step))

    @property
    def peak_bytes(self) -> int:
        return self.step.peak_bytes + sum(t.bytes for t in self.terms)

    @property
    def fits(self) -> bool | None:
        return None if self.budget_bytes is None else self.peak_bytes <= self.budget_bytes

    def as_dict(self) -> dict[str, Any]:
        breakdown = {k: v for k, v in self.step.breakdown.items() if k != "total"}
        breakdown.update({f"unseen: {t.id}": t.bytes for t in self.terms})
        return {"device": self.setup.device, "budget": {"name": self.budget_name, "bytes": self.budget_bytes},
                "peak_bytes": self.peak_bytes, "weights_bytes": self.step.weights_bytes,
                "tensor_peak_bytes": self.step.peak_bytes, "first_step_peak_bytes": self.step.first_step_peak_bytes,
                "breakdown": breakdown, "unseen": [t.as_dict() for t in self.terms],
                "top_modules": self.step.top_modules, "phase": self.step.phase, "fits": self.fits,
                "largest_batch": self.largest_batch, "largest_seq": self.largest_seq, "toggles": self.toggles,
                "setup": self.setup.as_dict(), "optimizer": self.step.optimizer,
                "trainable_parameters": self.step.trainable_parameters, "parameters": self.step.parameters,
                "notes": self.step.notes, "seconds": round(self.step.seconds, 1),
                "host_heap": None if self.heap is None else dataclasses.asdict(self.heap)}

    def view(self):
        from workbench.plan.view import plan_view

        return plan_view(self)

    def __repr__(self) -> str:
        return f"<Plan {self.setup.config.model_type} peak {self.peak_bytes / GIB:.2f} GiB fits={self.fits}>"


def _step(setup):
    """The measured step: one rank's under FSDP when the set-up shards, else the single-GPU one."""
    if setup.sharded:
        from workbench.plan.fsdp_step import sharded_step

        return sharded_step(setup)
    from workbench.plan.step import fake_step

    return fake_step(setup)


def _planned(plan: Plan, setup, gpus: int | None = None) -> int:
    """The planned peak of a variant of the plan's set-up (on `gpus` ranks, else the plan's)."""
    step = _step(setup)
    return step.peak_bytes + sum(t.bytes for t in terms_for(setup, step, gpus or plan.gpus,
                                                            retained_per_activation=plan.retained_per_activation))


def _planned_at_seq(plan: Plan, seq: int) -> int:
    if seq not in plan.peaks_at_seq:
        plan.peaks_at_seq[seq] = _planned(plan, plan.setup.replace(seq=seq))
    return plan.peaks_at_seq[seq]


def _largest_batch(plan: Plan) -> int | None:
    """From steps at batch b and 2b: memory is affine in the batch."""
    setup, b = plan.setup, plan.setup.batch
    one, two = plan.peak_bytes, _planned(plan, setup.replace(batch=2 * b))
    per = (two - one) / b
    if per <= 0:
        return None
    fixed = one - per * b
    return max(0, math.floor((plan.budget_bytes - fixed) / per))


def _largest_seq(plan: Plan) -> int | None:
    """From steps at s/2, s and 2s: a quadratic in the sequence length (attention's square where it is kept)."""
    setup, s = plan.setup, plan.setup.seq
    points = [(s // 2, _planned_at_seq(plan, max(1, s // 2))), (s, plan.peak_bytes), (2 * s, _planned_at_seq(plan, 2 * s))]
    (x0, y0), (x1, y1), (x2, y2) = points
    # Lagrange form of the quadratic through the three points, then its largest root within the budget
    def at(x: float) -> float:
        return (y0 * (x - x1) * (x - x2) / ((x0 - x1) * (x0 - x2)) + y1 * (x - x0) * (x - x2) / ((x1 - x0) * (x1 - x2))
                + y2 * (x - x0) * (x - x1) / ((x2 - x0) * (x2 - x1)))

    if at(1) > plan.budget_bytes:
        return 0
    cap = int(getattr(setup.config, "max_position_embeddings", 0) or 2**20)
    # search up to the model's own position limit: a fit curving down never crosses the budget, and beyond the
    # limit the model cannot run anyway
    lo, hi = 1, min(2 * s, cap)
    while at(hi) <= plan.budget_bytes and hi < cap:
        hi = min(cap, hi * 2)
    if at(hi) <= plan.budget_bytes:
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if at(mid) <= plan.budget_bytes else (lo, mid)
    return lo


def _toggle(plan: Plan, name: str, change: str, peak: int) -> dict[str, Any]:
    return {"toggle": name, "change": change, "peak_bytes": peak, "saves_bytes": plan.peak_bytes - peak,
            "fits": None if plan.budget_bytes is None else peak <= plan.budget_bytes}


FSDP_GPUS = (2, 4, 8)


def fsdp_peak(plan: Plan, gpus: int) -> int:
    """The fallback when no FSDP step can be measured: the peak per GPU under FSDP's full sharding on `gpus` GPUs,
    from the measured single-GPU step: weights, gradients and optimizer states divided among the ranks (FSDP2's
    fully_shard, ZeRO-3), activations and temporaries whole on each, plus one layer's parameters all-gathered and the
    next one prefetched (two units of weights / layers)."""
    b = plan.step.breakdown
    sharded = b.get("weights", 0) + b.get("buffers", 0) + b.get("gradients", 0) + b.get("optimizer states", 0)
    layers = max(1, int(getattr(plan.setup.config, "num_hidden_layers", 1) or 1))
    gathered = 2 * b.get("weights", 0) // layers
    rest = plan.peak_bytes - sharded
    return sharded // gpus + rest + gathered


def _fewest_that_fit(counts: list[int], peak_on, budget: int) -> tuple[int, int, str | None]:
    """(the fewest of `counts`, ascending, whose measured peak `peak_on(n)` fits `budget`, else the largest; its
    peak; why a measurement failed, else None). A rank's peak under full sharding falls as ranks are added: the
    weights, gradients and optimizer states divide among them, while its activations, the gathered units and the
    terms on top (`terms_for`: the same for any count above one) stay whole. So the smallest and largest counts
    are measured first, and a count between them only where the smallest does not fit and the largest does:
    where none fits, two steps answer, not one per count."""
    measured: dict[int, int] = {}

    def fits(n: int) -> bool:
        measured[n] = peak_on(n)
        return measured[n] <= budget

    try:
        if fits(counts[0]):
            return counts[0], measured[counts[0]], None
        if len(counts) == 1 or not fits(counts[-1]):
            return counts[-1], measured[counts[-1]], None
        lo, hi = 0, len(counts) - 1  # counts[lo] does not fit, counts[hi] does
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if fits(counts[mid]) else (mid, hi)
        return counts[hi], measured[counts[hi]], None
    except Exception as exc:  # noqa: BLE001 - any refusal of the sharded step: the labelled fallback instead
        failed = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}" if str(exc) else type(exc).__name__
        return counts[-1], 0, failed


def _fsdp_toggle(plan: Plan) -> dict[str, Any] | None:
    """The fewest GPUs under FSDP full sharding (of 2 / 4 / 8, more than the plan's own) that fit the budget, or 8
    when none does: measured FSDP steps of the set-up (its fsdp_config, else transformers' default FSDP) at the
    counts `_fewest_that_fit` asks for, or, when that step cannot run here, the arithmetic fallback on the
    single-GPU step, saying so."""
    from workbench.plan.fsdp import transformers_default_plugin_args

    if plan.budget_bytes is None:
        return None
    setup = plan.setup
    candidates = [n for n in FSDP_GPUS if n > (setup.gpus if setup.sharded else 1)]
    if not candidates:
        return None
    sharded = setup.replace(fsdp=setup.fsdp if setup.fsdp is not None else transformers_default_plugin_args(),
                            fsdp_source=setup.fsdp_source or "transformers' default: TrainingArguments(fsdp=True)")
    chosen, peak, failed = _fewest_that_fit(candidates, lambda n: _planned(plan, sharded.replace(gpus=n), n),
                                            plan.budget_bytes)
    if failed is not None and setup.sharded:
        return None  # a plan already sharded has no single-GPU categories to fall back on
    if failed is not None:
        chosen = next((n for n in FSDP_GPUS if fsdp_peak(plan, n) <= plan.budget_bytes), FSDP_GPUS[-1])
        peak = fsdp_peak(plan, chosen)
    toggle = _toggle(plan, f"FSDP over {chosen} GPUs", f"fsdp=True (FSDP2 fully_shard, as ZeRO-3 shards) on {chosen} "
                     "GPUs: weights, gradients and optimizer states sharded, activations whole on each", peak)
    toggle["computed"] = (f"measured: a fake step of one rank of {chosen} under accelerate's fsdp2_prepare_model "
                          f"({sharded.fsdp_source}), tracked by FSDPMemTracker" if failed is None else
                          f"arithmetic fallback, not measured (the fake FSDP step failed: {failed}): (weights + "
                          "gradients + states) / GPUs + activations + two layers' weights gathered")
    return toggle


def _toggles(plan: Plan) -> list[dict[str, Any]]:
    setup, out = plan.setup, []
    args = setup.args
    if not args.gradient_checkpointing:
        from workbench.probes.train.configuration import gpu_configuration

        # transformers 5.23 reads `gradient_checkpointing*` only as deprecated aliases of `activation_checkpointing*`
        # while those are None (training_args.py:1533-1545): a copy of built arguments keeps the new names' False
        # unless they change too; earlier releases have only the old names
        on = {"activation_checkpointing": True, "activation_checkpointing_kwargs": {"use_reentrant": False},
              "gradient_checkpointing": True, "gradient_checkpointing_kwargs": {"use_reentrant": False}}
        known = {f.name for f in dataclasses.fields(args) if f.init}
        with gpu_configuration():  # rebuilt as on the GPU the arguments were written for (bf16 is checked there)
            changed = dataclasses.replace(args, **{k: v for k, v in on.items() if k in known})
        out.append(_toggle(plan, "gradient checkpointing", "gradient_checkpointing=True, "
                           "gradient_checkpointing_kwargs={'use_reentrant': False}",
                           _planned(plan, setup.replace(args=changed))))
    if setup.setup != "qlora":
        out.append(_toggle(plan, "4-bit base (QLoRA)", "BitsAndBytesConfig(load_in_4bit=True, "
                           "bnb_4bit_quant_type='nf4', bnb_4bit_use_double_quant=True) + LoRA",
                           _planned(plan, setup.replace(setup="qlora"))))
    states = plan.step.breakdown.get("optimizer states", 0)
    optim = getattr(args.optim, "value", str(args.optim))
    if states and not any(word in optim for word in ("8bit", "bnb", "paged")):
        eight = 2 * plan.step.trainable_parameters + 2 * 4 * math.ceil(plan.step.trainable_parameters / 2048)
        eight //= setup.gpus if setup.sharded else 1  # sharded with the parameters, as the fp32 states are
        out.append(_toggle(plan, "8-bit optimizer", "optim='adamw_bnb_8bit' (bitsandbytes AdamW8bit: two uint8 "
                           "states a parameter, fp32 absmax per 2048)", plan.peak_bytes - states + eight))
    out.append(_toggle(plan, "half the sequence", f"max_length={setup.seq // 2}",
                       _planned_at_seq(plan, max(1, setup.seq // 2))))
    fsdp = _fsdp_toggle(plan)
    if fsdp is not None:
        out.append(fsdp)
    if setup.peft and setup.peft.get("modules_to_save"):
        peft = {**setup.peft, "modules_to_save": None}
        out.append(_toggle(plan, "no modules_to_save", f"drop modules_to_save={setup.peft['modules_to_save']} "
                           "(train the head with LoRA or not at all)", _planned(plan, setup.replace(peft=peft))))
    return sorted(out, key=lambda t: -t["saves_bytes"])


def make_plan(setup, *, budget_bytes: int | None = None, budget_name: str | None = None, gpus: int | None = None,
              explore: bool = True, measure_heap: bool = False) -> Plan:
    """The plan of the set-up's step; `gpus` (else the set-up's own `--gpus`) ranks in the launch. `measure_heap`
    (a CPU plan): glibc's line measured by a real step of the model with random weights (`host_heap`), not
    replayed."""
    if gpus is not None and gpus != setup.gpus:
        setup = setup.replace(gpus=gpus)
    step = _step(setup)
    if setup.fsdp is not None and not setup.sharded:
        step.notes.append(f"FSDP is configured ({setup.fsdp_source}) but the launch has one GPU: planned unsharded; "
                          "--gpus N plans one rank of N")
    heap = None
    if measure_heap and setup.device == "cpu":
        from workbench.plan.host_heap import measured_heap

        heap = measured_heap(setup, step.peak_bytes)
        if heap.reason:
            step.notes.append(f"glibc_heap not measured on this host ({heap.reason}): the line is the replay of the "
                              "planned tensors' trace, which a default malloc exceeds (docs/plan.md)")
        elif explore and budget_bytes is not None:
            step.notes.append("the largest batch and sequence and the toggles scale the measured glibc_heap by "
                              "their own activations")
    plan = Plan(setup, step, terms_for(setup, step, setup.gpus, heap), setup.gpus, budget_bytes, budget_name,
                heap=heap)
    if budget_bytes is not None and explore:
        plan.largest_batch = _largest_batch(plan)
        plan.largest_seq = _largest_seq(plan)
        plan.toggles = _toggles(plan)
    return plan
