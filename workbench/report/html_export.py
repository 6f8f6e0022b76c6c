"""The notebooks' HTML pages: nbconvert's HTMLExporter with the workbench_report template, one exporter kept per
thread, and nbconvert's two costliest filters remembered per process.

    export_html(executed_ipynb, html_path)

Of a notebook's export, about half is two pure functions of a string that every page calls again on the same
strings: `highlight_code` (pygments, a fresh HtmlFormatter and its stylesheet per code cell) on the code cells, which
are the committed notebooks' own in every diagnosis, and `clean_html` (bleach's html5lib sanitizer) on those cells
and on outputs that repeat (the same finding of a skip, the same table of an unchanged check). Their results are kept
(`_Remembered`), keyed by everything they read, so that a sweep's members, a run's checkpoints and the test suite's
diagnoses export each distinct string once; the page is byte for byte what nbconvert writes without them
(tests/report/test_html_export.py).
"""

from __future__ import annotations

import collections
import json
import threading
from pathlib import Path

from workbench.paths import REPORT_TEMPLATE_DIR

_exporters = threading.local()


def export_html(executed: Path, html_path: Path) -> None:
    """Self-contained HTML with the workbench_report template (JupyterLab's markup, a compact stylesheet): code
    present but hidden until 'show code' is clicked, images inline, nothing fetched from the internet."""
    import nbformat

    body, _ = _html_exporter().from_notebook_node(nbformat.read(executed, as_version=4))
    html_path.write_text(body)


def _html_exporter():
    """One exporter per thread, kept: each HTMLExporter compiles the template's 99 Jinja files into an environment of
    its own (1.2 of the 2.5 s of CPU nine notebooks took with an exporter each); a notebook's export reads nothing an
    earlier one left in it. Per thread: the notebooks of a side-by-side diagnosis are exported in their threads."""
    exporter = getattr(_exporters, "html", None)
    if exporter is None:
        exporter = _exporters.html = new_html_exporter()
    return exporter


def exporter_options() -> dict:
    """The report's nbconvert options: the workbench_report template, no prompts, images embedded."""
    return dict(template_name="workbench_report", extra_template_basedirs=[str(REPORT_TEMPLATE_DIR)],
                exclude_input_prompt=True, exclude_output_prompt=True, embed_images=True)


def new_html_exporter():
    """The report's exporter: nbconvert's HTMLExporter (`exporter_options`) whose `highlight_code` and `clean_html`
    filters remember their results."""
    from nbconvert import HTMLExporter

    class ReportExporter(HTMLExporter):
        def default_filters(self):
            for name, value in super().default_filters():
                yield name, (_remembered_clean_html if name == "clean_html" else value)

        def register_filter(self, name, jinja_filter):
            # HTMLExporter registers a Highlight2HTML of the notebook's own lexer at each from_notebook_node
            if name == "highlight_code" and callable(jinja_filter) and not isinstance(jinja_filter, type):
                jinja_filter = _RememberedHighlight(jinja_filter)
            return super().register_filter(name, jinja_filter)

    return ReportExporter(**exporter_options())


class _Remembered:
    """A pure function of strings with its results kept: the last `entries` calls, of strings up to `longest`
    characters (a longer one is computed each time: it is rarely seen twice, and would crowd the rest out)."""

    def __init__(self, entries: int = 4096, longest: int = 64 * 1024) -> None:
        self.entries, self.longest = entries, longest
        self.results: collections.OrderedDict = collections.OrderedDict()
        self.lock = threading.Lock()  # the exporters of side-by-side notebooks share it

    def get(self, key, size: int, compute):
        if size > self.longest:
            return compute()
        with self.lock:
            if key in self.results:
                self.results.move_to_end(key)
                return self.results[key]
        value = compute()
        with self.lock:
            self.results[key] = value
            while len(self.results) > self.entries:
                self.results.popitem(last=False)
        return value


_cleaned = _Remembered()
_highlighted = _Remembered()


def _remembered_clean_html(element):
    """nbconvert's `clean_html` (bleach, with nbconvert's tags, attributes and CSS sanitizer), remembered."""
    from nbconvert.filters.strings import clean_html

    text = element.decode() if isinstance(element, bytes) else str(element)
    return _cleaned.get(text, len(text), lambda: clean_html(text))


class _RememberedHighlight:
    """A Highlight2HTML, its results remembered by everything it reads: the source, the language asked (else its
    notebook's lexer), the cell metadata (a magic's language) and its formatter options."""

    def __init__(self, highlighter) -> None:
        self.highlighter = highlighter

    def __call__(self, source, language=None, metadata=None):
        key = (source, language or getattr(self.highlighter, "pygments_lexer", None),
               json.dumps(metadata or {}, sort_keys=True, default=str),
               json.dumps(getattr(self.highlighter, "extra_formatter_options", {}), sort_keys=True, default=str))
        return _highlighted.get(key, len(source), lambda: self.highlighter(source, language, metadata))
