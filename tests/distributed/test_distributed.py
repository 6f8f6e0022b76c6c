"""distributed.ddp / distributed.fsdp under a real torchrun: 2 ranks, gloo on the CPU, the user's set-up on each."""

import json
import re
import time

import psutil
import pytest

from tests import served_kernels
from tests.cli_in_process import workbench_here
from workbench.distributed.ddp import READY_TWICE
from workbench.distributed.ddp_verdict import grad_agreement
from workbench.distributed.launcher import rank_environment
from workbench.distributed.probes import distributed_probe
from workbench.model.target import resolve_target

pytestmark = pytest.mark.slow  # torchrun ranks / real training: not in the fast tier


def verdicts(report):
    return {f.id: f for f in report.findings()}


def user_setup(folder, monkeypatch, body: str) -> str:
    """A `--setup recipe:load` importable from the current folder, as a user's training script would be."""
    (folder / "recipe.py").write_text("import os\nimport time\n\nimport torch\n\nfrom workbench.model.setups import plain\n\n\n"
                                      "def load(checkpoint, **options):\n" + body)
    monkeypatch.chdir(folder)
    return "recipe:load"


def assert_nothing_left(report):
    """No process of the launch is left: torchrun, its ranks (or the clients standing for them), and the ranks
    forked from this worker's kernel server (tests/served_kernels.py)."""
    for pid in report.launch["pids"]:
        try:
            status = psutil.Process(pid).status()
        except psutil.NoSuchProcess:
            continue
        assert status == psutil.STATUS_ZOMBIE, f"process {pid} outlived the launch ({status})"
    assert served_kernels.server_children(since=time.time() - report.launch["seconds"]) == []


def test_a_frozen_fp32_buffer_and_reentrant_checkpointing_are_named(demo, tmp_path, monkeypatch):
    setup = user_setup(tmp_path, monkeypatch, (
        "    from peft import LoraConfig, get_peft_model\n"
        "    model = plain(checkpoint, **options)\n"
        "    norm = model.model.norm  # frozen under LoRA; an fp32 buffer entering its output, like Gemma-4's std_bias\n"
        "    norm.register_buffer('std_bias', torch.zeros(norm.weight.shape[0], dtype=torch.float32))\n"
        "    original = norm.forward\n"
        "    norm.forward = lambda hidden: original(hidden) - norm.std_bias\n"
        "    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={'use_reentrant': True})\n"
        "    return get_peft_model(model, LoraConfig(r=4, target_modules=['q_proj', 'v_proj']))\n"))
    report = distributed_probe(resolve_target(str(demo.llama), setup=setup), ranks=2, timeout=240)
    found = verdicts(report)
    fsdp = found["distributed.fsdp"]
    assert fsdp.verdict == "fail", (fsdp.title, fsdp.detail)
    assert "base_model.model.model.norm.std_bias (float32)" in fsdp.title and "frozen" in fsdp.title
    assert "lm_head" in fsdp.detail and "output_dtype" in fsdp.fix
    ddp = found["distributed.ddp"]
    assert ddp.verdict == "fail" and READY_TWICE in ddp.title, (ddp.title, ddp.detail)
    assert "use_reentrant=False" in ddp.detail and "static_graph=True" in ddp.detail  # the fixes, verified here
    assert "use_reentrant" in ddp.fix and ddp.evidence["trainer_ddp_kwargs"]["kwargs"]["find_unused_parameters"]
    # lora_A gets an exactly-zero gradient on a fresh LoRA's first step: equal on both ranks, not flagged
    assert not ddp.evidence["agreement"]["find_unused_parameters=False"]["differ"]


