"""The interactive panel without a browser (its widgets hold their state in Python), the display model of results,
and the JupyterLab workspace `make lab` opens."""

import json

from workbench.display.nodes import Bold, Code, Details, Display, Heading, Paragraph, Pre, Table
from workbench.interactive.lab import workspace
from workbench.interactive.panel import GROUPS, Panel, PanelSession


def test_the_path_box_validates_and_shows_the_base_an_adapter_resolves_to(demo, tmp_path):
    panel = Panel(str(demo.qwen_stage2))
    assert "✓" in panel.status.value and str(demo.qwen_stage1) in panel.status.value
    assert "adapter_config.json" in panel.status.value and not panel.button.disabled

    panel.base.value = str(demo.qwen_base)  # an override is shown with what the adapter records
    assert f"from --base; adapter_config.json records {demo.qwen_stage1}" in panel.status.value

    panel.path.value = str(tmp_path / "missing")
    assert "✗" in panel.status.value and "does not exist" in panel.status.value and panel.button.disabled
    assert panel.run() == []  # nothing runs on an invalid choice

    panel.path.value, panel.base.value = str(demo.llama), ""
    panel.gpus.value = 2
    assert "model" in panel.status.value and panel.session.validate(str(demo.llama), gpus=2).gpus == 2


def test_run_probes_fills_the_tabs_and_finds_the_demo_crash(demo):
    panel = Panel(str(demo.qwen_stage2), quant="4bit", setup="qlora_trl_legacy", gpus=2)
    findings = panel.run()
    verdicts = {f.id: f.verdict for f in findings}
    assert verdicts["forward.dtype_flow"] == "fail" and verdicts["parallel.trainer_wrap"] == "warn"
    assert verdicts["checkpoint.integrity"] == "pass" and "peft.attributes" in verdicts
    assert verdicts["adapter.weights"] == "pass" and verdicts["tokenizer.special_tokens"] == "pass"  # notebook 00
    assert panel.progress.value == panel.progress.max == len(panel.session.steps_for(set(GROUPS)))
    assert "done: " in panel.step_label.value and "worst FAIL" in panel.step_label.value
    for tab in (*GROUPS, "Findings"):  # every ticked notebook's tab got a rendered result, HTML and text
        out = panel.outputs[tab]
        assert out.outputs, f"tab {tab} is empty"
        assert all({"text/html", "text/plain"} <= set(o["data"]) for o in out.outputs)
    flow = " ".join(o["data"]["text/html"] for o in panel.outputs["Forward flow"].outputs)
    assert "language_model.norm" in flow and "lm_head" in flow  # the break, named


def test_only_the_ticked_groups_run_and_a_crashing_probe_does_not_stop_the_rest(demo, tmp_path, monkeypatch):
    session = PanelSession(tmp_path)
    target = session.validate(str(demo.llama))
    labels = [s.label for s in session.steps_for({"DataParallel"})]
    assert labels == ["prepare the model (set-up)", "Trainer wrap (DataParallel)", "device maps"]

    import workbench.probes.dtype.headers as headers

    def broken(*args, **kwargs):
        raise RuntimeError("planted probe crash")
    broken.__module__, broken.__name__ = headers.__name__, "checkpoint_probe"  # the catalog's probe, crashing
    monkeypatch.setattr(headers, "checkpoint_probe", broken)
    seen = []
    findings = session.run(target, {"Dtype census"}, lambda i, n, step, s: seen.append((i, step.label, s is None)))
    by_id = {f.id: f for f in findings}
    assert by_id["checkpoint.integrity"].verdict == "error" and "planted probe crash" in by_id["checkpoint.integrity"].detail
    assert by_id["dtype.fp32_islands"].verdict in ("pass", "warn", "info")  # later steps still ran
    assert [label for _, label, started in seen if started] == [s.label for s in session.steps_for({"Dtype census"})]
    report = json.loads((session.report / "findings.json").read_text())  # the report contract, as diagnose writes
    assert session.report.parent == tmp_path and report["schema_version"] == 1
    assert {f["id"] for f in report["findings"]} == set(by_id) and (session.report / "index.html").is_file()


def test_results_print_as_text_from_the_blocks_their_html_comes_from(demo):
    import workbench as wb

    target = wb.resolve_target(str(demo.qwen_stage2))
    text = str(wb.checkpoint_probe(target))
    assert "object at 0x" not in text and "checkpoint.integrity" in text and "PASS" in text
    assert "vision" in text and "language" in text  # the census table, as columns
    assert str(target).splitlines()[0].startswith("checkpoint")


def test_a_heading_and_a_table_print_as_aligned_text_and_render_as_html():
    census = Display(Heading("Census", level=3), Table(["dtype", "n"], [["bf16", 3]]))
    assert census.text() == "Census\n\ndtype  n\n-----  -\nbf16   3"
    assert census.html() == ('<h3>Census</h3><table class="wb-table"><thead><tr><th>dtype</th><th>n</th></tr></thead>'
                             "<tbody><tr><td>bf16</td><td>3</td></tr></tbody></table>")


def test_folded_evidence_shows_in_html_and_stays_out_of_text():
    shown = Display(Paragraph("one ", Code("c")), Table(["x"], [[Bold("y")], ["z"]]),
                    Details("evidence", Pre("{secret: 1}")))
    assert shown.text() == "one c\n\nx\n-\ny\nz"
    assert "<details><summary>evidence</summary><pre>{secret: 1}</pre></details>" in shown.html()
    cell = Table(["finding"], [[Paragraph("x", Details("evidence", Pre("{}")))]])
    assert cell.text() == "finding\n-------\nx" and "<pre>{}</pre>" in cell.html()


def test_wide_tables_print_as_records():
    wide = Table([f"col{i}" for i in range(6)], [[f"{'v' * 30}{i}" for i in range(6)]])
    text = wide.text()
    assert text.splitlines()[0] == "col0  " + "v" * 30 + "0"
    assert text.splitlines()[5] == "col5  " + "v" * 30 + "5"


def test_html_and_text_show_the_same_cells(demo):
    import html

    import workbench as wb

    result = wb.checkpoint_probe(wb.resolve_target(str(demo.qwen_stage2)))
    shown = result.view()
    bundle = result._repr_mimebundle_()
    assert shown.html() == bundle["text/html"] and shown.text() == bundle["text/plain"] == str(result)
    tables = [b for b in shown.blocks if isinstance(b, Table)]
    census = next(t for t in tables if t.columns and "dtype" in t.columns)
    for row in census.rows:
        for value in row:
            assert f">{html.escape(str(value))}<" in shown.html() and str(value) in shown.text()


def test_strings_from_a_checkpoint_are_escaped_in_html_and_kept_in_text():
    name = '<script>alert(1)</script> "model.layers"'
    shown = Display(Heading(name), Paragraph(Code(name)), Table([name], [[name, Code(name)]]),
                    Table(None, [[name, name]], row_headers=True))
    assert "<script>" not in shown.html() and shown.html().count("&lt;script&gt;alert(1)&lt;/script&gt;") == 7
    assert "&quot;model.layers&quot;" in shown.html()
    assert shown.text().count(name) == 7


def test_the_lab_workspace_opens_the_panel_first_then_the_numbered_notebooks(tmp_path):
    for name in ("02_b.ipynb", "01_a.ipynb", "panel.ipynb", "scratch.ipynb"):
        (tmp_path / name).write_text("{}")
    dock = workspace(tmp_path)["data"]["layout-restorer:data"]["main"]["dock"]
    assert dock["widgets"] == ["notebook:panel.ipynb", "notebook:01_a.ipynb", "notebook:02_b.ipynb"]
