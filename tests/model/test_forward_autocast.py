import warnings

import pytest
import torch

from workbench.model.forward import run_forward


class Doubler(torch.nn.Module):
    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4).to(dtype)

    def forward(self, x):
        return (self.linear(x),)


@pytest.mark.parametrize("context", ["autocast", "replica thread started under autocast"])
def test_an_fp32_model_runs_its_autocast_cells_without_torchs_warning(context):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out, exc = run_forward(Doubler(torch.float32), {"x": torch.ones(2, 4)}, context, torch.float32)
    assert exc is None and out[0].dtype == torch.float32
    assert not [w for w in caught if "Autocast" in str(w.message)], [str(w.message) for w in caught]


def test_a_bf16_compute_dtype_still_runs_under_autocast():
    out, exc = run_forward(Doubler(torch.float32), {"x": torch.ones(2, 4)}, "autocast", torch.bfloat16)
    assert exc is None and out[0].dtype == torch.bfloat16  # the fp32 Linear ran in bf16: autocast was on
