"""train.fp16: a trainable fp16 parameter under fp16=True (PEFT modules_to_save on an fp16 model, peft #341) fails
and its fp32 twin passes; planted large weights overflow fp16 and a healthy tiny model keeps its headroom; without
fp16 the same evidence is only information."""

import pytest
import torch

from workbench.model.batch import target_inputs
from workbench.model.passes import counted_passes
from workbench.model.setups import PreparedModel
from workbench.model.target import resolve_target
from workbench.probes.train import fp16
from workbench.probes.train.configuration import TrainingConfiguration
from workbench.probes.train.fp16 import fp16_probe
from workbench.probes.train.fp16_headroom import FP16_REFUSED_BY_VLLM, headroom_bits, vllm_fp16_refusal


def tiny_llama(dtype=torch.float32):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(config).to(dtype)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fp16") / "llama"
    tiny_llama().save_pretrained(folder)
    return resolve_target(str(folder))


def configuration(tmp_path, fp16: bool) -> TrainingConfiguration:
    from transformers import TrainingArguments

    args = TrainingArguments(str(tmp_path / "out"), fp16=fp16, report_to=[])
    return TrainingConfiguration("file training_args.yaml", args, given={"fp16": fp16})


def with_saved_head(model):
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], modules_to_save=["lm_head"]))


def finding(result, verdicts=None):
    found = [f for f in result.findings() if f.id == "train.fp16"]
    return found if verdicts is None else [f for f in found if f.verdict in verdicts]


def test_modules_to_save_copy_of_an_fp16_model_fails_under_fp16(target, tmp_path):
    model = with_saved_head(tiny_llama(torch.float16))
    result = fp16_probe(PreparedModel(model, None, "test", "fp16 + modules_to_save"), target,
                        configuration(tmp_path, True))
    failed = finding(result, {"fail"})
    trainable = [f for f in failed if "trainable" in f.title]
    assert trainable, result.findings()
    assert "lm_head.modules_to_save.default.weight" in trainable[0].detail
    assert "Attempting to unscale FP16 gradients" in trainable[0].detail
    assert "param.data = param.data.float()" in trainable[0].fix
    assert "huggingface/peft#341" in trainable[0].evidence["upstream"]
    assert not any(".lora_" in n for n in result.fp16_trainable)  # PEFT upcasts its LoRA weights itself


def test_the_same_adapter_on_an_fp32_model_passes(target, tmp_path):
    model = with_saved_head(tiny_llama(torch.float32))
    result = fp16_probe(PreparedModel(model, None, "test", "fp32 + modules_to_save"), target,
                        configuration(tmp_path, True))
    assert [f.verdict for f in finding(result)] == ["pass"], result.findings()
    assert result.reading.residual and len(result.reading.residual) == 2  # one point per decoder block
    assert result.judged_view == "AMP"


def test_planted_large_weights_overflow_fp16(target, tmp_path):
    model = tiny_llama()
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.mul_(1e9)  # the residual stream leaves fp16's range
    result = fp16_probe(PreparedModel(model, None, "test", "planted"), target, configuration(tmp_path, True))
    failed = finding(result, {"fail"})
    assert failed and "overflows" in failed[0].title, result.findings()
    assert result.reading.residual[-1]["headroom_bits"] < 0
    assert failed[0].evidence["amp_lowest"][0]["headroom_bits"] < 0


def test_without_fp16_the_headroom_is_information(target, tmp_path):
    model = tiny_llama()
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.mul_(1e9)
    result = fp16_probe(PreparedModel(model, None, "test", "planted"), target, configuration(tmp_path, False))
    assert [f.verdict for f in finding(result)] == ["info"]
    assert "not judged" in finding(result)[0].detail


