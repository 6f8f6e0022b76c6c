"""The check contract, enforced in one place: one answer per check per notebook, with a declared verdict. Under the
test suite's strict mode a break raises; in production it becomes an `error` naming the step."""

import dataclasses

import pytest

from workbench.catalog import NOTEBOOKS
from workbench.contract import STRICT_ENV, VERDICT_LOG_ENV, ContractViolation, coverage_gaps, notebook_answers
from workbench.display.result import ProbeResult
from workbench.findings import Finding, combine_findings
from workbench.recorder import FindingsRecorder


@dataclasses.dataclass(repr=False)
class Judged(ProbeResult):
    answers: list

    def findings(self):
        return list(self.answers)


def judged(*answers: tuple[str, str]) -> Judged:
    return Judged([Finding(check_id, verdict, f"{check_id} {verdict}", "detail", {"n": i})
                   for i, (check_id, verdict) in enumerate(answers)])


@pytest.fixture
def production(monkeypatch):
    """Outside the test suite's strict mode; the verdicts these tests plant on purpose stay out of its coverage."""
    monkeypatch.delenv(STRICT_ENV, raising=False)
    monkeypatch.delenv(VERDICT_LOG_ENV, raising=False)


def recorder(tmp_path, notebook="09_training_step"):
    return FindingsRecorder(tmp_path / "findings.json", notebook=notebook)


def test_a_check_answered_twice_by_one_result_raises_under_strict_mode(tmp_path):
    with pytest.raises(ContractViolation, match=r"train\.fp16: answered 2 times in one result"):
        recorder(tmp_path).run(lambda: judged(("train.fp16", "fail"), ("train.fp16", "pass")),
                               checks=("train.fp16",), step="fp16")


def test_in_production_a_second_answer_becomes_one_error_keeping_both(tmp_path, production):
    rec = recorder(tmp_path)
    rec.run(lambda: judged(("train.fp16", "fail"), ("train.fp16", "pass")), checks=("train.fp16",), step="fp16")
    [finding] = rec.findings
    assert finding.id == "train.fp16" and finding.verdict == "error" and "step 'fp16'" in finding.title
    assert [a["verdict"] for a in finding.evidence["answers"]] == ["fail", "pass"]  # nothing said is lost
    assert "not of your model" in finding.fix


def test_an_undeclared_verdict_is_refused(tmp_path, production):
    rec = recorder(tmp_path)
    rec.run(lambda: judged(("train.fsdp_units", "pass"), ("train.fp16", "fail")), checks=("train.fp16",),
            step="fp16")
    found = {f.id: f for f in rec.findings}
    assert found["train.fsdp_units"].verdict == "error"  # a check the step does not declare
    assert "does not declare" in found["train.fsdp_units"].detail and found["train.fp16"].verdict == "fail"
    rec.run(lambda: judged(("config.tied_embeddings", "info")), checks=("config.tied_embeddings",), step="tied")
    tied = {f.id: f for f in rec.findings}["config.tied_embeddings"]
    assert tied.verdict == "error" and "verdict 'info' is not one config.tied_embeddings declares" in tied.detail


def test_a_check_answered_by_two_steps_of_a_notebook_is_refused_and_a_rerun_replaces(tmp_path, production):
    rec = recorder(tmp_path)
    rec.run(lambda: judged(("train.fp16", "pass")), checks=("train.fp16",), step="fp16")
    rec.run(lambda: judged(("train.fp16", "fail")), checks=("train.fp16",), step="fp16")  # the cell run again
    assert [(f.id, f.verdict) for f in rec.findings] == [("train.fp16", "fail")]
    rec.run(lambda: judged(("train.fp16", "pass")), checks=("train.fp16",), step="another")
    [finding] = rec.findings
    assert finding.verdict == "error" and "already answered in this notebook by step 'fp16'" in finding.detail


def test_a_declared_check_left_unanswered_is_an_error(tmp_path, production):
    rec = recorder(tmp_path)
    rec.run(lambda: judged(("train.fp16", "pass")), checks=("train.fp16", "train.fsdp_units"), step="two")
    found = {f.id: f.verdict for f in rec.findings}
    assert found == {"train.fp16": "pass", "train.fsdp_units": "error"}


def test_a_result_shown_by_a_step_that_declares_nothing_answers_nothing(tmp_path):
    rec = recorder(tmp_path)
    rec.run(lambda: judged(("train.fp16", "pass")), checks=(), step="intermediate")
    assert rec.findings == []


