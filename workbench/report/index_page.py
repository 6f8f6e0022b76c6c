"""index.html: a one-page summary of a report that leads with the verdict. Static, offline, escaped."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from workbench.findings import Finding, sort_findings, worst_verdict, write_text_atomic
from workbench.report.display import Badge, Code, Link, Table
from workbench.report.html import esc, findings_table, verdict_badge

STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;max-width:1100px;color:#222}
table{border-collapse:collapse;width:100%;margin:0.5em 0}
th,td{border-bottom:1px solid #ddd;padding:6px 8px;vertical-align:top;text-align:left;font-size:0.92em;
   overflow-wrap:anywhere}
th{background:#f5f5f5} code{font-size:0.9em} pre{white-space:pre-wrap;font-size:0.8em;max-height:24em;overflow:auto}
.summary{font-size:1.2em;margin:0.5em 0 1em}
.wb-findings th,.wb-findings td:nth-child(1),.wb-findings td:nth-child(2),
.wb-findings td:nth-child(4){white-space:nowrap;
   overflow-wrap:normal}
"""


def _kv_table(data: dict[str, Any]) -> str:
    rows = [[k, Code(v)] for k, v in data.items() if v not in (None, "", [], {})]
    return Table(None, rows, css_class="", row_headers=True).html()


def _notebooks_table(runs: list[dict[str, Any]]) -> str:
    rows = [[Badge("error" if run["status"] == "error" else "pass"),
             Link(run["html"], run["name"]) if run.get("html") else run["name"], f"{run['seconds']:.1f} s",
             Link(f"{run['name']}.ipynb", "notebook"), run.get("error") or ""] for run in runs]
    return Table(["status", "report", "time", "executed", "error"], rows, css_class="").html()


def _cost(report: dict[str, Any]) -> str:
    """What the diagnosis cost: full model loads (and where), kernels, seconds, peak memory of the kernel."""
    cost = report.get("cost")
    if not cost:
        return ""
    where = Counter(load.get("notebook", "?")[:2] for load in cost.get("loads", []))
    peak = cost.get("peak_rss_bytes")
    return (f"<h2>Cost</h2><p>{cost['model_loads']} model loads"
            + (f" ({esc(', '.join(f'{n} in {nb}' for nb, n in sorted(where.items())))})" if where else "")
            + f" &middot; {cost['kernels_started']} kernel(s) &middot; {cost['seconds']:.1f} s of notebooks"
            + (f" &middot; peak memory of the kernel {peak / 1e9:.2f} GB" if peak else "") + "</p>")


def render_index(report: dict[str, Any]) -> str:
    findings = [Finding.from_dict(f) for f in report["findings"]]
    worst = worst_verdict(f.verdict for f in findings) or "pass"
    counts = Counter(f.verdict for f in findings)
    summary = ", ".join(f"{n} {v}" for v, n in sorted(counts.items(), key=lambda kv: kv[0]))
    headline = next((f for f in sort_findings(findings)), None)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Diagnosis: {esc(report['target']['checkpoint'])}</title>
<style>{STYLE}</style></head><body>
<h1>Diagnosis {verdict_badge(worst)}</h1>
<p class="summary">{esc(headline.title) if headline else 'No findings.'}</p>
<p>{esc(summary)} &middot; created {esc(report['created'])} &middot; run <code>{esc(report['run_id'])}</code></p>
<h2>Findings, worst first</h2>
{findings_table(findings, link_notebooks=True)}
<h2>Notebooks</h2>
{_notebooks_table(report["notebooks"])}
{_cost(report)}
<h2>Target</h2>{_kv_table(report['target'])}
<h2>Environment</h2>{_kv_table(report['environment'])}
<p><a href="findings.json">findings.json</a> (schema version {report['schema_version']})</p>
</body></html>"""


def write_index(folder: Path, report: dict[str, Any]) -> Path:
    path = Path(folder) / "index.html"
    path.write_text(render_index(report))
    return path


def write_reports_index(reports_dir: Path) -> Path:
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
                     f"{target.get('quant', '')} · {target.get('gpus', '')} GPU(s) · {target.get('setup', '')}",
                     ", ".join(f"{n} {v}" for v, n in sorted(counts.items()))])
    table = Table(["worst", "run", "checkpoint", "set-up", "verdicts"], rows, css_class="").html()
    page = (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>Diagnosis reports</title>"
            f"<style>{STYLE}</style></head><body><h1>Diagnosis reports</h1><p>{len(rows)} run(s), newest first.</p>"
            f"{table}</body></html>")
    path = Path(reports_dir) / "index.html"
    write_text_atomic(path, page)  # two runs finishing at once never leave half a page
    return path