def test_a_trainable_tensor_off_the_forward_path_and_an_anchored_pattern_warn(demo, tmp_path, monkeypatch):
    setup = user_setup(tmp_path, monkeypatch, (
        "    model = plain(checkpoint, **options)\n"
        "    model.model.unused_adapter = torch.nn.Linear(8, 8)  # trainable, never called by forward\n"
        "    return model\n"))
    target = resolve_target(str(demo.llama), setup=setup, params={"components": {"head": ["^lm_head"]}})
    report = distributed_probe(target, ranks=2, timeout=240)
    ddp = verdicts(report)["distributed.ddp"]
    assert ddp.verdict == "warn", (ddp.title, ddp.detail)
    assert ddp.title.startswith("2 trainable tensor(s) get no gradient") and "re.search('^lm_head', name)" in ddp.title
    assert ddp.evidence["unused"] == ["model.unused_adapter.weight", "model.unused_adapter.bias"]
    baseline = ddp.evidence["trials"][0]
    assert all("Expected to have finished reduction" in outcome for outcome in baseline["per_rank"])
    pattern = next(r for r in report.prefix_rows() if r["source"] == "parameters file: components.head")
    assert (pattern["bare"], pattern["under_ddp"]) == (1, 0)
    assert "module" in ddp.fix and "requires_grad_(False)" in ddp.fix


def test_a_rank_that_crashes_is_an_error_carrying_its_traceback(demo, tmp_path, monkeypatch):
    setup = user_setup(tmp_path, monkeypatch, (
        "    if os.environ['RANK'] == '1':\n"
        "        raise RuntimeError('rank one cannot read its shard')\n"
        "    return plain(checkpoint, **options)\n"))
    report = distributed_probe(resolve_target(str(demo.llama), setup=setup), ranks=2, timeout=240)
    for finding in report.findings():
        assert finding.verdict == "error", finding.title
        assert finding.title.startswith("Rank 1 crashed during set-up for DDP: RuntimeError"), finding.title
        assert "rank one cannot read its shard" in finding.evidence["traceback"]
        assert "recipe.py" in finding.evidence["traceback"] and "Traceback" in finding.evidence["traceback"]
    assert_nothing_left(report)


def test_a_hanging_rank_times_out_and_leaves_no_process(demo, tmp_path, monkeypatch):
    setup = user_setup(tmp_path, monkeypatch, "    time.sleep(600)\n")
    # ranks forked from the worker's kernel server reach the hanging set-up in about a second (under 3 s with both
    # cores busy); started as usual they import the stack first (up to ~11 s on a loaded host)
    timeout = 6 if served_kernels.would_fork(rank_environment()) else 25
    start = time.monotonic()
    report = distributed_probe(resolve_target(str(demo.llama), setup=setup), ranks=2, timeout=timeout)
    assert time.monotonic() - start < timeout + 15
    for finding in report.findings():
        assert finding.verdict == "error" and finding.title == f"Timed out after {timeout} s", finding.title
        assert "rank 1: set-up for DDP" in finding.detail  # where each rank was when it was stopped
    assert report.launch["killed"]
    assert_nothing_left(report)


def test_gradient_agreement_names_the_tensor_a_rank_disagrees_on():
    ranks = [{"grads": {"a": [1.0, 2.0], "b": None, "c": [0.0, 0.0], "d": [3.0, 4.0]}},
             {"grads": {"a": [1.0, 2.5], "b": None, "c": [0.0, 0.0], "d": None}}]
    agreement = grad_agreement(ranks)
    assert agreement["differ"] == ["a"] and agreement["present_on_some_ranks_only"] == ["d"]
    assert agreement["compared"] == 4


def test_not_asked_and_too_big_are_skips_that_launch_nothing(demo):
    from workbench.catalog import check

    assert check("distributed.ddp").probes == check("distributed.fsdp").probes == (
        "workbench.distributed.probes:distributed_probe",)
    found = verdicts(distributed_probe(resolve_target(str(demo.llama)), ranks=0))
    assert {f.verdict for f in found.values()} == {"skip"} and "--distributed" in found["distributed.ddp"].fix
    tight = resolve_target(str(demo.llama), params={"memory_limit_bytes": 100_000})
    report = distributed_probe(tight, ranks=2)
    assert not report.launch and "would not fit" in report.findings()[0].title
    assert "2 ranks each load the model" in report.findings()[1].detail


