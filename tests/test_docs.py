"""The README is a landing page; every page it and docs/ link to exists."""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_the_readme_is_a_landing_page():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    for heading in ("## Two commands", "## The command line", "## Check catalog", "## Reading a report"):
        assert heading in text


def test_every_relative_link_resolves():
    broken = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" not in target and not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken


def test_no_page_leans_on_words_a_newcomer_cannot_look_up():
    for page in PAGES:
        text = page.read_text()
        assert not re.search(r"\bthe seeds\b|\bseeds'|design\.md|before issue \d+", text), page.name


@pytest.mark.slow
def test_the_readmes_python_snippet_runs_as_written(demo, capsys, tmp_path, monkeypatch):
    snippet = re.search(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    namespace: dict = {}
    monkeypatch.chdir(tmp_path)  # as a user's folder: the findings it records go there, not into this checkout
    exec(snippet.replace("/path/to/adapter", str(demo.qwen_stage2)), namespace)  # noqa: S102 - our own README
    assert repr(namespace["grads"]) == "<GradFlowResult grad.flow: pass>"
    assert "grad.flow" in capsys.readouterr().out
    sidecar = json.loads((tmp_path / "findings.04_forward_checks.json").read_text())
    assert [(f["id"], f["verdict"]) for f in sidecar["findings"]] == [("grad.flow", "pass")]
