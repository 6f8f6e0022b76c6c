"""torch's MemTracker, for a PEFT model, with the moment of the peak.

`torch.distributed._tools.mem_tracker.MemTracker` (torch 2.13) tracks every storage a step creates under
`TorchDispatchMode`, categorised as parameters, buffers, gradients, activations, temporaries and optimizer states,
per module. It installs a gradient hook on every parameter it tracks, and `Tensor.register_hook` refuses a tensor
that does not require grad: a PEFT model's frozen base raises "cannot register a hook on a tensor that doesn't
require gradient". `PeftMemTracker` installs the hooks on the trainable parameters only (the frozen ones never get a
gradient to track); both trackers update the per-module peaks of the modules running now rather than of all of them
at every operator (torch's loop made a 90M model's two steps take 50 s); everything else is torch's. Both overrides are of
private methods of torch 2.13 (`_track_module_params_and_buffers`, `_update_peak_stats`, `_update_snap`): the
pinned torch; tests/plan holds them to a real tracker's numbers. `phase(name)` records the peak reached by the end of each phase
(forward, backward, optimizer step), so the phase of the overall peak is known.

`ShardedMemTracker` is torch's `FSDPMemTracker` (`torch.distributed._tools.fsdp2_mem_tracker`) with the same marks:
it hooks FSDP2's own parameter groups (sharded and unsharded parameters and gradients, all-gather and reduce-scatter
buffers) rather than every parameter, so a frozen base needs no change there. One change: DTensor computes an op's
output shape by running it on fake tensors of the global shape (`ShardingPropagator._propagate_tensor_meta_non_cached`,
in `detect_fake_mode() or FakeTensorMode()`); FSDPMemTracker skips those ops when they run in another fake mode than
its own, but under a fake-tensor plan DTensor detects the plan's own mode, and the optimizer step over sharded
parameters then counted whole-size copies of every parameter, gradient and state (a 70B-shaped plan's states came
out 34 times its shards; a real run's tracker sees none). `ShardedMemTracker` marks the propagation through the hook
torch leaves around it (`ShardingPropagator._fake_mode_lock`, a nullcontext unless a test sets a lock) and does not
track what runs inside.
"""

from __future__ import annotations

from copy import deepcopy
from typing import Any

import torch
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker, _FSDPRefType
from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType, _UpdateType

CATEGORIES = {  # MemTracker's reference types -> the names the plan reports
    _MemRefType.PARAM: "weights", _MemRefType.BUFFER: "buffers", _MemRefType.GRAD: "gradients",
    _MemRefType.ACT: "activations", _MemRefType.TEMP: "temporaries", _MemRefType.OPT: "optimizer states",
    _MemRefType.OTH: "other",
}
# FSDPMemTracker's reference types -> the plan's names: this rank's shards keep the single-device names (weights,
# gradients), what FSDP gathers or stages around a collective is its own line
SHARDED_CATEGORIES = {
    _FSDPRefType.SHARDED_PARAM: "weights", _FSDPRefType.UNSHARDED_PARAM: "unsharded weights",
    _FSDPRefType.BUFFER: "buffers", _FSDPRefType.SHARDED_GRAD: "gradients",
    _FSDPRefType.UNSHARDED_GRAD: "unsharded gradients", _FSDPRefType.ACT: "activations",
    _FSDPRefType.TEMP: "temporaries", _FSDPRefType.ALL_GATHER: "all-gather buffers",
    _FSDPRefType.REDUCE_SCATTER: "reduce-scatter buffers", _FSDPRefType.OPT: "optimizer states",
    _FSDPRefType.INP: "inputs",
}


