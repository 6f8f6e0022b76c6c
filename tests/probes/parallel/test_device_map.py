import torch

from workbench.model.loading import auto_config, load_pretrained
from workbench.model.target import parse_max_memory
from workbench.probes.parallel.device_map import DeviceMapResult, loaded_device_map, predict_device_map


def test_balanced_on_two_gpus_spans_both(demo):
    prediction = predict_device_map(auto_config(demo.qwen_base), "balanced", 2, {0: "80GiB", 1: "80GiB"})
    assert prediction.gpus == [0, 1] and not prediction.offloaded and not prediction.collapsed
    finding = DeviceMapResult(loaded_device_map(load_pretrained(demo.qwen_base)), [prediction], 2,
                              {0: "80GiB", 1: "80GiB"}, assumed=True).findings()[0]
    assert finding.verdict == "pass" and "assumed 80GiB" in finding.title  # healthy: quiet, and says what it assumed


def test_sequential_keeps_a_small_model_on_one_gpu(demo):
    prediction = predict_device_map(auto_config(demo.qwen_base), "sequential", 2, {0: "80GiB", 1: "80GiB"})
    assert prediction.device_map == {"": 0} and prediction.collapsed
    finding = DeviceMapResult(loaded_device_map(load_pretrained(demo.qwen_base)), [prediction], 2,
                              {0: "80GiB"}, assumed=False).findings()[0]
    assert finding.verdict == "info" and "DataParallel" in finding.detail


def test_tiny_memory_offloads_and_warns(demo):
    budget = parse_max_memory("0=100KB,1=100KB,cpu=1GiB")
    prediction = predict_device_map(auto_config(demo.qwen_base), "auto", 2, budget)
    assert prediction.offloaded
    finding = DeviceMapResult(loaded_device_map(load_pretrained(demo.qwen_base)), [prediction], 2, budget,
                              False).findings()[0]
    assert finding.verdict == "warn"


def test_four_bit_refuses_cpu_entries(demo):
    prediction = predict_device_map(auto_config(demo.qwen_base), "auto", 2,
                                    parse_max_memory("0=200KB,1=200KB,cpu=1GiB"), quant="4bit")
    assert prediction.error and "CPU or the disk" in prediction.error


def tiny_udop_config():
    from transformers import UdopConfig

    return UdopConfig(vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_decoder_layers=1, num_heads=2,
                      relative_bias_args=[{"type": "1d"}], image_size=32, patch_size=16, num_channels=3,
                      architectures=["UdopForConditionalGeneration"])


def test_a_planner_that_raises_whatever_the_memory_is_named_as_the_librarys_crash():
    # UDOP ties `patch_embed` into the encoder after `shared` placed the encoder: transformers 5.23's
    # get_module_size_with_ties indexes an empty list (transformers #35824), with 80 GiB or unbounded memory alike
    budget = {0: "80GiB", "cpu": "64GiB"}
    prediction = predict_device_map(tiny_udop_config(), "auto", 1, budget)
    assert prediction.error.startswith("IndexError") and prediction.planner_crash
    assert prediction.planner_crash["raised_in"].endswith("(get_module_size_with_ties)")
    assert "#35824" in prediction.planner_crash["upstream"]
    finding = DeviceMapResult(loaded_device_map(torch.nn.Linear(2, 2)), [prediction], 1, budget,
                              assumed=True).findings()[0]
    assert finding.verdict == "warn" and "UdopForConditionalGeneration" in finding.title
    assert "whatever the memory" in finding.title and "80GiB" not in finding.title
    assert "device_map={\"\": 0}" in finding.fix and finding.evidence["planner_crash"]["model_class"]


def test_a_budget_that_is_too_small_is_not_a_planner_crash(demo):
    prediction = predict_device_map(auto_config(demo.qwen_base), "auto", 2,
                                    parse_max_memory("0=200KB,1=200KB,cpu=1GiB"), quant="4bit")
    assert prediction.error and prediction.planner_crash is None  # bitsandbytes refusing cpu entries: the budget's