def test_a_healthy_model_under_diagnose_distributed_2_passes_both_checks_and_shows_the_prefix_table(demo, tmp_path):
    """`diagnose --distributed 2 --notebooks 06` (papermill, the notebook's kernel, torchrun with 2 gloo ranks) on the
    demo's healthy Llama: both checks pass, with their evidence in findings.json and the rank and prefix tables in
    the notebook's page; the launch leaves no process."""
    from html import unescape
    from pathlib import Path

    result = workbench_here("diagnose", demo.llama, "--distributed", "2", "--notebooks", "06", "--reports-dir",
                            tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    folder = Path(result.stdout.strip().splitlines()[-1].removeprefix("report: "))
    found = {f["id"]: f for f in json.loads((folder / "findings.json").read_text())["findings"]}
    assert {k: f["verdict"] for k, f in found.items()} == {"distributed.ddp": "pass", "distributed.fsdp": "pass"}
    ddp, fsdp = found["distributed.ddp"], found["distributed.fsdp"]
    assert "equal on all 2 ranks" in ddp["title"] and "rotary" in fsdp["detail"], (ddp, fsdp)
    assert "'module.'" in ddp["detail"] and "Base parameters enabled: 0" in ddp["detail"]
    assert READY_TWICE in ddp["detail"]  # what reentrant checkpointing would do, tried
    # each rank had its own batch: its losses differ from the other's, and the gradients are identical after
    # all-reduce
    baseline = ddp["evidence"]["trials"][0]["per_rank"]
    assert baseline[0].startswith("ok, losses") and baseline[0] != baseline[1], baseline
    agreement = ddp["evidence"]["agreement"]["find_unused_parameters=False"]
    assert agreement["compared"] > 0 and not agreement["differ"]
    assert ddp["evidence"]["data_loading"]["start_method"] == "fork"
    assert ddp["evidence"]["data_loading"]["cuda_collate"]["tested"] is False  # CPU: skipped, and said why
    html = (folder / "06_distributed.html").read_text()
    assert "Name-based selections" in html and "rank 1" in html and "wb-table" in html
    assert 'name.startswith("model.") finds' in unescape(html)  # the prefix table's row, as the notebook shows it
    codes = re.findall(r"<code>(.*?)</code>", html)
    bare = codes.index("model.embed_tokens.weight")
    assert codes[bare + 1] == "module.model.embed_tokens.weight"  # a name, and the same name under DDP
    for pid in ddp["evidence"]["launch"]["pids"]:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, pid


@pytest.mark.cuda
def test_a_collate_that_touches_cuda_fails_in_forked_workers_on_a_gpu():
    import torch.multiprocessing as mp

    from workbench.distributed.dataloader import data_loading_facts

    facts = data_loading_facts()
    assert facts["cuda_collate"]["tested"] is True
    if mp.get_start_method(allow_none=True) in (None, "fork"):
        assert facts["cuda_collate"]["fails"] and "forked subprocess" in facts["cuda_collate"]["error"]


def test_an_fp32_buffer_its_module_casts_itself_is_information_not_a_fail(demo, tmp_path, monkeypatch):
    # the twin of the frozen fp32 buffer above: the norm casts std_bias to the activations' dtype itself, so the
    # buffer stays fp32 under the policy and promotes nothing
    setup = user_setup(tmp_path, monkeypatch, (
        "    model = plain(checkpoint, **options)\n"
        "    norm = model.model.norm\n"
        "    norm.register_buffer('std_bias', torch.zeros(norm.weight.shape[0], dtype=torch.float32))\n"
        "    original = norm.forward\n"
        "    norm.forward = lambda hidden: original(hidden) - norm.std_bias.to(hidden.dtype)\n"
        "    return model\n"))
    report = distributed_probe(resolve_target(str(demo.llama), setup=setup), ranks=2, timeout=240)
    fsdp = verdicts(report)["distributed.fsdp"]
    assert fsdp.verdict == "info", (fsdp.title, fsdp.detail)
    assert fsdp.title.startswith("The FSDP2 step runs (") and "some tensors stay off bfloat16" in fsdp.title
    assert "1 buffer(s) stay off bfloat16 without promoting anything, e.g. model.norm.std_bias (float32)" in fsdp.detail
    assert fsdp.evidence["promoting"] == [] and fsdp.evidence["per_rank"] == {0: "ok", 1: "ok"}
    assert [b["name"] for b in fsdp.evidence["buffers"] if not b["rotary"]] == ["model.norm.std_bias"]
    assert "MixedPrecisionPolicy(param_dtype=torch.float32)" in fsdp.fix
    assert_nothing_left(report)
