"""`workbench explain --ckpt` confirms a planted cause and rules it out on a healthy set-up, running only the named
checks; `--reproduce` replays the seeds' errors on a tiny twin built from a config alone and names the toggle."""

import json
import shutil

import pytest

from tests.cli_in_process import workbench_here
from tests.explain.test_reading_and_ranking import DP_CRASH

pytestmark = pytest.mark.slow

NO_GRAD = """Traceback (most recent call last):
  File "/home/u/sft.py", line 88, in <module>
    trainer.train()
  File "/usr/local/lib/python3.10/dist-packages/torch/_tensor.py", line 522, in backward
    torch.autograd.backward(
RuntimeError: element 0 of tensors does not require grad and does not have a grad_fn
"""
FP16 = """  File "/usr/local/lib/python3.10/dist-packages/accelerate/accelerator.py", line 2040, in clip_grad_norm_
    self.unscale_gradients()
  File "/usr/local/lib/python3.10/dist-packages/torch/amp/grad_scaler.py", line 283, in _unscale_grads_
    raise ValueError("Attempting to unscale FP16 gradients.")
ValueError: Attempting to unscale FP16 gradients.
"""
READY_TWICE = """[rank1]: RuntimeError: Expected to mark a variable ready only once. This error is caused by one of the \
following reasons: 1) Use of a module parameter outside the `forward` function."""


def explain(tmp_path, text, *args):
    log = tmp_path / "error.log"
    log.write_text(text)
    # the CLI's entry point in this process (tests/cli_in_process.py); the kernels and torchrun ranks it starts are
    # processes of their own
    result = workbench_here("explain", log, "--json", "--reports-dir", tmp_path / "reports", *args)
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, json.loads(result.stdout)


def test_the_planted_dataparallel_setup_is_confirmed_and_a_report_leads_with_the_symptom(demo, tmp_path):
    code, data = explain(tmp_path, DP_CRASH, "--ckpt", demo.qwen_stage2, "--quant", "4bit",
                         "--setup", "qlora_trl_legacy", "--gpus", "2")
    causes = {c["id"].split("/")[1]: c for c in data["causes"]}
    assert code == 1 and causes["dataparallel_replica"]["confirmed"] is True
    assert causes["dataparallel_replica"]["evidence"][0]["check"] == "parallel.trainer_wrap"
    assert "forward fails" in causes["dataparallel_replica"]["evidence"][0]["because"]
    # the break is the fp32 norm feeding the bf16 head, not an adapter layer: dtype_flow's fail does not confirm it
    assert causes["fp32_island_without_autocast"]["confirmed"] is True
    assert causes["adapter_dtype_mismatch"]["confirmed"] is False
    assert data["causes"][0]["confirmed"] is True  # confirmed causes lead
    ran = data["confirmation"]["checks"]
    assert "parallel.trainer_wrap" in ran and "grad.flow" not in ran  # only what the causes name
    report = json.loads((tmp_path / "reports").glob("*/*/findings.json").__next__().read_text())
    assert {f["id"] for f in report["findings"]} == set(ran)
    assert report["explanation"]["symptom"]["id"] == "dtype.linear_operands"
    html = next((tmp_path / "reports").glob("*/*/index.html")).read_text()
    assert html.index("Symptom: ") < html.index("Diagnosis ")


def test_on_a_healthy_setup_the_same_causes_are_ruled_out(demo, tmp_path):
    code, data = explain(tmp_path, DP_CRASH, "--ckpt", demo.llama, "--gpus", "1")
    causes = {c["id"].split("/")[1]: c for c in data["causes"]}
    assert code == 0
    assert causes["dataparallel_replica"]["confirmed"] is False
    assert causes["dataparallel_replica"]["evidence"][0]["verdict"] == "pass"
    assert not any(c["confirmed"] for c in data["causes"])


@pytest.fixture(scope="module")
def config_only(demo, tmp_path_factory):
    """What a user may hold of a model they cannot ship: its config.json alone."""
    folders = {}
    for name, source in (("llama", demo.llama), ("qwen2vl", demo.qwen_stage1)):
        folder = tmp_path_factory.mktemp(name)
        shutil.copy(source / "config.json", folder / "config.json")
        folders[name] = folder
    return folders


@pytest.mark.parametrize("text,model,setup,changes", [
    (DP_CRASH, "qwen2vl", "qlora_trl_legacy", {"data_parallel", "cast_to_compute"}),
    (NO_GRAD, "llama", "qlora", {"reentrant", "input_grads"}),
    (FP16, "llama", "qlora", {"trainable_fp16", "grad_scaler"}),
    (READY_TWICE, "llama", "qlora", {"reentrant", "find_unused", "static_graph"}),
], ids=["dataparallel-dtype", "no-grad-reentrant", "fp16-unscale", "ddp-ready-twice"])
def test_the_seeds_errors_are_reproduced_on_a_twin_from_a_config_alone(config_only, tmp_path, text, model, setup,
                                                                        changes):
    _code, data = explain(tmp_path, text, "--ckpt", config_only[model], "--setup", setup, "--reproduce")
    rep = data["reproduction"]
    # the whole reproduction as text (a dict message is cut short): each trial's error says what the ranks did
    assert rep["reproduced"] is True, json.dumps(rep, default=str)[-4000:]
    first = rep["trials"][0]
    assert first["flipped"] == [] and not first["passes"]
    single = {t["flipped"][0] for t in rep["trials"] if len(t["flipped"]) == 1 and t["passes"]}
    assert single == changes and len(rep["smallest_changes"]) == len(changes)
    assert "not_run" in data["confirmation"]  # a config alone: the checks could not run, said so
