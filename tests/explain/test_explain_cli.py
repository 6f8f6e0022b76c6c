"""`workbench explain` as a user runs it: a file or standard input, text or JSON, one line and exit 2 for what
cannot be read, and no torch import for a text alone."""

import json
import subprocess
import sys

from tests.cli_in_process import workbench_here
from tests.explain.test_reading_and_ranking import DP_CRASH


def explain(*args, stdin=""):
    return workbench_here("explain", *args, stdin=stdin)  # the CLI's entry point in this process


def test_a_traceback_file_prints_the_symptom_then_the_causes_ranked(tmp_path):
    (tmp_path / "crash.log").write_text(DP_CRASH)
    result = explain(tmp_path / "crash.log")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.index("Symptom: ") < out.index("1. The Trainer wrapped the model in nn.DataParallel")
    assert "module lm_head" in out and "checks: parallel.trainer_wrap" in out and "fix: " in out
    assert "https://github.com/" in out


def test_json_from_standard_input_follows_the_issue_contract():
    result = explain("--json", "-", stdin=DP_CRASH)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["symptom"]["id"] == "dtype.linear_operands" and data["symptom"]["module"] == "lm_head"
    first = data["causes"][0]
    assert set(first) >= {"cause", "why", "checks", "confirmed", "evidence", "fix", "sources"}
    assert first["confirmed"] is None and first["checks"] == ["parallel.trainer_wrap"]
    assert [c["score"] for c in data["causes"]] == sorted((c["score"] for c in data["causes"]), reverse=True)


def test_unknown_text_exits_0_with_the_nearest_symptoms(tmp_path):
    (tmp_path / "odd.txt").write_text("KeyError: 'question'\n")
    result = explain(tmp_path / "odd.txt", "--json")
    assert result.returncode == 0 and json.loads(result.stdout)["symptom"] is None
    assert "nearest" in json.loads(result.stdout)


def test_unreadable_input_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "blob.bin").write_bytes(b"\x00\x01\x02" * 100)
    (tmp_path / "empty.txt").write_text("")
    for arg, why in ((tmp_path / "missing.log", "cannot read it"), (tmp_path, "a folder"),
                     (tmp_path / "blob.bin", "binary"), (tmp_path / "empty.txt", "empty")):
        result = explain(arg)
        assert result.returncode == 2 and why in result.stderr, (arg, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert explain("--reproduce", "-", stdin=DP_CRASH).returncode == 2  # --reproduce needs --ckpt


def test_list_prints_every_symptom_with_its_causes():
    from workbench.explain.symptoms import load_symptoms

    result = explain("--list")
    assert result.returncode == 0
    assert f"{len(load_symptoms())} symptoms" in result.stdout
    assert all(s.id in result.stdout for s in load_symptoms())


def test_explaining_a_text_imports_no_torch(tmp_path):
    (tmp_path / "crash.log").write_text(DP_CRASH)
    code = ("import sys; from workbench.cli import main; rc = main(['explain', sys.argv[1], '--json']); "
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'heavy import'; sys.exit(rc)")
    result = subprocess.run([sys.executable, "-c", code, str(tmp_path / "crash.log")], capture_output=True,
                            text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr


def test_in_a_notebook_the_package_is_the_call_and_renders_like_a_finding():
    import workbench as wb

    expl = wb.explain(DP_CRASH)
    bundle = expl._repr_mimebundle_()
    assert "lm_head" in bundle["text/html"] and "Causes, most likely first" in bundle["text/plain"]
    assert repr(expl) == "<Explanation dtype.linear_operands: dataparallel_replica>"


def test_the_ipython_magic_explains_a_cell_and_a_file(tmp_path):
    from IPython.testing.globalipapp import get_ipython

    ip = get_ipython()
    ip.run_line_magic("load_ext", "workbench")
    assert repr(ip.run_cell_magic("workbench", "explain", DP_CRASH)).startswith("<Explanation dtype.linear_operands")
    (tmp_path / "crash.log").write_text(DP_CRASH)
    assert ip.run_line_magic("workbench", f"explain {tmp_path / 'crash.log'}").symptom.id == "dtype.linear_operands"


def test_the_notebook_call_takes_the_command_lines_options_with_its_defaults():
    from workbench.cli import build_parser
    from workbench.explain.command import OPTIONS

    parsed = vars(build_parser().parse_args(["explain", "x.log", "--ckpt", "c"]))
    assert {k: parsed[k] for k in OPTIONS} == OPTIONS
    assert set(parsed) - set(OPTIONS) == {"command", "file", "json", "list", "ckpt"}
