import math

import pytest
import torch

from workbench.model.finiteness import all_finite, largest_magnitude


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn])
def test_one_nan_or_infinity_anywhere_is_found_in_every_float_dtype(dtype):
    clean = torch.randn(3, 5, 7).to(dtype)
    assert all_finite(clean) and all_finite(torch.empty(0, dtype=dtype))
    # float8 e4m3fn has no infinity (torch saturates it to ±448): NaN only
    for bad in (float("nan"),) if dtype == torch.float8_e4m3fn else (float("nan"), float("inf"), float("-inf")):
        for where in ((0, 0, 0), (2, 4, 6), (1, 2, 3)):
            planted = clean.float().clone()
            planted[where] = bad
            planted = planted.to(dtype)
            assert not all_finite(planted), (dtype, bad, where)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn])
def test_the_largest_magnitude_is_abs_max_whichever_sign_holds_it(dtype):
    for sign in (1.0, -1.0):
        values = torch.randn(4, 9).to(dtype)
        values[2, 3] = sign * 40.0
        assert largest_magnitude(values) == float(values.float().abs().max()) == 40.0
    assert largest_magnitude(torch.empty(0, dtype=dtype)) == 0.0
    planted = torch.randn(4, 9)
    planted[1, 1] = float("nan")
    assert math.isnan(largest_magnitude(planted.to(dtype)))
