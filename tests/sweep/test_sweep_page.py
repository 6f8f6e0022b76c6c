"""The sweep's comparison page in a real browser (Debian's headless Chromium driven by Playwright, as the reports are
read: tests/headless_chromium.py): it opens offline, its checks × members table links every verdict to a page of the
member's report that exists, its plots are inline images. Skipped, saying so, where Chromium or Playwright is
missing."""

import re

import pytest
from headless_chromium import NEEDS_CHROMIUM, SCREENSHOTS, launched_chromium

pytestmark = [pytest.mark.slow, *NEEDS_CHROMIUM]


def test_the_comparison_page_reads_in_chromium_offline_with_every_verdict_linked(local_sweep):
    folder = local_sweep.folder
    members = [m["name"] for m in local_sweep.document["members"]]
    leaks: list[str] = []
    with launched_chromium() as browser:
        context = browser.new_context(viewport={"width": 1280, "height": 1000})
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
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=SCREENSHOTS / "sweep-index.png", full_page=True)
        context.close()
    assert not leaks, f"the page fetched from the internet: {leaks}"
    assert (SCREENSHOTS / "sweep-index.png").stat().st_size > 50_000  # a rendered page, not a blank one