def test_a_running_training_without_fp16_skips_the_fp32_forward(target, tmp_path):
    """In the training callback the run's launch is known: without fp16 there is no headroom to judge, so no forward
    is paid. The same arguments in a diagnosis (which may still be turned to fp16) get the reading, and an
    accelerator launched with mixed_precision='fp16' counts as fp16; on this fp32 model both read the forward that
    accepted the batch, which is the fp32 forward."""
    from workbench.probes.train.configuration import RunLaunch

    args = configuration(tmp_path, False).args
    running = TrainingConfiguration("trainer", args, object(), launch=RunLaunch(1, "bf16", False))
    with counted_passes() as passes:
        result = fp16_probe(PreparedModel(tiny_llama(), None, "test", "bf16 run"), target, running)
    (found,) = finding(result)
    assert found.verdict == "info" and "not read" in found.title and result.reading is None and passes.forwards == 0
    assert "fp16=False (trainer)" in found.detail
    diagnosed = TrainingConfiguration("trainer", args, object())  # a set-up's Trainer: its launch is not known
    with counted_passes() as passes:
        result = fp16_probe(PreparedModel(tiny_llama(), None, "test", "set-up"), target, diagnosed)
    assert result.reading is not None and passes.forwards == 1  # the batch's own check, read for the headroom
    assert result.read_from == "the fp32 forward that accepted the batch"
    launched_fp16 = TrainingConfiguration("trainer", args, object(), launch=RunLaunch(2, "fp16", False))
    with counted_passes() as passes:
        result = fp16_probe(PreparedModel(tiny_llama(), None, "test", "fp16 run"), target, launched_fp16)
    assert result.uses_fp16 and result.reading is not None and passes.forwards == 1
    assert "mixed_precision='fp16'" in result.fp16_cited


def rows(reading):
    return {view: {r["module"]: r["headroom_bits"] for r in getattr(reading, view)} for view in ("amp", "half")}


def test_an_fp32_models_reading_is_its_accepting_forward_and_equals_its_own_fp32_forward(target, tmp_path):
    model = tiny_llama()
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.mul_(1e9)
    with counted_passes() as passes:
        result = fp16_probe(PreparedModel(model, None, "test", "planted"), target, configuration(tmp_path, True))
    assert passes.forwards == 1 and result.read_from == "the fp32 forward that accepted the batch"
    assert [f.verdict for f in finding(result)] == ["fail"]
    inputs, _how = target_inputs(model, target)
    own = fp16._fp32_forward(model, inputs, set(model._no_split_modules))
    assert rows(result.reading) == rows(own) and result.reading.residual == own.residual
    assert "Read from the fp32 forward that accepted the batch" in finding(result)[0].detail


def test_a_bf16_model_reads_its_accepting_forward_only_while_fp16_is_not_configured(target, tmp_path):
    model = tiny_llama(torch.bfloat16)
    with counted_passes() as passes:
        shared = fp16_probe(PreparedModel(model, None, "test", "bf16"), target, configuration(tmp_path, False))
    assert passes.forwards == 1 and "accepted the batch, in the model's own dtypes (bfloat16" in shared.read_from
    (found,) = finding(shared)
    assert found.verdict == "info" and shared.read_from in found.detail and found.evidence["read_from"]
    with counted_passes() as passes:
        judged = fp16_probe(PreparedModel(model, None, "test", "bf16"), target, configuration(tmp_path, True))
    assert passes.forwards == 1 and judged.read_from == "one fp32 forward"  # the batch was accepted before
    assert [f.verdict for f in finding(judged)] == ["pass"]
    exact, approx = rows(judged.reading), rows(shared.reading)
    assert exact.keys() == approx.keys() and all(exact[v].keys() == approx[v].keys() for v in exact)
    # the bf16 forward's values against the fp32 one's: within bf16's rounding through two blocks
    assert max(abs(exact[v][m] - approx[v][m]) for v in exact for m in exact[v]) < 0.05
    half = tiny_llama(torch.float16)
    with counted_passes() as passes:
        own = fp16_probe(PreparedModel(half, None, "test", "fp16 weights"), target, configuration(tmp_path, False))
    assert passes.forwards == 2 and own.read_from == "one fp32 forward"  # fp16's range is not fp32's: read in fp32


