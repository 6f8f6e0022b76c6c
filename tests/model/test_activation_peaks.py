"""The activation peaks a forward records: what fp16 headroom is read from. Recording leaves the forward's result
alone, and a recording that cannot read a value marks the peaks incomplete instead of raising into the model."""

import torch
from torch import nn

from workbench.model import activation_peaks
from workbench.model.activation_peaks import recorded_peaks


def two_layers():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def test_module_outputs_and_fp16_products_are_recorded_per_innermost_module():
    model, x = two_layers(), torch.randn(3, 4)
    with torch.no_grad(), recorded_peaks(model) as peaks:
        out = model(x)
    hidden = model[0](x)
    assert torch.equal(out, model(x))
    assert peaks.complete and peaks.outputs["0"] == float(hidden.abs().max())
    assert peaks.outputs["2"] == float(out.abs().max())
    # a product's weight is among what autocast casts: the largest of its input, weight, bias and output
    assert peaks.products["0"] == [max(float(x.abs().max()), float(model[0].weight.abs().max()),
                                       float(model[0].bias.abs().max()), float(hidden.abs().max())), "linear"]
    assert "1" not in peaks.products  # ReLU runs no product
    with torch.no_grad():
        model(x)  # the hooks are gone
    assert len(peaks.outputs) == 3


def test_a_recording_that_fails_leaves_the_forward_alone_and_says_so(monkeypatch):
    model, x = two_layers(), torch.randn(3, 4)

    def unreadable(_tensor):
        raise RuntimeError("a tensor this reduction does not take")

    monkeypatch.setattr(activation_peaks, "largest_magnitude", unreadable)
    with torch.no_grad(), recorded_peaks(model) as peaks:
        out = model(x)
    assert torch.equal(out, model(x)) and not peaks.complete
