import pytest
from repo import ROOT

from workbench.errors import UsageError
from workbench.model.target import parse_max_memory, resolve_target
from workbench.params import load_params


def test_adapter_resolves_its_recorded_base(demo):
    target = resolve_target(str(demo.qwen_stage2))
    assert target.adapter_dir == demo.qwen_stage2
    assert target.model_dir == demo.qwen_stage1  # stage 2 was trained on stage 1, not on the base
    assert target.base_source == "adapter_config.json"


def test_base_override(demo):
    target = resolve_target(str(demo.qwen_stage2), base=str(demo.qwen_base))
    assert target.model_dir == demo.qwen_base and target.base_source == "--base"
    assert target.recorded_base == str(demo.qwen_stage1)


@pytest.mark.parametrize("make, message", [
    (lambda d, t: t / "nope", "does not exist"),
    (lambda d, t: t, "neither config.json nor adapter_config.json"),
    (lambda d, t: "someorg/some-model-7b", "hub id"),
])
def test_unusable_inputs_are_one_clear_line(demo, tmp_path, make, message):
    with pytest.raises(UsageError, match=message) as info:
        resolve_target(str(make(demo, tmp_path)))
    assert "\n" not in str(info.value)


def test_config_without_weights(tmp_path, demo):
    (tmp_path / "config.json").write_text((demo.llama / "config.json").read_text())
    with pytest.raises(UsageError, match="no weights"):
        resolve_target(str(tmp_path))


def test_adapter_whose_base_is_missing(demo, copy_of, edit_json):
    adapter = copy_of(demo.qwen_stage2)
    edit_json(adapter / "adapter_config.json", base_model_name_or_path="/nowhere/stage1")
    with pytest.raises(UsageError, match="adapter's base"):
        resolve_target(str(adapter))


def test_unknown_architecture(demo, copy_of, edit_json):
    folder = copy_of(demo.llama)
    edit_json(folder / "config.json", model_type="qwen99_omni")
    with pytest.raises(UsageError, match="unknown to transformers"):
        resolve_target(str(folder))


@pytest.mark.parametrize("gpus", [-1, "two", 1000])
def test_gpu_count_must_be_positive(demo, gpus):
    with pytest.raises(UsageError, match="--gpus"):
        resolve_target(str(demo.llama), gpus=gpus)


@pytest.mark.parametrize("gpus", [None, "", 0])
def test_gpus_not_given_is_not_stated_and_round_trips(demo, gpus):
    target = resolve_target(str(demo.llama), gpus=gpus)  # 0: the notebook contract's "not stated"
    assert target.gpus == 1 and not target.gpus_stated and target.as_contract()["gpus"] is None
    assert resolve_target(**target.options()) == target
    stated = resolve_target(str(demo.llama), gpus=1)
    assert stated.gpus_stated and stated.as_contract()["gpus"] == 1 and stated != target


def test_max_memory_format():
    assert parse_max_memory("0=20GiB,1=20GiB,cpu=64GiB") == {0: "20GiB", 1: "20GiB", "cpu": "64GiB"}
    with pytest.raises(UsageError, match="max-memory"):
        parse_max_memory("lots")


def test_parameter_files_are_validated(tmp_path):
    good = tmp_path / "p.yaml"
    good.write_text("components:\n  head: ['lm_head']\nreal_quant_max_bytes: 10\n")
    assert load_params(good)["components"] == {"head": ["lm_head"]}
    good.write_text("ddp_find_unused_parameters: false\nrecipes: parameters/recipes.yaml\n")
    assert load_params(good) == {"ddp_find_unused_parameters": False, "recipes": "parameters/recipes.yaml"}
    for text, message in [("colour: red\n", "unknown key 'colour'"), ("real_quant_max_bytes: big\n", "must be a int"),
                          ("components:\n  head: ['[']\n", "bad regex"),
                          ("eval_samples: true\n", "must be a int"),  # a bool is not a count
                          ("ddp_find_unused_parameters: 1\n", "must be a bool")]:
        good.write_text(text)
        with pytest.raises(UsageError, match=message):
            load_params(good)


def test_the_shipped_parameters_file_is_valid():

    params = load_params(ROOT / "parameters" / "defaults.yaml")
    from workbench.probes.dtype.probes import DEFAULT_REAL_QUANT_MAX_BYTES

    # the shipped file documents the code's default (the prediction is the answer; a real load verifies it when cheap)
    assert params["dataset_size"] == 272 and params["real_quant_max_bytes"] == DEFAULT_REAL_QUANT_MAX_BYTES
