import pytest
import transformers

from workbench.model.loading import load_pretrained
from workbench.probes.parallel.release_rules import decide, release_line_for, verdicts_across_releases
from workbench.probes.parallel.trainer_wrap import observe_trainer


def line(version):
    return release_line_for(version)


def test_release_lines_resolve():
    assert line("4.26.1") is None
    assert line("4.29.2").since == "4.28"
    assert line("4.45.2").since == "4.30"
    assert line("5.5.0").since == "5.0"
    assert line("5.23.0").since == "5.6"
    assert line("5.6.0.dev0").since == "5.6"


def test_the_table_holds_the_facts_read_from_the_released_wheels():
    # 8-bit guard from 4.28
    assert decide(line("4.27"), n_gpu=2, is_loaded_in_8bit=True)["wraps_data_parallel"]
    assert not decide(line("4.28"), n_gpu=2, is_loaded_in_8bit=True)["wraps_data_parallel"]
    # multi-device maps count as model parallel from 4.28
    split = {"a": 0, "b": 1}
    assert decide(line("4.27"), n_gpu=2, hf_device_map=split)["wraps_data_parallel"]
    assert decide(line("4.28"), n_gpu=2, hf_device_map=split) == \
        {"release": "4.28", "is_model_parallel": True, "n_gpu": 1, "wraps_data_parallel": False}
    # from 4.30 a one-device map on cuda:1 escapes, cuda:0 does not
    assert decide(line("4.28"), n_gpu=2, hf_device_map={"": 1})["wraps_data_parallel"]
    assert not decide(line("4.30"), n_gpu=2, hf_device_map={"": 1})["wraps_data_parallel"]
    assert decide(line("4.30"), n_gpu=2, hf_device_map={"": 0})["wraps_data_parallel"]
    # 5.0 dropped is_parallelizable / model_parallel
    flags = dict(is_parallelizable=True, model_parallel=True)
    assert not decide(line("4.30"), n_gpu=2, **flags)["wraps_data_parallel"]
    assert decide(line("5.0"), n_gpu=2, **flags)["wraps_data_parallel"]
    # 5.6 guards 4-bit: a 2024 run (4.x, 4-bit, {'': 0}, 2 GPUs) was wrapped
    run_2024 = dict(n_gpu=2, hf_device_map={"": 0}, is_loaded_in_4bit=True)
    assert decide(line("4.46"), **run_2024)["wraps_data_parallel"]
    assert not decide(line("5.6"), **run_2024)["wraps_data_parallel"]
    assert all(row["source"] for row in verdicts_across_releases(**run_2024))


SCENARIOS = [
    ("no device map", None, "none"),
    ("one-device map on GPU 0", {"": 0}, "none"),
    ("one-device map on GPU 1", {"": 1}, "none"),
    ("map spanning two GPUs", {"model.visual": 0, "lm_head": 1}, "none"),
    ("4-bit", None, "4bit"),
    ("8-bit", None, "8bit"),
]


@pytest.mark.parametrize("name, device_map, quant", SCENARIOS, ids=[s[0] for s in SCENARIOS])
def test_installed_trainer_agrees_with_its_release_line(demo, name, device_map, quant):
    model = load_pretrained(demo.qwen_base, quant=quant)
    observed = observe_trainer(model, 2, device_map=device_map)
    table = decide(line(transformers.__version__), n_gpu=2, hf_device_map=device_map,
                   is_loaded_in_4bit=quant == "4bit", is_loaded_in_8bit=quant == "8bit")
    assert (observed.is_model_parallel, observed.n_gpu, observed.wraps_data_parallel) == \
        (table["is_model_parallel"], table["n_gpu"], table["wraps_data_parallel"])


def test_peft_wrapped_model_agrees_too(demo):
    from peft import PeftModel

    model = PeftModel.from_pretrained(load_pretrained(demo.qwen_stage1), str(demo.qwen_stage2))
    observed = observe_trainer(model, 2)
    assert observed.wraps_data_parallel
    assert decide(line(transformers.__version__), n_gpu=2)["wraps_data_parallel"]
