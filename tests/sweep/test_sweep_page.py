"""The sweep's comparison page in a real browser (Debian's headless Chromium driven by Playwright, as
tests/report/test_browser.py drives the reports): it opens offline, its checks × members table links every verdict
to a page of the member's report that exists, its plots are inline images. Skipped, saying so, where Chromium or
Playwright is missing."""

import re
import shutil

import pytest
from repo import ROOT

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - requirements.txt pins it
    sync_playwright = None

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed: browser tests skipped"),
    pytest.mark.skipif(sync_playwright is None, reason="Playwright is not installed: browser tests skipped"),
]


def test_the_comparison_page_reads_in_chromium_offline_with_every_verdict_linked(local_sweep):
    folder = local_sweep.folder
    members = [m["name"] for m in local_sweep.document["members"]]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        context = browser.new_context(viewport={"width": 1280, "height": 1000})
        leaks: list[str] = []
        context.route(re.compile(r"^https?://"), lambda route: (leaks.append(route.request.url), route.abort()))
        page = context.new_page()
        page.goto(folder.joinpath("index.html").as_uri())
        assert page.locator("h1").first.inner_text().startswith("12 · The sweep")
        table = page.locator("table:has(th:text-is('check'))")
        assert table.locator("thead th").all_inner_texts() == ["check", *members]
        rows = table.locator("tbody tr")
        checks = rows.locator("th").all_inner_texts()  # each row headed by its check
        assert {"adapter.weights", "tokenizer.vocab"} <= set(checks)
        nan_weights = rows.filter(has_text="adapter.weights").locator("td").nth(members.index("nan"))
        assert nan_weights.inner_text() == "FAIL"  # the planted fault, in its member's column
        cells = rows.locator("td a[href]")
        assert cells.count() == len(checks) * len(members)  # every verdict is a link
        targets = {cells.nth(i).get_attribute("href").split("#")[0] for i in range(cells.count())}
        assert targets and all((folder / target).is_file() for target in targets)
        assert page.locator("img[src^='data:image/png;base64']").count() >= 1  # the per-member plots, inline
        shots = ROOT / "reports" / "screenshots"
        shots.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=shots / "sweep-index.png", full_page=True)
        context.close()
        browser.close()
    assert not leaks, f"the page fetched from the internet: {leaks}"
    assert (shots / "sweep-index.png").stat().st_size > 50_000  # a rendered page, not a blank one
