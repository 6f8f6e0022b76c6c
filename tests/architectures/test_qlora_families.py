"""Healthy tiny checkpoints of DeBERTa-v2, Whisper and Gemma-3 text under the qlora set-up: no `error` (the probe
could not run) on any model-level check nor on serve.merge. DeBERTa-v2's training step raises in its own attention
under bf16 autocast, for any batch: grad.flow names that cause (`fail`, a known incompatibility), it is not an
error of ours. Gemma 3's RMSNorm computes in fp32 and returns `output.type_as(x)`: its fp32 norm weights after
prepare_model_for_kbit_training are no defect, and nothing warns about them."""

import pytest

from workbench.architectures.checkpoints import build_tiny_checkpoint
from workbench.architectures.checks_in_process import MODEL_LEVEL_NOTEBOOKS, model_level_findings
from workbench.architectures.known_incompatibilities import known_incompatibility
from workbench.architectures.model_types import architectures

NOTEBOOKS = (*MODEL_LEVEL_NOTEBOOKS, "10_serving")


def findings_of(model_type, parent):
    folder = build_tiny_checkpoint(next(a for a in architectures() if a.model_type == model_type), parent)
    found = model_level_findings(folder, setup="qlora", notebooks=NOTEBOOKS)
    return {f.id: f for f in found}


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["whisper", "gemma3_text"])
def test_healthy_family_under_qlora_is_clean(model_type, tmp_path):
    found = findings_of(model_type, tmp_path)
    bad = [(f.id, f.verdict, f.title, f.detail[:200]) for f in found.values() if f.verdict in ("warn", "fail", "error")]
    assert bad == []
    assert found["serve.merge"].verdict == "pass" and found["grad.flow"].verdict in ("pass", "info")
    if model_type == "gemma3_text":  # fp32 norms after the kbit upcast are named as peft's, on purpose
        assert found["dtype.fp32_islands"].verdict == "info" and "on purpose" in found["dtype.fp32_islands"].title


@pytest.mark.slow
def test_deberta_v2_under_qlora_names_the_real_cause_and_no_error(tmp_path):
    found = findings_of("deberta-v2", tmp_path)
    assert [f.id for f in found.values() if f.verdict == "error"] == []
    grad = found["grad.flow"]
    assert grad.verdict == "fail" and "known incompatibility" in grad.title
    assert grad.evidence["known_crash"]["source"].startswith("models/deberta_v2/modeling_deberta_v2.py:")
    assert found["serve.merge"].verdict == "pass"
    # the census's record of the same incompatibility: the problems of this record are known, not false alarms
    assert "DisentangledSelfAttention" in known_incompatibility("deberta-v2", "qlora")
