"""A training step that crashes in the model's own code for any batch (a known incompatibility of the stack) is a
`fail` naming the cause, the raising source line, the versions and a fix checked by running the step without
autocast; a crash the table does not match (our batch, our harness) stays an `error`."""

import pytest
import torch

from workbench.architectures.checkpoints import build_tiny_checkpoint
from workbench.architectures.model_types import architectures
from workbench.probes.forward.grad_flow import GradFlowResult
from workbench.probes.forward.known_crashes import KNOWN_CRASHES, known_crash

DEBERTA_MESSAGE = "value cannot be converted to type c10::BFloat16 without overflow"


def tiny(model_type, parent):
    return build_tiny_checkpoint(next(a for a in architectures() if a.model_type == model_type), parent)


def deberta_v2():
    from transformers import DebertaV2Config, DebertaV2ForSequenceClassification

    torch.manual_seed(0)
    return DebertaV2ForSequenceClassification(DebertaV2Config(
        vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=64, relative_attention=True, pos_att_type=["p2c", "c2p"])).eval()


def test_the_same_message_raised_outside_the_models_code_is_not_the_known_crash():
    model = deberta_v2()
    try:
        raise RuntimeError(DEBERTA_MESSAGE)  # our harness raising it: no transformers frame
    except RuntimeError as exc:
        assert known_crash(model, exc) is None


def test_the_models_own_line_is_matched_from_the_live_traceback():
    model = deberta_v2()
    for layer in model.deberta.encoder.layer:  # an fp32 query and key under bf16 autocast, as after the kbit upcast
        for proj in (layer.attention.self.query_proj, layer.attention.self.key_proj):
            proj.register_forward_hook(lambda m, args, out: out.float())
    with pytest.raises(RuntimeError) as info, torch.autocast("cpu", dtype=torch.bfloat16):
        model(input_ids=torch.arange(8).reshape(1, 8))
    crash = known_crash(model, info.value)
    assert crash is not None and crash["class"] == "DisentangledSelfAttention"
    assert crash["module"] == "deberta.encoder.layer.0.attention.self"
    assert crash["source"].startswith("models/deberta_v2/modeling_deberta_v2.py:")
    assert "masked_fill" in crash["code"] and "finfo(query_layer.dtype).min" in crash["code"]
    assert crash["installed"]["transformers"] and "DebertaV2ForSequenceClassification" in crash["fix"]
    other = RuntimeError("some other error")
    other.__traceback__ = info.value.__traceback__
    assert known_crash(model, other) is None  # the same line with another message: not this row


def test_an_unmatched_crash_stays_an_error():
    result = GradFlowResult([], None, "RuntimeError: our batch was wrong", {"enabled": False}, False,
                            raised_at="models/x/modeling_x.py:1 (forward): y")
    finding = result.findings()[0]
    assert finding.verdict == "error" and finding.evidence["raised_at"].startswith("models/x/")


def test_every_row_names_its_source_versions_and_reference():
    for row in KNOWN_CRASHES:
        assert row.raised_in.startswith("models/") and row.raised_in.endswith(".py")
        assert "transformers" in row.seen_on and row.reference and row.condition and "{model_class}" in row.fix


@pytest.mark.slow
def test_deberta_v2_under_qlora_fails_with_the_real_cause_not_an_error(tmp_path):
    from workbench.model.setups import prepare_model
    from workbench.model.target import resolve_target
    from workbench.probes.forward.grad_flow import grad_flow_probe

    target = resolve_target(str(tiny("deberta-v2", tmp_path)), setup="qlora", quant="4bit")
    finding = grad_flow_probe(prepare_model(target), target).findings()[0]
    assert finding.verdict == "fail", (finding.verdict, finding.title, finding.detail[:300])
    assert "DisentangledSelfAttention" in finding.title and "known incompatibility" in finding.title
    crash = finding.evidence["known_crash"]
    assert crash["source"].startswith("models/deberta_v2/modeling_deberta_v2.py:")
    assert DEBERTA_MESSAGE in crash["exception"] and "prepare_model_for_kbit_training" in crash["cause"]
    assert crash["installed"]["bitsandbytes"] and crash["installed"]["peft"]
    assert crash["without_autocast"].get("loss") is not None  # the fix, checked: the step runs without autocast
    assert "bf16=False" in finding.fix and "DebertaV2ForSequenceClassification" in finding.fix
