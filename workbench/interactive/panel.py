"""The interactive panel: diagnose a checkpoint in JupyterLab without writing code.

    import workbench as wb
    wb.panel()          # prefilled with the bundled demo; type another checkpoint folder to diagnose it

Pick a checkpoint (validated as you type: an adapter shows the base it resolves to and where that came from),
choose quantization, GPU count and set-up, tick the probe groups, press "Run probes". Probes run one by one with a
progress bar; their results land in tabs (dtype census, DataParallel, attributes, forward flow, findings) and
render exactly as in the batch report. Widgets are for interactive use only: batch reports stay static HTML.

The panel runs the ticked notebooks as one diagnosis (`report.diagnosis.Diagnosis`, as `workbench diagnose` and the
callback do): the same steps, recorders and answers rule, and a report (findings.json, index.html) in its findings
folder. A probe that crashes shows as an error in its tab and the next one runs. `PanelSession` holds that logic without widgets, so it is tested
without a browser; `Panel` lays widgets over it.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import Any, Callable

from workbench.catalog import NOTEBOOKS
from workbench.catalog import Step as CatalogStep
from workbench.errors import UsageError
from workbench.findings import Finding, worst_verdict
from workbench.model.target import QUANTS, Target, resolve_target

# One tick box and one tab per notebook that runs in one process (06 launches torchrun: `make diagnose` runs it).
# Evaluation loads every recipe (and builds the demo's on first use), the memory plan needs training arguments:
# offered, not ticked by default.
GROUPS = tuple(nb.group for nb in NOTEBOOKS if nb.panel and nb.name not in ("05_evaluation", "11_memory_plan"))
MORE_GROUPS = tuple(nb.group for nb in NOTEBOOKS if nb.panel and nb.group not in GROUPS)
TABS = (*GROUPS, *MORE_GROUPS, "Findings")


@dataclasses.dataclass(frozen=True)
class PanelStep:
    """A step of the catalog as the panel shows it: the notebook's group is its tick box and its tab."""

    step: CatalogStep
    group: str

    @property
    def label(self) -> str:
        return self.step.label

    @property
    def tab(self) -> str:
        return "" if self.step.name == "prepared" else self.group


def panel_notebooks(groups: set[str]) -> list[str]:
    """The catalog notebooks of the ticked groups, in notebook order."""
    return [nb.name for nb in NOTEBOOKS if nb.panel and nb.group in groups]


def panel_steps(groups: set[str]) -> list[PanelStep]:
    """The catalog's steps of the ticked notebooks in the order the diagnosis runs them (`run_order`: steps that
    load and free their own copy of the model first, never two copies resident)."""
    from workbench.catalog import notebook
    from workbench.report.diagnosis import run_order

    pairs = [(notebook(name), step) for name in panel_notebooks(groups) for step in notebook(name).steps]
    return [PanelStep(step, spec.group) for spec, step in run_order(pairs)]


def describe_target(target: Target) -> str:
    """One line for the validation label: what will be diagnosed, and the base an adapter resolved to."""
    if target.adapter_dir:
        return (f"adapter {target.adapter_dir.name} on base {target.base} (from {target.base_source}"
                + (f"; adapter_config.json records {target.recorded_base}" if target.base_source == "--base" else "")
                + ")")
    return f"model {target.model_dir}"


class PanelSession:
    """Validate a choice of checkpoint and options, run the chosen probe steps one by one, keep their results."""

    def __init__(self, findings_dir: str | Path | None = None) -> None:
        self.findings_dir = Path(findings_dir or tempfile.mkdtemp(prefix="workbench-panel-"))
        self.results: dict[str, list[Any]] = {tab: [] for tab in TABS}
        self.findings: list[Finding] = []
        self.diagnosis = None  # the last run's (report.diagnosis.Diagnosis)
        self.report: Path | None = None  # its report folder: findings.json and index.html, as `diagnose` writes

    @staticmethod
    def validate(checkpoint: str, *, base: str = "", quant: str = "none", gpus: int = 0,
                 setup: str = "plain", data: str = "") -> Target:
        """The resolved target, or UsageError with the one-line reason (shown under the path box)."""
        target = resolve_target(checkpoint.strip(), base=base.strip() or None, quant=quant, gpus=gpus,
                                setup=setup.strip() or "plain", data=data.strip() or None)
        target.require_model()  # the panel's notebooks all load the model
        return target

    def steps_for(self, groups: set[str]) -> list[PanelStep]:
        return panel_steps(groups)

    def run(self, target: Target, groups: set[str],
            on_step: Callable[[int, int, PanelStep, float | None], None] | None = None) -> list[Finding]:
        """Run the ticked groups' notebooks as one diagnosis, step by step; `on_step(i, n, step, seconds)` before
        (None) and after each. The report (findings.json, index.html) goes to a new folder of `findings_dir`."""
        from workbench.report.diagnosis import Diagnosis

        self.free()
        self.results = {tab: [] for tab in TABS}
        diagnosis = self.diagnosis = Diagnosis.plan(target, panel_notebooks(groups))
        folder = self.findings_dir / f"{diagnosis.report.run_id}"
        folder.mkdir(parents=True)

        def each_step(i: int, n: int, part, step, seconds: float | None) -> None:
            shown = PanelStep(step, part.spec.group)
            if seconds is not None and shown.tab:
                self.results[shown.tab].append(diagnosis.shown[part.name][-1][1])
            if on_step:
                on_step(i, n, shown, seconds)

        diagnosis.run_in_process(folder, interactive=True, on_step=each_step)
        self.report = diagnosis.publish(folder)
        self.findings = list(diagnosis.findings)
        self.results["Findings"] = [diagnosis]
        return self.findings

    def free(self) -> None:
        """Drop the previous run's model before loading the next (gc, and the CUDA cache where there is one)."""
        from workbench.model.shared import free_shared

        if self.diagnosis is not None:
            for session in self.diagnosis.sessions.values():
                session.results.clear()
        free_shared()


