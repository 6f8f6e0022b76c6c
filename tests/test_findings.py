import pytest

from workbench.findings import Finding, sort_findings, worst_verdict
from workbench.report.runner import exit_code


def test_verdict_vocabulary_is_enforced():
    with pytest.raises(ValueError, match="unknown verdict"):
        Finding("x", "ok", "t")


def test_worst_first_and_exit_codes():
    findings = [Finding("a", "pass", "t"), Finding("b", "warn", "t"), Finding("c", "error", "t")]
    assert [f.id for f in sort_findings(findings)] == ["c", "b", "a"]
    assert worst_verdict(f.verdict for f in findings) == "error"
    assert exit_code(findings) == 1
    assert exit_code(findings[:2]) == 0
    assert exit_code([Finding("d", "fail", "t")]) == 1


def test_exception_becomes_error_finding_with_traceback():
    try:
        raise RuntimeError("boom")
    except RuntimeError as exc:
        finding = Finding.from_exception("dtype.census", exc)
    assert finding.verdict == "error" and "boom" in finding.detail
    assert "RuntimeError" in finding.evidence["traceback"]
