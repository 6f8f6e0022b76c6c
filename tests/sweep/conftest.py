import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from lora_history import build_lora_run, plant


@dataclasses.dataclass(frozen=True)
class LoraRuns:
    """Trainer output_dirs of one real LoRA run (checkpoint-1 … checkpoint-4) and copies with planted faults."""

    healthy: Path
    nan: Path  # lora_B NaN from checkpoint-3 on
    other_pad: Path  # the tokenizer saved with another pad, past the embedding rows, from checkpoint-3 on
    nan_then_no_modules_to_save: Path  # NaN from checkpoint-3 on, modules_to_save gone from checkpoint-4 on


@pytest.fixture(scope="session")
def lora_runs(tmp_path_factory) -> LoraRuns:
    """Trained once per test session (about 20 s) by the first worker that asks; the others read its folders."""
    from tests.shared_builds import built_once

    with built_once(tmp_path_factory, "sweep-lora-runs") as root:
        runs = LoraRuns(**{f.name: root / f.name for f in dataclasses.fields(LoraRuns)})
        if not (root / "BUILT").exists():
            healthy = build_lora_run(root)
            plant(healthy, runs.nan, {"nan": 3})
            plant(healthy, runs.other_pad, {"other_pad": 3})
            plant(healthy, runs.nan_then_no_modules_to_save, {"nan": 3, "no_modules_to_save": 4})
            (root / "BUILT").write_text("the LoRA run and its planted copies\n")
        return runs


@dataclasses.dataclass
class SweepRun:
    result: subprocess.CompletedProcess
    folder: Path  # the sweep's folder
    document: dict  # its sweep.json

    def verdicts(self) -> dict[str, dict[str, str]]:
        return {m["name"]: m["verdicts"] for m in self.document["members"]}

    def failing(self) -> dict[str, list[str]]:
        return {m["name"]: sorted(c for c, v in m["verdicts"].items() if v in ("fail", "error"))
                for m in self.document["members"]}

    def member_report(self, name: str) -> dict:
        member = next(m for m in self.document["members"] if m["name"] == name)
        return json.loads((self.folder / member["report"] / "findings.json").read_text())


def run_sweep(arguments: list[str], reports: Path, env: dict | None = None) -> SweepRun:
    """`python -m workbench sweep ARGUMENTS --reports-dir REPORTS` in a subprocess, as a user runs it.
    `env`: added to this process' environment."""
    command = [sys.executable, "-m", "workbench", "sweep", *arguments, "--reports-dir", str(reports)]
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    stdout, stderr = process.communicate(timeout=1800)
    result = subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
    folders = [p for p in reports.glob("*/*") if p.is_dir()]
    assert len(folders) == 1, (folders, stdout[-3000:], stderr[-3000:])
    return SweepRun(result, folders[0], json.loads((folders[0] / "sweep.json").read_text()))


@pytest.fixture(scope="session")
def three_runs(lora_runs) -> list[str]:
    """A sweep of three runs: healthy, a NaN adapter from checkpoint-3, a tokenizer saved with another pad."""
    return [str(lora_runs.healthy), str(lora_runs.nan), str(lora_runs.other_pad)]


@pytest.fixture(scope="session")
def local_sweep(three_runs, tmp_path_factory):
    """That sweep on the local engine, members diagnosed with notebook 00 (it answers both faults)."""
    return run_sweep([*three_runs, "--notebooks", "00"], tmp_path_factory.mktemp("local-sweep"))
