"""serve.adapter: each engine rule planted in an adapter PEFT builds, and a healthy twin OK everywhere."""

from __future__ import annotations

import math
import time

import pytest

from tests.probes.serve.conftest import save_adapter, target_for
from workbench.probes.serve.adapter_rules import serve_adapter_probe


def probe(bases, tmp_path, engines=None, tie=False, **lora):
    base = bases["tied" if tie else "untied"]
    adapter = save_adapter(base, tmp_path / "adapter", tie=tie, **lora)
    return serve_adapter_probe(target_for(base, adapter), engines)


def outcomes(result):
    return {e.engine: e.outcome for e in result.engines}


def test_healthy_r8_lora_is_ok_everywhere(bases, tmp_path):
    result = probe(bases, tmp_path, r=8, lora_alpha=16)
    assert outcomes(result) == {"vllm": "OK", "llama.cpp": "OK", "tgi": "OK", "sglang": "OK"}
    assert result.findings()[0].verdict == "pass"
    assert all(e.max_relative_difference < 1e-6 for e in result.engines)


def test_rslora_at_rank_64_is_silent_on_llama_cpp_and_sglang(bases, tmp_path):
    result = probe(bases, tmp_path, r=64, lora_alpha=16, use_rslora=True)
    by = {e.engine: e for e in result.engines}
    assert by["llama.cpp"].outcome == "SILENT" and by["sglang"].outcome == "SILENT"
    assert by["llama.cpp"].factor == pytest.approx(8.0)  # α/√64 against α/64
    assert by["llama.cpp"].max_relative_difference == pytest.approx(1 - 1 / 8)
    assert "--lora-scaled adapter.gguf:8" in by["llama.cpp"].fix
    assert by["vllm"].outcome == "FLAG" and "--max-lora-rank 64" in by["vllm"].fix  # rank 64 > 16, scale right
    assert by["tgi"].outcome == "OK"
    finding = result.findings()[0]  # no engine named: a defect of llama.cpp's alone is a warn naming the condition
    assert finding.verdict == "warn" and "8x too small" in finding.title and finding.title.startswith("If served on")
    assert "--serve" in finding.fix and "--lora-scaled adapter.gguf:8" in finding.fix
    stated = probe(bases, tmp_path, engines="llama.cpp", r=64, lora_alpha=16, use_rslora=True).findings()[0]
    assert stated.verdict == "fail" and "8x too small" in stated.title  # served there: the defect is the user's


def test_rslora_engines_chosen_decide_the_verdict(bases, tmp_path):
    result = probe(bases, tmp_path, engines="tgi", r=64, lora_alpha=16, use_rslora=True)
    assert outcomes(result) == {"tgi": "OK"}
    assert result.findings()[0].verdict == "pass"


def test_rank_above_16_needs_the_vllm_flag(bases, tmp_path):
    result = probe(bases, tmp_path, r=32, lora_alpha=64)
    assert outcomes(result) == {"vllm": "FLAG", "llama.cpp": "OK", "tgi": "OK", "sglang": "OK"}
    finding = result.findings()[0]
    assert finding.verdict == "warn" and "--max-lora-rank 32" in finding.fix


def test_dora_is_refused_by_vllm_and_llama_cpp_and_silent_on_tgi(bases, tmp_path):
    result = probe(bases, tmp_path, r=8, lora_alpha=16, use_dora=True)
    got = outcomes(result)
    assert got["vllm"] == "ERROR" and got["llama.cpp"] == "ERROR" and got["tgi"] == "SILENT"
    assert got["sglang"] == "OK" and "dora" in next(e for e in result.engines if e.engine == "sglang").unconfirmed
    assert result.findings()[0].verdict == "warn"  # TGI's silent drop, but TGI was never named
    assert probe(bases, tmp_path, engines=["tgi", "vllm"], r=8, lora_alpha=16,
                 use_dora=True).findings()[0].verdict == "fail"


def test_modules_to_save_is_refused_or_dropped(bases, tmp_path):
    result = probe(bases, tmp_path, r=8, lora_alpha=16, modules_to_save=["lm_head"])
    got = outcomes(result)
    assert got["vllm"] == "ERROR" and got["llama.cpp"] == "ERROR" and got["tgi"] == "SILENT"
    assert "merge_and_unload()" in result.findings()[0].fix


def test_alpha_pattern_is_silent_where_alpha_is_global(bases, tmp_path):
    result = probe(bases, tmp_path, r=8, lora_alpha=16, alpha_pattern={"q_proj": 32})
    by = {e.engine: e for e in result.engines}
    assert by["vllm"].outcome == "SILENT" and by["llama.cpp"].outcome == "SILENT"
    assert by["vllm"].factors == pytest.approx((1.0, 2.0))  # q_proj scaled 2x in PEFT, v_proj equal
    assert by["sglang"].outcome == "OK" and "alpha_pattern" in by["sglang"].unconfirmed


def test_rank_pattern_is_right_on_llama_cpp_and_silent_on_vllm(bases, tmp_path):
    result = probe(bases, tmp_path, r=8, lora_alpha=16, rank_pattern={"q_proj": 4})
    by = {e.engine: e for e in result.engines}
    assert by["llama.cpp"].outcome == "OK"  # α / rank of each tensor = PEFT's
    assert by["vllm"].outcome == "SILENT" and by["vllm"].factors == pytest.approx((1.0, 2.0))


def test_lora_on_lm_head_of_a_tied_base_stops_the_gguf_converter(bases, tmp_path):
    tied = probe(bases, tmp_path, tie=True, r=8, lora_alpha=16, target_modules=["q_proj", "lm_head"])
    assert outcomes(tied)["llama.cpp"] == "ERROR"
    untied = probe(bases, tmp_path / "u", r=8, lora_alpha=16, target_modules=["q_proj", "lm_head"])
    assert outcomes(untied)["llama.cpp"] == "OK"


def test_full_model_is_skipped(bases):
    assert serve_adapter_probe(target_for(bases["untied"], None)).findings()[0].verdict == "skip"


def test_seven_b_shaped_adapter_files_part(tmp_path):
    """A 7B-shaped r=16 q/k/v/o adapter (Qwen2-VL 7B shapes): the files part's time is reported, not asserted."""
    import json

    import torch
    from safetensors.torch import save_file

    hidden, kv, layers, r = 3584, 512, 28, 16
    tensors = {}
    for i in range(layers):
        for name, out in (("q_proj", hidden), ("k_proj", kv), ("v_proj", kv), ("o_proj", hidden)):
            prefix = f"base_model.model.model.language_model.layers.{i}.self_attn.{name}"
            tensors[f"{prefix}.lora_A.weight"] = torch.full((r, hidden), 0.01, dtype=torch.bfloat16)
            tensors[f"{prefix}.lora_B.weight"] = torch.full((out, r), 0.001, dtype=torch.bfloat16)
    adapter = tmp_path / "adapter7b"
    adapter.mkdir()
    save_file(tensors, str(adapter / "adapter_model.safetensors"))
    (adapter / "adapter_config.json").write_text(json.dumps({"r": r, "lora_alpha": 32, "use_rslora": True,
                                                             "peft_type": "LORA"}))
    start = time.perf_counter()
    result = serve_adapter_probe(target_for(tmp_path, adapter))
    elapsed = time.perf_counter() - start
    print(f"serve.adapter files part on a 7B-shaped adapter: {elapsed:.3f} s")
    by = {e.engine: e for e in result.engines}
    assert by["llama.cpp"].factor == pytest.approx(math.sqrt(r))
    assert len(result.modules) == layers * 4
