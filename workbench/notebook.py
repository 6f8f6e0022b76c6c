"""The notebook contract: the parameters every report notebook takes, and the one call that opens a notebook.

    nb = wb.open_notebook("01_dtype_distribution", parameters=globals())   # options -> target, recorder
    static = nb.run("static")                                            # a step of the catalog, by name
    nb.finish()                                                          # the steps not run yet, then the findings

`NOTEBOOK_PARAMETERS` is exactly the parameters cell of every report notebook (a test compares them with
papermill's `inspect_notebook`), the runner passes nothing else (it checks before executing), and the target's
part of them round-trips: `resolve_target(**target.options()) == target`. With no checkpoint, the bundled demo
is diagnosed as `make diagnose` diagnoses it: `with_demo_fallback` is that rule, used by the CLI, the notebooks
and the panel.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Mapping

from workbench.catalog import NotebookSpec, notebook
from workbench.display.result import Displayable

TARGET_OPTIONS: dict[str, Any] = {
    "checkpoint": "", "adapter": "", "base": "", "quant": "none", "gpus": 0, "setup": "plain", "device_map": "",
    "max_memory": "", "dtype": "auto", "params_json": "{}", "trust_remote_code": False, "allow_pickle": False,
    "data": "", "training_args": "",
}
NOTEBOOK_PARAMETERS: dict[str, Any] = {**TARGET_OPTIONS, "distributed": 0, "findings_path": ""}


def with_demo_fallback(options: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """Options with the demo filled in when no checkpoint is given: (options, whether the demo was used).

    The demo's quant, set-up and GPU count apply where the options keep the contract's defaults; its parameters
    go under the user's."""
    options = dict(options)
    if options.get("checkpoint"):
        return options, False
    from workbench.demo.build import demo_arguments

    demo = demo_arguments()
    options["checkpoint"] = demo.checkpoint
    for key in ("quant", "setup", "gpus"):
        if str(options.get(key)) in ("None", "", str(TARGET_OPTIONS[key])):  # "1" from the CLI is the default 1
            options[key] = getattr(demo, key)
    options["params_json"] = json.dumps({**json.loads(demo.params_json),
                                         **json.loads(options.get("params_json") or "{}")})
    return options, True


class NotebookSession(Displayable):
    """One notebook's target, recorder and step results. `run(name)` runs a step of the catalog's sequence."""

    def __init__(self, spec: NotebookSpec, target, recorder, options: Mapping[str, Any]) -> None:
        self.spec = spec
        self.target = target
        self.recorder = recorder
        self.options = dict(options)
        self.results: dict[str, Any] = {}
        import sys

        loading = sys.modules.get("workbench.model.loading")
        self._loads_at_open = len(loading.LOADS) if loading else 0

    def run(self, name: str | Callable[..., Any], function: Callable[..., Any] | None = None) -> Any:
        """Run a step of this notebook, named or given as its probe function (`nb.run(wb.grad_flow_probe)`).
        `function`: called in place of the step's probe, with the same inputs and the same declared checks (a
        driver's own source for a step: the callback's data path reads the live Trainer)."""
        step = self.spec.step(name)
        args = [self._value(a) for a in step.args]
        kwargs = {k: self._value(v) for k, v in step.kwargs.items()}
        if function is None:
            try:
                function = step.function()
            except (ImportError, AttributeError) as exc:  # a probe that does not import: an error on its checks, as
                function = _raising(exc)                   # a probe that crashes is, and the notebook goes on
        from workbench.model.shared import loads_own_copy, make_room_for_a_copy, take_early_result

        if loads_own_copy(step, self.target):
            early = take_early_result(self.target, step.probe)
            if early is not None:  # run before the shared model was prepared (a model too big for two copies)
                function = lambda *_args, **_kwargs: early  # noqa: E731 - its findings are recorded as the step's
            else:
                make_room_for_a_copy(self.target)
        prepared = self.results.get("prepared") if step.mutates else None
        with _guarded(prepared):
            result = self.recorder.run(function, *args, checks=step.reports, step=step.name, **kwargs)
        self.results[step.name] = result
        self._record_cost()
        return result

    def _record_cost(self) -> None:
        """What this notebook cost so far: the full loads it made, peak memory of the process (since it started,
        or since a kept kernel began this diagnosis: `workbench.peak_memory`)."""
        import sys

        from workbench.peak_memory import peak_rss_bytes

        loading = sys.modules.get("workbench.model.loading")
        loads = loading.LOADS[self._loads_at_open:] if loading else []
        self.recorder.set_cost({"model_loads": loads, "peak_rss_bytes": peak_rss_bytes()})

    def _value(self, ref: str) -> Any:
        from workbench.recorder import Failed

        if ref == "target":
            return self.target
        if ref.startswith("params."):
            return self.target.params.get(ref.removeprefix("params."))
        if ref.startswith("option."):
            return self.options[ref.removeprefix("option.")]
        name = ref.rstrip("?")
        if name not in self.results and ref.endswith("?"):
            return None  # optional: the step may be skipped
        if name not in self.results:
            raise KeyError(f"step {name!r} has not run in this notebook; run nb.run({name!r}) first")
        value = self.results[name]
        return None if ref.endswith("?") and isinstance(value, Failed) else value

    def finish(self):
        """The notebook's last cell: every step of the catalog's sequence this notebook has not run yet, in order
        (a step added to the catalog reaches the report without a cell of its own), each result under its label,
        then the findings."""
        from workbench.display.nodes import Display, Heading
        from workbench.display.result import Shown

        shown = []
        for step in self.spec.steps:
            if step.name not in self.results:
                result = self.run(step.name)
                shown += [Heading(step.label, level=3), result.view() if hasattr(result, "view") else None]
        if shown:
            shown.insert(0, Heading("Steps of the catalog without a cell above", level=2))
        return Shown(Display(*shown, self.recorder.view()))

    def view(self):
        """The target, and the checks this notebook answers (the catalog's, so a check added there is listed)."""
        from workbench.display.nodes import Code, Display, Paragraph

        checks = [part for check in self.spec.checks for part in (", ", Code(check))][1:]
        return Display(self.target.view(), Paragraph("Checks: ", *checks) if checks else None)


