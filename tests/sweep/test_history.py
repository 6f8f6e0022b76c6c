"""`workbench sweep --history` on real Trainer runs (tests/sweep/lora_history.py): the first checkpoint at which
each planted fault appears is named in sweep.json's first_bad, and a healthy history names none.

To keep the cost down, each member is diagnosed with the notebooks that answer the planted faults only (`--notebooks
00`, as `diagnose --notebooks` does; 08 too where the run autopsy matters): every member still goes through
`diagnose`'s path, in the kernel the sweep keeps for its members in series (or each worker keeps, with --jobs),
reset between them."""

import pytest
from conftest import run_sweep

pytestmark = pytest.mark.slow


def test_each_fault_is_first_bad_at_the_checkpoint_it_was_planted_from(lora_runs, tmp_path):
    # NaN in lora_B from checkpoint-3 on, modules_to_save gone from checkpoint-4 on; two members at a time
    sweep = run_sweep([str(lora_runs.nan_then_no_modules_to_save), "--history", "--notebooks", "00", "08",
                       "--jobs", "2"], tmp_path)
    assert sweep.result.returncode == 1, sweep.result.stderr[-3000:]
    assert [m["name"] for m in sweep.document["members"]] == [f"checkpoint-{n}" for n in range(1, 5)]
    assert sweep.document["engine"] == "local"
    # notebook 08 judges the whole run, the same for every member (its adapter turned NaN at checkpoint-3): a check
    # bad from the first member on has no first_bad, never a guessed one
    assert {v["run.adapter_progress"] for v in sweep.verdicts().values()} == {"fail"}
    assert sweep.document["first_bad"] == {"adapter.weights": "checkpoint-3", "tokenizer.vocab": "checkpoint-4"}
    failing = sweep.failing()
    assert "adapter.weights" not in failing["checkpoint-2"] and "tokenizer.vocab" not in failing["checkpoint-3"]
    assert "first bad: adapter.weights at checkpoint-3" in sweep.result.stdout
    page = (sweep.folder / "index.html").read_text()
    # the comparison: what changed at checkpoint-4 (the embeddings no longer saved) and the table's links
    assert "checkpoint-4 against checkpoint-3" in page and "modules_to_save" in page
    assert 'href="members/checkpoint-3/00_saved_files.html"' in page
    assert (sweep.folder / "members" / "checkpoint-3" / "00_saved_files.html").is_file()
    # each worker process keeps one kernel for the members it runs, reset between them
    costs = [sweep.member_report(m["name"])["cost"] for m in sweep.document["members"]]
    assert sum(c["kernels_started"] for c in costs) == len({c["sweep"]["host"] for c in costs}) <= 2, costs
    assert sum(c["kernel_kept"] for c in costs) == len(costs) - len({c["sweep"]["host"] for c in costs}), costs


def test_a_tokenizer_saved_with_another_pad_is_first_bad_where_it_was_saved(lora_runs, tmp_path):
    sweep = run_sweep([str(lora_runs.other_pad), "--history", "--notebooks", "00"], tmp_path)
    assert sweep.result.returncode == 1, sweep.result.stderr[-3000:]
    assert sweep.document["first_bad"] == {"tokenizer.vocab": "checkpoint-3"}
    page = (sweep.folder / "index.html").read_text()
    assert "&lt;|other_pad|&gt;" in page  # the tokenizer difference at checkpoint-3, shown


def test_a_healthy_history_has_no_first_bad(lora_runs, tmp_path):
    sweep = run_sweep([str(lora_runs.healthy), "--history", "--notebooks", "00", "08"], tmp_path)
    assert sweep.result.returncode == 0, (sweep.result.stdout[-3000:], sweep.result.stderr[-3000:])
    assert sweep.document["first_bad"] == {}
    assert all(m["exit_code"] == 0 and m["report"] == f"members/{m['name']}" for m in sweep.document["members"])
    page = (sweep.folder / "index.html").read_text()
    assert "No check turned warn, fail or error" in page and "data:image/png;base64" in page  # the plots
