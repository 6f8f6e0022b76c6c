"""The check catalog is the one source: the CLI prints it, the README's table is its markdown, the recorder and the
runner take check ids from it."""

import json
import subprocess
import sys
from pathlib import Path

from workbench.catalog import CHECKS, check, checks_reported_by, markdown_table
from workbench.recorder import FindingsRecorder

README = Path(__file__).resolve().parents[1] / "README.md"


def workbench_cli(*args):
    return subprocess.run([sys.executable, "-m", "workbench", *args], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


def test_checks_prints_every_check_and_json_for_tools():
    text = workbench_cli("checks")
    assert text.returncode == 0 and all(c.id in text.stdout for c in CHECKS)
    data = json.loads(workbench_cli("checks", "--json").stdout)
    assert [c["id"] for c in data["checks"]] == [c.id for c in CHECKS]
    assert data["checks"][0]["verdicts"] and data["notebooks"][0]["steps"][0] == "files"


def test_the_readme_catalog_is_the_catalogs_markdown():
    assert markdown_table() in README.read_text(), "README's catalog table is stale: paste `python -m workbench " \
                                                   "checks --markdown` between the catalog markers"
    assert workbench_cli("checks", "--markdown").stdout.strip() == markdown_table()


def test_a_crashing_probe_reports_error_on_the_checks_the_catalog_gives_it(tmp_path):
    import workbench.probes.forward.grad_flow as grad_flow

    def grad_flow_probe(*args):
        raise RuntimeError("planted")
    grad_flow_probe.__module__ = grad_flow.__name__
    assert checks_reported_by(grad_flow_probe) == ("grad.flow",)
    rec = FindingsRecorder(tmp_path / "f.json", notebook="04_forward_checks")
    failed = rec.run(grad_flow_probe)
    assert not failed and [(f.id, f.verdict) for f in rec.findings] == [("grad.flow", "error")]
    assert check("grad.flow").verdicts["skip"] == "nothing trainable"


def test_interactive_failures_keep_the_exception_for_debugging(tmp_path):
    def boom():
        raise ValueError("look at me in %debug")
    rec = FindingsRecorder(tmp_path / "f.json", notebook="x", interactive=True)
    failed = rec.run(boom)
    assert isinstance(failed.exception, ValueError) and sys.last_value is failed.exception
    assert sys.last_traceback is failed.exception.__traceback__ and "%debug" in failed._repr_html_()
    batch = FindingsRecorder(tmp_path / "g.json", notebook="x").run(boom)
    assert isinstance(batch.exception, ValueError)  # kept in batch runs too; only %debug's slot is left alone


def test_the_readmes_detailed_table_describes_exactly_the_catalogs_checks():
    import re

    text = README.read_text()
    start = text.index("| id | notebook | in detail | verdicts |")
    table = text[start:text.index("\n\n", start)]  # one table: a blank line would end it early
    assert re.findall(r"^\| `([a-z0-9_.]+)` \|", table, re.M) == [c.id for c in CHECKS]
