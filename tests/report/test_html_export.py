"""The notebooks' HTML export (`report.html_export.export_html`): one nbconvert exporter kept per thread, which writes
what an exporter made for each notebook writes."""

import base64
import threading

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from workbench.report.html_export import _html_exporter, export_html, new_html_exporter

PNG = base64.b64encode(bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000100e5270de40000000049454e44ae426082")).decode()


def executed_notebook(path, title: str, html: str, with_image: bool):
    outputs = [new_output("display_data", data={"text/html": html, "text/plain": title})]
    if with_image:
        outputs.append(new_output("display_data", data={"image/png": PNG, "text/plain": "<Figure>"}))
    outputs.append(new_output("stream", name="stdout", text=f"{title} done\n"))
    nb = new_notebook(cells=[new_markdown_cell(f"# {title}\n\nA *table* and `code`."),
                             new_code_cell("nb.run('step')", outputs=outputs, execution_count=1)])
    nbformat.write(nb, path)
    return path


def fresh_export(path) -> str:
    return new_html_exporter().from_notebook_node(nbformat.read(path, as_version=4))[0]


def test_the_kept_exporter_writes_what_a_fresh_one_writes_for_each_notebook(tmp_path):
    first = executed_notebook(tmp_path / "01_first.ipynb", "First", "<table><tr><td>a</td></tr></table>", True)
    second = executed_notebook(tmp_path / "02_second.ipynb", "Second", "<p>only text</p>", False)
    for path in (first, second, first):  # each export after another notebook's, by the same exporter
        export_html(path, tmp_path / "out.html")
        assert (tmp_path / "out.html").read_text() == fresh_export(path)
    page = (tmp_path / "out.html").read_text()
    assert "data:image/png;base64" in page and "First done" in page and "Second" not in page


def test_each_thread_keeps_an_exporter_of_its_own():
    here = _html_exporter()
    assert _html_exporter() is here
    other = []
    thread = threading.Thread(target=lambda: other.append(_html_exporter()))
    thread.start()
    thread.join()
    assert other[0] is not here


def test_the_remembered_filters_write_what_nbconvert_writes_without_them(tmp_path):
    """The report's exporter keeps `highlight_code` and `clean_html` results per process: each page, exported before
    and after those are kept (cells seen on another page, a magic cell's language, a long output past what is kept),
    is byte for byte what nbconvert's own HTMLExporter with the same options writes."""
    from nbconvert import HTMLExporter

    from workbench.report import html_export

    long_html = "<table>" + "".join(f"<tr><td>{i}</td><td>&lt;b&gt;</td></tr>" for i in range(4000)) + "</table>"
    assert len(long_html) > html_export._cleaned.longest
    notebooks = []
    for i, html in enumerate(["<p>a <b>bold</b> <script>alert(1)</script></p>", long_html, "<p>a <b>bold</b></p>"]):
        path = executed_notebook(tmp_path / f"0{i}.ipynb", f"Page {i}", html, with_image=i == 0)
        nb = nbformat.read(path, as_version=4)
        nb.cells.append(new_code_cell("nb.run('step')"))  # the source of the first code cell, again
        # the same source, highlighted as another language: the metadata is part of what is kept
        nb.cells.append(new_code_cell("nb.run('step')", metadata={"magics_language": "bash"}))
        nbformat.write(nb, path)
        notebooks.append(path)
    plain = HTMLExporter(**html_export.exporter_options())
    for path in [*notebooks, *notebooks]:  # the second round reads what the first one kept
        export_html(path, tmp_path / "out.html")
        assert (tmp_path / "out.html").read_text() == plain.from_notebook_node(nbformat.read(path, as_version=4))[0]
    assert html_export._highlighted.results and html_export._cleaned.results
