"""The shared report in a real browser: headless Chromium renders index.html, its links resolve, a screenshot is
kept. Skipped, saying so, where Chromium is not installed (.ci/run installs Debian's package when it can)."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed: browser tests skipped")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium(*args, profile: Path) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True,
                          timeout=120)


@pytest.fixture(scope="module")
def report(demo, tmp_path_factory):
    import sys

    reports = tmp_path_factory.mktemp("reports")
    result = subprocess.run([sys.executable, "-m", "workbench", "diagnose", str(demo.qwen_stage2), "--quant", "4bit",
                             "--setup", "qlora_trl_legacy", "--gpus", "2", "--notebooks", "01", "02",
                             "--reports-dir", str(reports)], capture_output=True, text=True, timeout=900)
    assert result.returncode in (0, 1), result.stderr
    return Path(result.stdout.strip().splitlines()[-1].removeprefix("report: "))


def test_index_renders_the_verdict_table_and_its_links_resolve(report, tmp_path):
    dom = chromium("--dump-dom", report.joinpath("index.html").as_uri(), profile=tmp_path / "p").stdout
    assert "<h1>Diagnosis" in dom and "parallel.trainer_wrap" in dom and "dtype.fp32_islands" in dom
    links = set(re.findall(r'href="([^"#]+)"', dom))
    assert {"01_dtype_distribution.html", "02_dataparallel.html", "findings.json"} <= links
    assert all((report / link).exists() for link in links)


def test_reports_index_lists_the_run(report, tmp_path):
    dom = chromium("--dump-dom", (report.parent.parent / "index.html").as_uri(), profile=tmp_path / "p").stdout
    assert f"{report.parent.name}/{report.name}/index.html" in dom and "WARN" in dom.upper()


def test_notebook_page_renders_offline_and_is_screenshotted(report, tmp_path):
    page = report / "02_dataparallel.html"
    dom = chromium("--dump-dom", page.as_uri(), profile=tmp_path / "p").stdout
    assert "Will the Trainer wrap the model in DataParallel?" in dom and "wb-code-toggle" in dom
    shot = report / "02_dataparallel.png"
    chromium("--window-size=1200,1800", f"--screenshot={shot}", page.as_uri(), profile=tmp_path / "q")
    assert shot.exists() and shot.stat().st_size > 50_000  # a rendered page, not a blank one