def _guarded(prepared):
    """guard.restored around a step that changes the shared model; nothing when there is no model to guard."""
    import contextlib

    model = getattr(prepared, "model", None)
    if model is None:
        return contextlib.nullcontext()
    from workbench.model.guard import restored

    return restored(model)


def open_notebook(name: str, parameters: Mapping[str, Any] | None = None, **options: Any) -> NotebookSession:
    """Options (the notebook's namespace, or keywords) -> the target, a findings recorder and the step runner.

    Only the contract's names are read from `parameters`; unknown keywords are an error."""
    import workbench.runtime as runtime
    from workbench.errors import UsageError
    from workbench.model.target import resolve_target
    from workbench.recorder import FindingsRecorder

    unknown = set(options) - set(NOTEBOOK_PARAMETERS)
    if unknown:
        raise UsageError(f"open_notebook: unknown options {sorted(unknown)}; the contract: {list(NOTEBOOK_PARAMETERS)}")
    runtime.quiet_and_offline()
    spec = notebook(name)
    values = {k: (parameters or {}).get(k, default) for k, default in NOTEBOOK_PARAMETERS.items()}
    values.update(options)
    values, _ = with_demo_fallback(values)
    batch = bool(os.environ.get("WORKBENCH_BATCH"))  # a diagnosis' own kernel
    recorder = FindingsRecorder(values["findings_path"] or f"findings.{name}.json", notebook=name,
                                interactive=not batch, step_peaks=batch)
    target = resolve_target(**{k: values[k] for k in TARGET_OPTIONS})
    if spec.needs_model:
        target.require_model()
    return NotebookSession(spec, target, recorder, values)


def parameters_cell_mismatch(path: str | Path, passed: Mapping[str, Any]) -> str | None:
    """Why papermill would run `path` with parameters its cell does not declare, or None when they match."""
    import papermill

    declared = set(papermill.inspect_notebook(str(path)))
    extra = sorted(set(passed) - declared)
    return (f"{Path(path).name}: its parameters cell lacks {extra} (the contract: {list(NOTEBOOK_PARAMETERS)})"
            if extra else None)


def _raising(exc: BaseException) -> Callable[..., Any]:
    def probe_that_does_not_import(*_args: Any, **_kwargs: Any) -> Any:
        raise exc

    return probe_that_does_not_import
