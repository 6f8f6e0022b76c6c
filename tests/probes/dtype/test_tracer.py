import threading

import pytest
import torch

from workbench.model.inputs import sample_inputs
from workbench.model.loading import load_pretrained
from workbench.model.tracer import DtypeTracer


def hook_count(model):
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


@pytest.fixture
def fp32_norm_model(demo):
    model = load_pretrained(demo.qwen_base)
    model.model.language_model.norm.float()  # norms fp32, lm_head bf16: the float != BFloat16 configuration
    inputs, _ = sample_inputs(model, demo.qwen_base)
    return model, inputs


def test_traces_through_the_failing_call_and_names_both_ends(fp32_norm_model):
    model, inputs = fp32_norm_model
    before = hook_count(model)
    with DtypeTracer(model) as tracer:
        with pytest.raises(RuntimeError, match="BFloat16"):
            model(**inputs)
    assert hook_count(model) == before  # hooks removed, even after the exception
    d = tracer.diagnosis()
    assert d["raised"] and d["module"] == "lm_head" and d["producer"] == "model.language_model.norm"
    assert d["input_dtype"] == "float32" and d["module_weight"] == "bfloat16"
    breaks = {row["module"]: row["break"] for row in tracer.flow()}
    assert breaks["lm_head"] == "◀ break" and breaks["model.language_model.norm"] == "◀ produced it"


def test_traces_inside_a_replica_thread_in_training_mode(fp32_norm_model):
    model, inputs = fp32_norm_model
    model.train()
    errors = []
    with torch.autocast("cpu", dtype=torch.bfloat16), DtypeTracer(model) as tracer:
        def replica():
            try:
                model(**inputs)
            except RuntimeError as exc:
                errors.append(exc)
        worker = threading.Thread(target=replica, name="replica-0")
        worker.start()
        worker.join()
    assert errors and tracer.diagnosis()["thread"] == "replica-0"


def test_healthy_forward_has_no_break(demo):
    model = load_pretrained(demo.qwen_base)
    inputs, _ = sample_inputs(model, demo.qwen_base)
    with DtypeTracer(model) as tracer:
        model(**inputs)
    assert tracer.failing_call() is None and tracer.diagnosis() is None
    assert len(tracer.calls) > 20