def test_combine_keeps_the_worst_verdict_first_and_every_judgement():
    headroom = Finding("train.fp16", "pass", "headroom 9 bits", "fine", {"bits": 9}, "")
    trainable = Finding("train.fp16", "fail", "1 trainable fp16 parameter", "GradScaler raises", {"bits": 9},
                        "upcast it")
    combined = combine_findings([headroom, trainable])
    assert combined.verdict == "fail" and combined.title == "1 trainable fp16 parameter"
    assert "Also (pass): headroom 9 bits" in combined.detail and combined.fix == "upcast it"
    assert combined.evidence["also"] == [{"verdict": "pass", "title": "headroom 9 bits", "detail": "fine"}]
    with pytest.raises(ValueError):
        combine_findings([headroom, Finding("grad.flow", "pass", "x")])


def test_notebook_answers_repair_a_sidecar_the_recorder_did_not_write(production):
    findings = [Finding("run.loss", "pass", "a"), Finding("run.loss", "warn", "b")]
    answers = {f.id: f for f in notebook_answers("08_training_run", ("run.loss", "run.eval"), findings, "died")}
    assert answers["run.loss"].verdict == "error" and "answered 2 times" in answers["run.loss"].detail
    assert answers["run.eval"].verdict == "error" and "died" in answers["run.eval"].detail
    assert {f.notebook for f in answers.values()} == {"08_training_run"}


def test_no_check_is_declared_by_two_steps_of_one_notebook():
    for nb in NOTEBOOKS:
        declared = [c for step in nb.steps for c in step.reports]
        assert len(declared) == len(set(declared)), (nb.name, declared)


def test_coverage_gaps_name_what_no_test_produced_and_what_nothing_declares():
    missing, undeclared = coverage_gaps({("train.fp16", "pass"), ("config.tied_embeddings", "info")})
    assert "train.fp16: fail" in missing and "train.fp16: pass" not in missing
    assert undeclared == ["config.tied_embeddings: info"]


def test_every_step_says_whether_the_callback_runs_it():
    for nb in NOTEBOOKS:
        for step in nb.steps:
            assert step.live is True or (isinstance(step.live, str) and len(step.live) > 20), (nb.name, step.name)


def test_each_step_that_runs_is_timed_in_the_sidecar_and_a_rerun_replaces_its_time(tmp_path, production, monkeypatch):
    import itertools
    import json

    from workbench.errors import NotApplicable

    clock = itertools.count(0.0, 0.25)  # each reading a quarter second after the one before
    monkeypatch.setattr("workbench.recorder.time.perf_counter", lambda: next(clock))
    rec = FindingsRecorder(tmp_path / "findings.json", notebook="09_training_step", step_peaks=True)  # a kernel's

    def crashes():
        raise RuntimeError("boom")

    def does_not_apply():
        raise NotApplicable("no fp16 here")

    rec.run(lambda: judged(("train.fp16", "pass")), checks=("train.fp16",), step="fp16")
    failed = rec.run(crashes, checks=("train.fsdp_units",), step="fsdp_units")
    rec.run(lambda: judged(("train.fp16", "fail")), checks=("train.fp16",), step="fp16")  # the cell run again
    rec.run(does_not_apply, checks=("train.loss_accumulation",), step="loss_accumulation")
    rec.run(lambda _: None, failed, checks=("train.ddp_checkpointing",), step="ddp")  # its input failed: not run
    rec.save()
    steps = json.loads((tmp_path / "findings.json").read_text())["steps"]
    # a diagnosis' kernel reads each step's peak memory; any other recorder (the callback's, your session's) not
    peaks = [step.pop("peak_rss_bytes") for step in steps]
    assert all(isinstance(p, int) and p > 0 for p in peaks), peaks
    (tmp_path / "other").mkdir()
    other = recorder(tmp_path / "other")
    other.run(lambda: judged(("train.fp16", "pass")), checks=("train.fp16",), step="fp16")
    assert "peak_rss_bytes" not in other.step_seconds["fp16"]
    none = {"forwards": 0, "forwards_with_grad": 0}  # no model ran: the full-model forwards each step counted
    assert steps == [{"step": "fp16", "checks": ["train.fp16"], "seconds": 0.25, **none},
                     {"step": "fsdp_units", "checks": ["train.fsdp_units"], "seconds": 0.25, **none},
                     {"step": "loss_accumulation", "checks": ["train.loss_accumulation"], "seconds": 0.25, **none}]
