"""The architecture census: tiny configs shrunk generically, the architectures it covers, and a sample of the census
itself (the whole census is `make families`, its output committed in docs/families.*)."""

import json

import pytest
from repo import ROOT

from tests.architectures.compact_vocabulary import COMPACTED, build_compact_checkpoints
from workbench.architectures.census import record_for, run_census
from workbench.architectures.families_doc import finalized, markdown, summary
from workbench.architectures.model_types import Architecture, architectures
from workbench.architectures.tiny_config import tiny_config

# healthy tiny checkpoints outside the family matrix that once drew false alarms: VLMs saved without a processor
# (PaliGemma, Idefics3, Qwen2.5-VL), a speech seq2seq model (Whisper), an MLA/MoE model whose router keeps an fp32
# buffer on purpose (DeepSeek-V3), BART's final_logits_bias, a DeBERTa-v2 classifier; and plain decoders beside them
# the suite's slice of the census (issue 23: "a sample of ~12 architectures stays in make test"; `make families` runs
# every type): VLM layouts, speech, MLA/MoE, encoder-decoder, an encoder with a known incompatibility, decoders
SAMPLE = ("paligemma", "idefics3", "qwen2_5_vl", "whisper", "deepseek_v3", "bart", "deberta-v2", "phi3", "gemma3",
          "qwen3_moe", "mistral")


def _config(model_type):
    from transformers import CONFIG_MAPPING

    return tiny_config(type(CONFIG_MAPPING[model_type]()))


def test_tiny_configs_shrink_every_level_and_keep_what_the_sizes_derive():
    deepseek = _config("deepseek_v3")
    assert (deepseek.hidden_size, deepseek.num_hidden_layers, deepseek.n_routed_experts) == (64, 2, 4)
    assert deepseek.head_dim == deepseek.qk_rope_head_dim  # MLA: rotary part sizes head_dim
    qwen = _config("qwen2_5_vl")
    text = qwen.text_config
    assert text.hidden_size == 64 and qwen.vision_config.depth == 2 and qwen.vision_config.out_hidden_size == 64
    half_head = (text.hidden_size // text.num_attention_heads) // 2
    assert sum(text.rope_parameters["mrope_section"]) == half_head  # [16, 24, 24] rescaled
    whisper = _config("whisper")
    assert (whisper.d_model, whisper.encoder_layers, whisper.num_mel_bins) == (64, 2, 80)  # audio input kept
    assert _config("llama").vocab_size == 256
    assert _config("qwen2_5_vl").text_config.vocab_size > qwen.image_token_id  # a special id keeps its row
    # sizes under other names: Perceiver's latent array (its defaults, 1280 x 256 through 26 self-attentions, were
    # minutes a record without bf16 matmul kernels) and SAM-style vision MLPs (GOT-OCR2's mlp_dim 3072)
    perceiver = _config("perceiver")
    assert (perceiver.d_latents, perceiver.num_latents, perceiver.num_self_attends_per_block) == (64, 16, 2)
    assert (perceiver.num_self_attention_heads, perceiver.num_cross_attention_heads) == (4, 4)
    assert _config("got_ocr2").vision_config.mlp_dim == 128


def test_the_census_covers_every_auto_mapped_type_with_the_head_people_fine_tune():
    archs = {a.model_type: a for a in architectures()}
    assert len(archs) >= 300
    assert archs["whisper"].head == "speech_seq2seq" and archs["bert"].head == "seq_cls"
    assert archs["llama"].head == "causal_lm" and archs["qwen2_5_vl"].head == "image_text_to_text"
    assert archs["bart"].head == "seq2seq_lm"


def test_records_not_built_under_plain_carry_their_reason_to_every_setup():
    arch = Architecture("x", "causal_lm", "XForCausalLM")
    records = finalized([record_for(arch, "plain", None, [], "ValueError: bad sizes", 1.0),
                         record_for(arch, "qlora", None, [], None, 1.0)])
    assert [r["built"] for r in records] == [False, False]
    assert records[1]["reason"] == "not built: ValueError: bad sizes"
    assert summary(records)["built"] == 0 and "| x | XForCausalLM | not built" in markdown(records, {})


def test_a_composite_encoder_decoders_decoder_attends_to_the_encoder_as_its_checkpoints_do():
    from transformers import EncoderDecoderConfig, LlamaConfig, VisionEncoderDecoderConfig

    for config_class in (EncoderDecoderConfig, VisionEncoderDecoderConfig):
        decoder = tiny_config(config_class).decoder
        assert decoder.is_decoder and decoder.add_cross_attention, config_class.__name__
    assert not getattr(tiny_config(LlamaConfig), "add_cross_attention", False)  # a config of its own: untouched


def test_a_known_incompatibility_names_the_reason_of_a_record_written_before_it_was_known():
    from workbench.architectures.known_incompatibilities import known_incompatibility

    unrunnable = {"model_type": "fnet", "setup": "plain", "built": False, "verdicts": {}, "problems": [],
                  "reason": "no batch runs the tiny checkpoint: BatchNotAccepted: Unsupported dtype BFloat16"}
    healthy = {"model_type": "llama", "setup": "plain", "built": True, "verdicts": {}, "problems": [], "reason": None}
    broken = {**healthy, "problems": [{"id": "grad.flow", "verdict": "fail", "title": "t", "detail": ""}]}
    records = finalized([unrunnable, healthy, broken])
    assert records[0]["reason"] == known_incompatibility("fnet", "plain") and "torch.fft" in records[0]["reason"]
    assert records[1]["reason"] is None and records[2]["reason"] is None  # nothing known about llama: a false alarm
    assert summary(records)["records_with_problems"] == 1


@pytest.mark.slow
def test_a_sample_of_architectures_is_built_and_clean_under_plain_and_qlora(tmp_path, monkeypatch):
    # the VLMs whose image token ids keep 151k-262k vocabulary rows are built with those ids moved into 256 rows
    # (tests/architectures/compact_vocabulary.py); the census finds them where it builds its checkpoints
    build_compact_checkpoints(COMPACTED, tmp_path / "checkpoints", monkeypatch)
    records = finalized(run_census(("plain", "qlora"), list(SAMPLE), tmp_path))
    assert {(r["model_type"], r["setup"]) for r in records} == {(t, s) for t in SAMPLE for s in ("plain", "qlora")}
    unbuilt = [(r["model_type"], r["reason"]) for r in records if not r["built"]]
    assert unbuilt == []
    alarms = [(r["model_type"], r["setup"], p["id"], p["verdict"], p["title"]) for r in records
              for p in r["problems"] if not r["reason"]]
    assert alarms == []
    known = {(r["model_type"], r["setup"]) for r in records if r["problems"]}
    assert known == {("deberta-v2", "qlora")}  # a real incompatibility, named with its upstream issue
    deberta = next(r for r in records if (r["model_type"], r["setup"]) == ("deberta-v2", "qlora"))
    assert deberta["verdicts"]["forward.scenarios"] == "fail" and "#35332" in deberta["reason"]
    # the compacted vocabularies change no verdict: each is the committed census' (its full vocabularies)
    committed = {(r["model_type"], r["setup"]): r["verdicts"]
                 for r in json.loads((ROOT / "docs" / "families.json").read_text())["records"]}
    compacted = {(r["model_type"], r["setup"]): r["verdicts"] for r in records if r["model_type"] in COMPACTED}
    assert compacted == {key: committed[key] for key in compacted} and len(compacted) == 2 * len(COMPACTED)