def test_an_fp16_model_is_judged_in_the_half_weights_view_and_restored(target, tmp_path):
    model = tiny_llama(torch.float16)
    before = {n: p.data_ptr() for n, p in model.named_parameters()}
    result = fp16_probe(PreparedModel(model, None, "test", "fp16 full fine-tune"), target,
                        configuration(tmp_path, True))
    assert result.judged_view == "half weights"
    assert all(p.data_ptr() == before[n] and p.dtype == torch.float16 for n, p in model.named_parameters())
    trainable = [f for f in finding(result, {"fail"}) if "trainable" in f.title]
    assert trainable  # a full fine-tune of an fp16 model: every parameter is trainable fp16


def test_headroom_arithmetic_and_the_vllm_table():
    assert headroom_bits(65504.0) == 0 and headroom_bits(4000.0) > 4 > headroom_bits(4100.0)
    assert headroom_bits(float("inf")) == float("-inf") and headroom_bits(0.0) == float("inf")
    from transformers import Gemma2Config, LlamaConfig

    assert vllm_fp16_refusal(Gemma2Config())[0] == "gemma2" and "gemma3_text" in FP16_REFUSED_BY_VLLM
    assert vllm_fp16_refusal(LlamaConfig()) is None


def test_headroom_under_four_bits_warns_naming_the_module_and_the_healthy_model_passes(target, tmp_path):
    model = tiny_llama()
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.mul_(2e5)  # |x| about 13000: inside fp16, under 4 bits of room
    result = fp16_probe(PreparedModel(model, None, "test", "planted"), target, configuration(tmp_path, True))
    (found,) = finding(result)
    assert found.verdict == "warn" and found.title.startswith("fp16 headroom only"), found
    assert "at model.layers.0.mlp.down_proj" in found.title
    lowest = found.evidence["amp_lowest"][0]
    assert lowest["module"] == "model.layers.0.mlp.down_proj" and 0 < lowest["headroom_bits"] < 4
    assert "fp16=True (file training_args.yaml)" in found.detail and "can overflow" in found.detail
    assert "bf16=True" in found.fix and "keep the modules named here in fp32" in found.fix
    healthy = fp16_probe(PreparedModel(tiny_llama(), None, "test", "healthy"), target, configuration(tmp_path, True))
    assert [f.verdict for f in finding(healthy)] == ["pass"]


def test_a_model_type_vllm_refuses_in_fp16_warns_under_fp16_with_ample_headroom(tmp_path):
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(0)
    folder = tmp_path / "gemma2"
    Gemma2ForCausalLM(Gemma2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                   max_position_embeddings=64)).save_pretrained(folder)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    result = fp16_probe(PreparedModel(model, None, "test", "gemma2"), resolve_target(str(folder)),
                        configuration(tmp_path, True))
    (found,) = finding(result)
    assert found.verdict == "warn" and found.title.startswith("vLLM refuses gemma2 in fp16"), found
    assert found.evidence["vllm_refuses_fp16"]["model_type"] == "gemma2"
    assert "_FLOAT16_NOT_SUPPORTED_MODELS" in found.evidence["vllm_refuses_fp16"]["source"]
    assert min(r["headroom_bits"] for r in found.evidence["amp_lowest"]) >= 4  # the headroom alone would pass
    assert "bf16=True" in found.fix
    off = fp16_probe(PreparedModel(model, None, "test", "gemma2"), resolve_target(str(folder)),
                     configuration(tmp_path, False))
    assert [f.verdict for f in finding(off)] == ["info"]  # not judged without fp16: the refusal is said, not warned


def test_a_forward_that_only_runs_in_its_own_dtype_is_an_error_naming_the_exception(target, tmp_path):
    # a block that hard-casts its input to bf16 (as some remote-code models do) runs as prepared, in bf16, and
    # raises in the fp32 forward the headroom is read from
    model = tiny_llama(torch.bfloat16)
    mlp = model.model.layers[1].mlp
    original = mlp.forward
    mlp.forward = lambda hidden: original(hidden.to(torch.bfloat16))
    result = fp16_probe(PreparedModel(model, None, "test", "bf16 cast"), target, configuration(tmp_path, True))
    (found,) = finding(result)
    assert found.verdict == "error" and found.title == "The fp32 forward for the fp16 headroom did not run", found
    assert "expected m1 and m2 to have the same dtype" in found.evidence["forward_error"]
    assert found.evidence["forward_error"] in found.detail and found.evidence["inputs"]
    assert "forward_inputs in --params" in found.fix
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())  # the casts were put back
    twin = fp16_probe(PreparedModel(tiny_llama(torch.bfloat16), None, "test", "bf16"), target,
                      configuration(tmp_path, True))
    assert [f.verdict for f in finding(twin)] == ["pass"]


