"""index.html: a one-page summary of a report that leads with the verdict. Static, offline, escaped."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from workbench.display.findings_view import findings_block
from workbench.display.nodes import Badge, Bold, Code, Display, Heading, Link, Paragraph, Table, esc
from workbench.findings import Finding, sort_findings, worst_verdict, write_text_atomic

STYLESHEET = Path(__file__).parent / "template" / "workbench_report" / "report.css"  # the notebooks' pages use it too


def page(title: str, body: Display) -> str:
    """A static page around a display: the report stylesheet inlined, nothing fetched."""
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
            f"<style>{STYLESHEET.read_text()}</style></head><body><main>{body.html()}</main></body></html>")


def _kv_table(data: dict[str, Any]) -> Table:
    rows = [[k, Code(v)] for k, v in data.items() if v not in (None, "", [], {})]
    return Table(None, rows, css_class="", row_headers=True)


def _notebooks_table(runs: list[dict[str, Any]]) -> Table:
    rows = [[Badge("error" if run["status"] == "error" else "pass"),
             Link(run["html"], run["name"]) if run.get("html") else run["name"], f"{run['seconds']:.1f} s",
             Link(f"{run['name']}.ipynb", "notebook") if run.get("html") else "", run.get("error") or ""]
            for run in runs]
    return Table(["status", "report", "time", "executed", "error"], rows, css_class="")


SLOWEST_STEPS = 8  # the cost section's table of probe steps


def _cost(report: dict[str, Any]) -> Display:
    """What the diagnosis cost: full model loads (and where), kernels, seconds, peak memory of the kernel, the
    slowest probe steps."""
    cost = report.get("cost")
    if not cost:
        return Display()
    loads = cost.get("loads", [])
    where = Counter(load.get("notebook", "?")[:2] for load in loads)
    peak = cost.get("peak_rss_bytes")
    why = Table(["notebook", "quant", "seconds", "why it was loaded"],
                [[load.get("notebook", "?"), load.get("quant", ""),
                  "" if load.get("seconds") is None else f"{load['seconds']:.2f}", load.get("why", "")]
                 for load in loads], left=True) if loads else Display()
    sweep = cost.get("sweep")  # a sweep's member: where its engine ran it, and the attempts a lost worker cost
    retried = Paragraph(f"Run by the sweep's {sweep['engine']} engine on {sweep.get('host', '?')} in "
                        f"{sweep['attempts']} attempt(s)" + "".join(f"; attempt {a['attempt']} lost: {a['lost']}"
                                                                   for a in sweep.get("lost_attempts", []))) \
        if sweep else None
    timed = [s for s in cost.get("steps") if isinstance(s, dict) and isinstance(s.get("seconds"), (int, float))] \
        if isinstance(cost.get("steps"), list) else []
    steps = sorted(timed, key=lambda s: -s["seconds"])[:SLOWEST_STEPS]
    # a step that declares no check shows a result a later step judges (03's wrapping chain, 01's quantized census)
    # full-model forwards (recorder: `model.passes`), "with autograd" those a backward follows, and the kernel's
    # peak resident memory during the step (`peak_memory.step_peak_rss`); a report written before either has none
    slowest = Table(["notebook", "step", "checks", "seconds", "forwards", "peak memory"],
                    [[s.get("notebook", "?"), s.get("step", "?"), ", ".join(s.get("checks") or []) or "none declared",
                      f"{s['seconds']:.2f}", _forwards(s), _gigabytes(s.get("peak_rss_bytes"))] for s in steps],
                    left=True) if steps else Display()
    return Display(Heading("Cost", level=2), retried, Paragraph(
        f"{cost['model_loads']} model loads"
        + (f" ({', '.join(f'{n} in {nb}' for nb, n in sorted(where.items()))})" if where else "")
        + (" · the kernel of the previous diagnosis, kept and reset"
           + (f", and {cost['kernels_started']} kernel(s) started" if cost["kernels_started"] else "")
           if cost.get("kernel_kept") else f" · {cost['kernels_started']} kernel(s)")
        + f" · {cost['seconds']:.1f} s of notebooks"
        + (f" · peak memory of the kernel {peak / 1e9:.2f} GB" if peak else "")), why,
        Paragraph(f"The slowest probe steps (of {len(timed)}):") if steps else None, slowest)


def _gigabytes(value) -> str:
    return f"{value / 1e9:.2f} GB" if isinstance(value, int) else ""


def _forwards(step: dict) -> str:
    forwards, with_grad = step.get("forwards"), step.get("forwards_with_grad")
    if not isinstance(forwards, int):
        return ""
    return f"{forwards} ({with_grad} with autograd)" if with_grad else str(forwards)


def index_view(report: dict[str, Any], lead: Display | None = None) -> Display:
    """index.html's content: the verdict first (below `lead`, explain's symptom and causes, when given), then every
    finding, the notebooks, the cost, target, environment."""
    findings = [Finding.from_dict(f) for f in report["findings"]]
    worst = worst_verdict(f.verdict for f in findings) or "pass"
    counts = Counter(f.verdict for f in findings)
    summary = ", ".join(f"{n} {v}" for v, n in sorted(counts.items(), key=lambda kv: kv[0]))
    headline = next((f for f in sort_findings(findings)), None)
    run = report["target"].get("run")  # a Trainer output_dir: which of its folders was diagnosed, and why
    return Display(
        lead,
        Heading("Diagnosis ", Badge(worst), level=1),
        Paragraph("Diagnosed: ", Code(run)) if run else None,
        Paragraph(Bold(headline.title) if headline else "No findings."),
        Paragraph(f"{summary} · created {report['created']} · run ", Code(report["run_id"])),
        Heading("Findings, worst first", level=2), findings_block(
            findings, link_notebooks={n["name"] for n in report["notebooks"] if n.get("html")}),
        Heading("Notebooks", level=2), _notebooks_table(report["notebooks"]),
        _cost(report),
        Heading("Target", level=2), _kv_table(report["target"]),
        Heading("Environment", level=2), _kv_table(report["environment"]),
        Paragraph(Link("findings.json", "findings.json"), f" (schema version {report['schema_version']})"))


def render_index(report: dict[str, Any], lead: Display | None = None) -> str:
    return page(f"Diagnosis: {report['target']['checkpoint']}", index_view(report, lead))


def write_index(folder: Path, report: dict[str, Any]) -> Path:
    path = Path(folder) / "index.html"
    path.write_text(render_index(report))
    return path


def write_reports_index(reports_dir: Path, title: str = "Diagnosis reports") -> Path:
    """reports/index.html: every completed run, newest first, with its worst verdict and target."""
    import json

    rows = []
    for findings_json in sorted(Path(reports_dir).glob("*/*/findings.json"), reverse=True):
        folder = findings_json.parent
        if folder.name.startswith("."):
            continue
        try:
            report = json.loads(findings_json.read_text())
        except (OSError, ValueError):
            continue
        verdicts = [f.get("verdict", "error") for f in report.get("findings", [])]
        worst = worst_verdict(verdicts) or "pass"
        counts = Counter(verdicts)
        rel = f"{folder.parent.name}/{folder.name}/index.html"
        target = report.get("target", {})
        rows.append([Badge(worst), Link(rel, f"{folder.parent.name} {folder.name}"),
                     Code(target.get("checkpoint", "")),
                     f"{target.get('quant', '')} · {gpus_text(target.get('gpus'))} · {target.get('setup', '')}",
                     ", ".join(f"{n} {v}" for v, n in sorted(counts.items()))])
    table = Table(["worst", "run", "checkpoint", "set-up", "verdicts"], rows, css_class="")
    listing = page(title, Display(Heading(title, level=1),
                                                Paragraph(f"{len(rows)} run(s), newest first."), table))
    path = Path(reports_dir) / "index.html"
    write_text_atomic(path, listing)  # two runs finishing at once never leave half a page
    return path


def gpus_text(gpus) -> str:
    """The target's GPU count as a report shows it: `None` is the user not saying."""
    return "GPUs not stated" if gpus is None else f"{gpus} GPU(s)"
