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