@pytest.mark.parametrize("name", ["gpt2", "t5", "bert_encoder", "mixtral", "gemma3_text", "qwen2_vl"])
def test_the_accepting_forwards_reading_across_families(family, name, tmp_path):
    """Tied fp32 Conv1D (gpt2), an fp32 encoder-decoder (t5) and a bare fp32 encoder: with fp16=True the reading is
    the accepting forward's, equal to the probe's own fp32 forward; a bf16 MoE, a bf16 tied Gemma and a bf16 VLM
    saved without a processor, fp16 not configured: the accepting forward's reading, information within bf16's
    rounding of the fp32 forward's."""
    from workbench.model.setups import prepare_model

    folder = family(name)
    target = resolve_target(str(folder))
    model = prepare_model(target).model
    fp32 = {p.dtype for p in model.parameters()} == {torch.float32}
    inputs, _how = target_inputs(model, target)  # the batch checked, as notebook 01 does before notebook 09
    with counted_passes() as passes:
        result = fp16_probe(PreparedModel(model, None, "test", name), target, configuration(tmp_path, fp32))
    assert passes.forwards == 0, result.read_from  # no forward for the headroom
    own = fp16._fp32_forward(model, inputs, set(type(model)._no_split_modules or ()))
    (found,) = finding(result)
    assert result.read_from in found.detail and found.evidence["read_from"] == result.read_from
    if fp32:
        assert result.read_from == "the fp32 forward that accepted the batch"
        assert rows(result.reading) == rows(own) and result.reading.residual == own.residual
        assert found.verdict == "pass", found
    else:
        assert "in the model's own dtypes" in result.read_from and found.verdict == "info", found
        shared, exact = rows(result.reading), rows(own)
        assert shared.keys() == exact.keys()
        assert all(abs(shared[v][m] - exact[v][m]) < 0.2 for v in exact for m in exact[v] if m in shared[v])
        assert abs(result.reading.amp_min - own.amp_min) < 0.05 and abs(result.reading.half_min - own.half_min) < 0.05


def test_the_report_draws_one_point_per_block_without_matplotlib(target, tmp_path, monkeypatch):
    import sys
    import xml.etree.ElementTree as ET

    model = tiny_llama()
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.mul_(1e9)
    result = fp16_probe(PreparedModel(model, None, "test", "planted"), target, configuration(tmp_path, True))
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # any import of it raises ImportError
    html = result.details().html()
    svg = ET.fromstring(html[html.index("<svg"):html.index("</svg>") + 6])
    points = [c.find("{http://www.w3.org/2000/svg}title").text for c in svg.iter("{http://www.w3.org/2000/svg}circle")]
    # the overflow's -inf-like headroom drawn at -1, the floor of the axis
    assert points == [f"{r['layer']}: {max(r['headroom_bits'], -1):,g}" for r in result.reading.residual]
    assert any(p.endswith(": -1") for p in points), points


def test_an_all_zero_model_draws_its_chart_without_the_points_that_are_not_finite(target, tmp_path):
    """Every weight 0 (the bench's sparse 7B-shaped checkpoint reads so): every residual's headroom is inf, which the
    chart leaves out instead of failing the page."""
    model = tiny_llama()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    result = fp16_probe(PreparedModel(model, None, "test", "zeros"), target, configuration(tmp_path, False))
    assert result.reading.residual and all(r["headroom_bits"] == float("inf") for r in result.reading.residual)
    html = result.details().html()
    assert "fp16 headroom of the residual stream per block" in html and "<circle" not in html
