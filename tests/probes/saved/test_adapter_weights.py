"""adapter.weights on adapters PEFT itself built on the tiny VLMs: a whole component that never moved (lora_B
exactly zero while the rest moved), or a quarter of the modules, warns; a few modules inside a component that
moved stay a pass, named in the text."""

from pathlib import Path

import pytest
import torch

from workbench.probes.saved.adapter_weights import adapter_weights_probe
from workbench.probes.saved.files import saved_files


def trained_adapter(base: Path, out: Path, targets, still=lambda name: False) -> Path:
    """A LoRA PEFT builds on the VLM, "trained": every lora_B set non-zero except those `still(name)` keeps at
    LoRA's initial zero."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForImageTextToText

    torch.manual_seed(0)
    model = get_peft_model(AutoModelForImageTextToText.from_pretrained(base), LoraConfig(r=2, target_modules=targets))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name and not still(name):
                p.normal_(0, 0.01)
    model.save_pretrained(out)
    return out


def finding(base: Path, adapter: Path):
    [f] = adapter_weights_probe(saved_files(base, adapter)).findings()
    assert f.id == "adapter.weights"
    return f


@pytest.mark.parametrize("name, tower", [("llava", "vision_tower"), ("qwen2_vl", "visual")])
def test_a_vision_tower_that_never_moved_warns(family, tmp_path, name, tower):
    base = family(name)
    targets = ["q_proj", "v_proj"] if name == "llava" else ["q_proj", "v_proj", "qkv"]
    adapter = trained_adapter(base, tmp_path / "text-only", targets, still=lambda n: f".{tower}." in n)
    f = finding(base, adapter)
    assert f.verdict == "warn" and "the whole vision component never moved" in f.title, f
    per = f.evidence["never_moved_per_component"]
    assert per["language"] == "0 of 4" and per["vision"].split(" of ")[0] == per["vision"].split(" of ")[1]
    assert all(f".{tower}." in m for m in f.evidence["never_moved"]) and f.evidence["never_moved"]
    assert f.evidence["never_moved"][0] in f.fix  # the user's own modules
    assert "text-only batches" in f.fix and "grad.flow" in f.fix and "requires_grad" in f.fix


def test_a_quarter_of_the_modules_never_moved_warns_though_every_component_moved(family, tmp_path):
    base = family("qwen2_vl")
    adapter = trained_adapter(base, tmp_path / "half", ["q_proj", "k_proj", "v_proj", "o_proj"],
                              still=lambda n: ".layers.1." in n)
    f = finding(base, adapter)
    assert f.verdict == "warn" and "50% of the adapted modules never moved (4 of 8" in f.title, f
    assert f.evidence["never_moved_per_component"] == {"language": "4 of 8"}
    assert "layers.1." in f.fix


def test_the_healthy_twins_pass(family, tmp_path):
    base = family("llava")
    moved = trained_adapter(base, tmp_path / "moved", ["q_proj", "v_proj"])
    f = finding(base, moved)
    assert f.verdict == "pass" and "every one moved" in f.title
    # one vision module of eight never moved (LLaVA's last CLIP layer is unused under vision_feature_layer=-2):
    # its component still moved, and 12 % is below the quarter: a pass that names it
    last = "vision_tower.encoder.layers.1.self_attn.v_proj"
    few = trained_adapter(base, tmp_path / "few", ["q_proj", "v_proj"], still=lambda n: last in n)
    f = finding(base, few)
    assert f.verdict == "pass" and "1 never moved" in f.title and last in f.detail
    assert f.evidence["never_moved_per_component"] == {"vision": "1 of 4", "language": "0 of 4"}
