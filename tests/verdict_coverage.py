"""Verdict coverage, as pytest hooks: every verdict each check declares is produced by some test, and no test
produces a verdict its check does not declare.

Every process of the run (the xdist workers, the kernels and torchrun ranks they start) appends the (check, verdict)
pairs its probes produce to one folder (`workbench.contract.VERDICT_LOG_ENV`); when the whole suite ran and passed,
the controller compares them with the catalog and fails the run on a gap, listing it. A run of a subset (`-m`, `-k`,
paths, `make test-fast`) only reports undeclared verdicts, which strict mode already raises where they are made.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from workbench.contract import VERDICT_LOG_ENV, coverage_gaps, read_verdict_logs

_GAPS_KEY = "workbench_verdict_gaps"


def pytest_configure(config):
    worker = getattr(config, "workerinput", None)
    if worker is not None:  # an xdist worker: the controller's folder
        os.environ[VERDICT_LOG_ENV] = worker[VERDICT_LOG_ENV]
    elif not os.environ.get(VERDICT_LOG_ENV):
        folder = tempfile.mkdtemp(prefix="workbench-verdicts-")
        os.environ[VERDICT_LOG_ENV] = folder
        config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    node.workerinput[VERDICT_LOG_ENV] = os.environ[VERDICT_LOG_ENV]


def _whole_suite(config) -> bool:
    args_source = getattr(config, "args_source", None)
    return (not config.getoption("markexpr") and not config.getoption("keyword")
            and not config.getoption("deselect") and not config.getoption("lf", False)
            and args_source is not None and args_source.name == "TESTPATHS")


def pytest_sessionfinish(session, exitstatus):
    if getattr(session.config, "workerinput", None) is not None:
        return
    missing, undeclared = coverage_gaps(read_verdict_logs(os.environ[VERDICT_LOG_ENV]))
    if not _whole_suite(session.config):
        missing = []
    session.config.__dict__[_GAPS_KEY] = (missing, undeclared)
    if (missing or undeclared) and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    missing, undeclared = config.__dict__.get(_GAPS_KEY, ([], []))
    if not (missing or undeclared):
        return
    terminalreporter.section("verdict coverage", sep="=", red=True)
    if missing:
        terminalreporter.write_line(f"{len(missing)} declared verdicts no test produced (plant a case for each, or "
                                    "drop the verdict from the catalog):")
        for item in missing:
            terminalreporter.write_line(f"  {item}")
    if undeclared:
        terminalreporter.write_line(f"{len(undeclared)} verdicts produced that their check does not declare:")
        for item in undeclared:
            terminalreporter.write_line(f"  {item}")