class StepMarks:
    """What the plan reads from a tracker, for MemTracker and FSDPMemTracker alike: the breakdown in the plan's
    names, the phase marks, the allocation trace (weights and buffers excluded) and the timeline drawn from it."""

    categories: dict[Any, str] = CATEGORIES
    static_types: tuple[Any, ...] = (_MemRefType.PARAM, _MemRefType.BUFFER)  # present before the step: not traced

    def _init_marks(self) -> None:
        self.phases: list[tuple[str, int, dict[str, int]]] = []  # (phase, peak so far, its breakdown)
        # the allocation trace of what the step creates: (+bytes | -bytes, storage key), in order; an allocator
        # model replays it (cpu_allocator)
        self.trace: list[tuple[int, int]] = []
        self.phase_ends: list[tuple[str, int]] = []  # (phase, trace length at its end): the timeline's marks
        # each training step's own peak, in the plan's names: the overall peak hides a step that stayed below it
        self.step_peaks: list[dict[str, int]] = []
        self._step_peak: dict[Any, Any] = {}  # the current step's peak snapshot so far, in the tracker's types
        self._stats_by_fqn: dict[str, Any] = {}  # memory_tracking's statistics by module name (_update_peak_stats)

    def _update_snap(self, u_type, winfo, old_mem_consumed=None, old_reftype=None) -> None:
        super()._update_snap(u_type, winfo, old_mem_consumed=old_mem_consumed, old_reftype=old_reftype)
        if winfo.reftype in self.static_types and u_type != _UpdateType.DEL:
            return
        if u_type == _UpdateType.ADD:
            self.trace.append((winfo.size * winfo.element_size, id(winfo)))
        elif u_type == _UpdateType.DEL:
            self.trace.append((-1, id(winfo)))

    def _update_peak_stats(self, peak_state) -> None:
        """MemTracker's own update (FSDPMemTracker's too, which inherits it), visiting the modules now running
        (ModTracker's parents) instead of every tracked module on every operator: the same statistics, in time
        linear in the operators (a 70B-shaped model has some two thousand modules, and FSDP a unit per layer);
        then the current step's peak (`_note_step_peak`)."""
        if len(self._stats_by_fqn) != len(self.memory_tracking):
            self._stats_by_fqn = {stats.mod_fqn: stats for stats in self.memory_tracking.values()}
        current = self._curr_mem_snap
        for fqn in self._mod_tracker.parents:
            stats = self._stats_by_fqn.get(fqn)
            if stats is None or peak_state not in stats.snapshots:
                continue
            for dev, dev_snap in current.items():
                if stats.local_peak.get(dev, 0) < dev_snap["Total"]:
                    stats.local_peak[dev] = dev_snap["Total"]
                    stats.snapshots[peak_state][-1][dev] = deepcopy(dev_snap)
        for dev, dev_snap in current.items():
            if self._peak_mem.get(dev, 0) < dev_snap["Total"]:
                self._peak_mem[dev] = dev_snap["Total"]
                self._peak_mem_snap[dev] = deepcopy(dev_snap)
        self._note_step_peak()

    def reset_mod_stats(self) -> None:
        """torch's reset (memory_tracking cleared between steps), and the statistics by name with it, so that the
        map is never one of the previous step's statistics (it is rebuilt when its length differs from
        memory_tracking's, and a refill can reach the same length)."""
        super().reset_mod_stats()
        self._stats_by_fqn = {}

    def _note_step_peak(self) -> None:
        """Keep the current step's peak beside the overall one (the tracker's `_update_peak_stats` calls it)."""
        for dev_snap in self._curr_mem_snap.values():
            if self._step_peak.get("Total", -1) < dev_snap["Total"]:
                self._step_peak = dict(dev_snap)
            break  # one tracked device

    def breakdown(self, which: str = "peak") -> dict[str, int]:
        """Bytes per category (and "total") of the tracked device, at the peak or now."""
        snapshot = self.get_tracker_snapshot(which)
        if not snapshot:
            return {"total": 0}
        return self._in_plan_names(next(iter(snapshot.values())))

    def _in_plan_names(self, per_device: dict[Any, int]) -> dict[str, int]:
        out = {self.categories[k]: v for k, v in per_device.items() if k in self.categories}
        out["total"] = per_device.get("Total", sum(out.values()))
        return out

    def phase(self, name: str) -> None:
        """Mark the end of a phase: the peak so far and its breakdown, and where it ends in the trace; the end of an
        optimizer step closes the step's own peak (`step_peaks`)."""
        self.phases.append((name, self.breakdown()["total"], self.breakdown()))
        self.phase_ends.append((name, len(self.trace)))
        if name.startswith("optimizer step"):
            self.step_peaks.append(self._in_plan_names(self._step_peak) if self._step_peak else {"total": 0})
            self._step_peak = {}

    def timeline(self, points: int = 1500) -> list[tuple[int, int]]:
        """(trace event, bytes the step holds beyond weights and buffers) over the step, at most `points` of them
        (each the largest of its stretch of events, so a peak is never skipped)."""
        live: dict[int, int] = {}
        total, series = 0, []
        for size, key in self.trace:
            if size >= 0:
                live[key] = size
                total += size
            else:
                total -= live.pop(key, 0)
            series.append(total)
        if len(series) <= points:
            return list(enumerate(series))
        stride = -(-len(series) // points)
        return [(i, max(series[i:i + stride])) for i in range(0, len(series), stride)]

    @property
    def peak_phase(self) -> str | None:
        """The first phase by whose end the overall peak was reached."""
        if not self.phases:
            return None
        top = self.phases[-1][1]
        return next(name for name, peak, _ in self.phases if peak == top)

    def top_modules(self, n: int = 8) -> list[dict[str, Any]]:
        """The modules whose forward or backward saw the most memory, deepest first among equals (FSDPMemTracker
        follows the FSDP units only, and records no output sizes: its rows rank by peak)."""
        rows = []
        for module, stats in self.memory_tracking.items():
            fqn = getattr(stats, "mod_fqn", "")
            snaps = getattr(stats, "snapshots", {})
            best = 0
            for states in snaps.values():
                for snap in states:
                    best = max(best, max((d.get("Total", 0) for d in snap.values()), default=0))
            outputs = getattr(stats, "output_mem", 0)
            rows.append({"module": fqn, "class": type(module).__name__, "peak_bytes": best,
                         "output_bytes": outputs, "parameter_bytes": getattr(stats, "parameter_mem", 0)})
        rows.sort(key=lambda r: (-r["output_bytes"], -r["peak_bytes"]))
        return rows[:n]


class PeftMemTracker(StepMarks, MemTracker):
    def __init__(self) -> None:
        super().__init__()
        self._init_marks()

    def _track_module_params_and_buffers(self, module: torch.nn.Module, install_grad_hooks: bool = True):
        tracked = super()._track_module_params_and_buffers(module, install_grad_hooks=False)
        if install_grad_hooks:
            for param in module.parameters():
                if param.requires_grad and self._param_to_grad_hook_handles.get(param, None) is None:
                    self._param_to_grad_hook_handles[param] = self._grad_hooks(param)
        return tracked

    def _grad_hooks(self, param: torch.Tensor) -> tuple[Any, Any]:
        def on_grad(grad: torch.Tensor) -> None:
            self._update_and_maybe_create_winfos(grad, _MemRefType.GRAD)

        return (param.register_hook(on_grad),
                param.register_post_accumulate_grad_hook(lambda p: on_grad(p.grad)))


class _PropagationMark:
    """Stands where DTensor's shape propagation enters its lock (`ShardingPropagator._fake_mode_lock`): the lock it
    replaces is still entered, and the tracker knows it is inside the propagation."""

    def __init__(self, tracker: ShardedMemTracker, lock: Any) -> None:
        self.tracker, self.lock = tracker, lock

    def __enter__(self) -> None:
        self.lock.__enter__()
        self.tracker._propagating += 1

    def __exit__(self, *exc: Any) -> Any:
        self.tracker._propagating -= 1
        return self.lock.__exit__(*exc)


class ShardedMemTracker(StepMarks, FSDPMemTracker):
    """FSDPMemTracker with the plan's marks, DTensor's shape propagation left untracked (module docstring);
    `module` is the root FSDP module."""

    categories = SHARDED_CATEGORIES
    static_types = (_FSDPRefType.SHARDED_PARAM, _FSDPRefType.BUFFER)

    def __init__(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
        super().__init__(module, optimizer)
        self._init_marks()
        self._propagating = 0
        self._replaced_lock: Any = None

    def __enter__(self) -> ShardedMemTracker:
        from torch.distributed.tensor._sharding_prop import ShardingPropagator

        if self._depth == 0:
            self._replaced_lock = ShardingPropagator._fake_mode_lock
            ShardingPropagator._fake_mode_lock = _PropagationMark(self, self._replaced_lock)
        return super().__enter__()

    def __exit__(self, *args: Any) -> None:
        from torch.distributed.tensor._sharding_prop import ShardingPropagator

        super().__exit__(*args)
        if self._depth == 0:
            ShardingPropagator._fake_mode_lock = self._replaced_lock

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch's signature
        if self._propagating:
            return func(*args, **(kwargs or {}))
        return super().__torch_dispatch__(func, types, args, kwargs)
