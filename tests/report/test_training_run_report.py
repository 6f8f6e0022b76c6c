"""`diagnose OUTPUT_DIR` end to end: notebook 08 through papermill on a run the real Trainer wrote."""

import json
import sys
from pathlib import Path

import pytest

from tests.cli_in_process import workbench_here

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "probes" / "run"))
from planted_runs import NAN_STEP, _model, _NaNFrom, _train  # noqa: E402


@pytest.mark.slow
def test_diagnose_an_output_dir_without_a_final_save(tmp_path):
    model = _model()
    model.register_forward_hook(_NaNFrom(NAN_STEP))
    run = _train(tmp_path / "out", model=model, max_steps=20, final_save=False)
    result = workbench_here("diagnose", run, "--notebooks", "08", "--reports-dir", tmp_path / "reports",
                            env={"OMP_NUM_THREADS": "1"})
    assert "diagnosing checkpoint-20" in result.stdout and "no final save" in result.stdout, result.stdout
    folder = next(p for p in (tmp_path / "reports").glob("*/*") if p.is_dir())
    report = json.loads((folder / "findings.json").read_text())
    assert "checkpoint-20" in report["target"]["run"]
    verdicts = {f["id"]: f["verdict"] for f in report["findings"] if f["id"] in ("run.loss", "run.schedule")}
    assert verdicts == {"run.loss": "fail", "run.schedule": "pass"}
    assert result.returncode == 1  # a fail
    assert "data:image/png;base64" in (folder / "08_training_run.html").read_text()
    index = (folder / "index.html").read_text()
    assert index.index("Diagnosed:") < index.index("checkpoint-20 of") < index.index("Findings, worst first")