class Panel:
    """The widget layout over a PanelSession. Display it as the last expression of a cell."""

    def __init__(self, checkpoint: str | None = None, **options: Any) -> None:
        import ipywidgets as w

        from workbench.model.setups import BUILTIN_SETUPS

        if checkpoint is None:  # prefilled with the demo as `make diagnose` runs it
            from workbench.notebook import with_demo_fallback

            demo, _ = with_demo_fallback({})
            checkpoint = demo["checkpoint"]
            options = {"quant": demo["quant"], "setup": demo["setup"], "gpus": demo["gpus"], **options}
        self.session = PanelSession()
        self.target: Target | None = None
        wide = w.Layout(width="640px")
        self.path = w.Text(value=checkpoint, description="Checkpoint", placeholder="folder with config.json, "
                           "or an adapter folder", layout=wide, continuous_update=False)
        self.base = w.Text(value=options.get("base", ""), description="Base", layout=wide, continuous_update=False,
                           placeholder="empty: the base recorded in adapter_config.json")
        self.quant = w.Dropdown(options=list(QUANTS), value=options.get("quant", "none"), description="Quant")
        self.gpus = w.BoundedIntText(value=int(options.get("gpus") or 0), min=0, max=64, description="GPUs",
                                     tooltip="the GPUs one training process sees; 0: not stated")
        self.setup = w.Combobox(value=options.get("setup", "plain"), options=list(BUILTIN_SETUPS),
                                description="Set-up", placeholder="plain | qlora | … | module:function")
        self.data = w.Text(value=options.get("data", ""), description="Data", layout=wide, continuous_update=False,
                           placeholder="training data for the data path: a JSONL or a save_to_disk folder")
        self.status = w.HTML()
        self.groups = {g: w.Checkbox(value=g in GROUPS, description=g, indent=False, layout=w.Layout(width="150px"))
                       for g in (*GROUPS, *MORE_GROUPS)}
        self.button = w.Button(description="Run probes", button_style="primary", icon="play")
        self.progress = w.IntProgress(value=0, min=0, max=1, description="", layout=w.Layout(width="300px"))
        self.step_label = w.HTML()
        self.outputs = {tab: w.Output() for tab in TABS}
        self.tabs = w.Tab(children=[self.outputs[t] for t in TABS])
        for i, tab in enumerate(TABS):
            self.tabs.set_title(i, tab)
        for widget in (self.path, self.base, self.quant, self.gpus, self.setup, self.data):
            widget.observe(lambda _change: self.validate(), names="value")
        self.button.on_click(lambda _button: self.run())
        self.widget = w.VBox([
            w.HTML("<b>Workbench</b> · diagnose a checkpoint: pick it, choose the options, run the probes"),
            self.path, self.base, w.HBox([self.quant, self.gpus, self.setup]), self.data, self.status,
            w.HBox(list(self.groups.values())), w.HBox([self.button, self.progress, self.step_label]), self.tabs,
        ])
        self.widget.add_class("workbench-panel")
        self.validate()

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)

    def validate(self) -> Target | None:
        from workbench.display.nodes import esc

        try:
            self.target = self.session.validate(self.path.value, base=self.base.value, quant=self.quant.value,
                                                gpus=self.gpus.value, setup=self.setup.value,
                                                data=self.data.value)
        except UsageError as exc:
            self.target = None
            self.status.value = f'<span style="color:#c62828">✗ {esc(str(exc))}</span>'
        else:
            self.status.value = f'<span style="color:#2e7d32">✓ {esc(describe_target(self.target))}</span>'
        self.button.disabled = self.target is None
        return self.target

    def run(self) -> list[Finding]:
        from workbench.display.nodes import esc

        if self.validate() is None:
            return []
        for out in self.outputs.values():
            out.clear_output()
        self.button.disabled = True
        groups = {g for g, box in self.groups.items() if box.value}

        def on_step(i: int, n: int, step: PanelStep, seconds: float | None) -> None:
            self.progress.max = n
            if seconds is None:
                self.step_label.value = f"{i}/{n} · {esc(step.label)} …"
                return
            self.progress.value = i
            self.step_label.value = f"{i}/{n} · {esc(step.label)} ({seconds:.1f} s)"
            if step.tab:
                self.outputs[step.tab].append_display_data(self.session.results[step.tab][-1])

        try:
            findings = self.session.run(self.target, groups, on_step)
            self.outputs["Findings"].append_display_data(self.session.results["Findings"][0])
            worst = worst_verdict(f.verdict for f in findings)
            self.step_label.value += (f" · done: {len(findings)} findings"
                                      + (f", worst {worst.upper()}" if worst else ""))
            self.tabs.selected_index = TABS.index("Findings")
        finally:
            self.button.disabled = False
        return findings


def panel(checkpoint: str | None = None, **options: Any) -> Panel:
    """The interactive workbench; `checkpoint=None` prefills the bundled demo (built on first use)."""
    return Panel(checkpoint, **options)
