"""Debian's headless Chromium driven by Playwright, for the tests that open a page (the reports, JupyterLab): the
markers that skip them, saying why, where Chromium or Playwright is missing (.ci/run installs Debian's chromium when
it can), and the browser launch (`executable_path`: no browser download)."""

from __future__ import annotations

import contextlib
import shutil

import pytest
from repo import ROOT

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - requirements.txt pins it
    sync_playwright = None

NEEDS_CHROMIUM = [
    pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed: browser tests skipped"),
    pytest.mark.skipif(sync_playwright is None, reason="Playwright is not installed: browser tests skipped"),
]
SCREENSHOTS = ROOT / "reports" / "screenshots"


@contextlib.contextmanager
def launched_chromium():
    """A headless Chromium for the block."""
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            yield chromium
        finally:
            chromium.close()
