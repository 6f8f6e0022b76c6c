"""Half-precision matrix products on a CPU that has no native bf16 / fp16 GEMM, computed in fp32.

On an x86 CPU without AVX-512 (bf16) or AMX-FP16 (fp16), torch's CPU GEMM for bf16 and fp16 falls back to a
scalar loop for the operand layout a Linear's backward uses (grad_output @ weight): 1.3 s for one
16×5632 @ 5632×2048 product on this project's 2-core AVX2 machine, against 0.03 s in fp32 (pytorch/pytorch#146508;
pytorch/pytorch#181367 fixes fp16 inside torch the same way: promote to fp32 SGEMM, round back). One training step
of a 0.67 B-parameter bf16 Llama then spends 60 s backpropagating instead of 4.

`fp32_half_matmul()` routes those products (mm, addmm, bmm, baddbmm on CPU tensors of one half dtype) through fp32
and rounds the result back to that dtype, below autograd: the graph, the dtypes every op sees and returns, and the
errors a mismatch raises (mixed dtypes are passed through untouched) are the stack's own. Only the accumulation
differs, in fp32 — what torch's fast kernels do as well. The probes that backpropagate (`grad.flow`) use it; a
forward is left on the stack's kernels.
"""

from __future__ import annotations

import contextlib
import functools

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_aten = torch.ops.aten
PRODUCTS = (_aten.mm.default, _aten.addmm.default, _aten.bmm.default, _aten.baddbmm.default)


@functools.cache
def slow_half_dtypes() -> tuple[torch.dtype, ...]:
    """The half dtypes whose CPU GEMM is a scalar fallback on this machine: bf16 without AVX-512 (oneDNN's bf16
    GEMM needs it), fp16 without AMX-FP16."""
    slow = []
    if not torch.cpu._is_avx512_supported():
        slow.append(torch.bfloat16)
    if not torch.cpu._is_amx_fp16_supported():
        slow.append(torch.float16)
    return tuple(slow)


class _PromoteHalfProducts(TorchDispatchMode):
    def __init__(self, dtypes: tuple[torch.dtype, ...]):
        super().__init__()
        self.dtypes = dtypes
        self.promoted = 0  # products computed in fp32
        self.promoted_dtypes: set[torch.dtype] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in PRODUCTS:
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            dtype = tensors[0].dtype
            if dtype in self.dtypes and all(t.dtype == dtype and t.device.type == "cpu" for t in tensors):
                self.promoted += 1
                self.promoted_dtypes.add(dtype)
                wide = [a.float() if isinstance(a, torch.Tensor) else a for a in args]
                return func(*wide, **kwargs).to(dtype)
        return func(*args, **kwargs)


def slow_half_dtypes_of(model: torch.nn.Module, compute_dtype: torch.dtype | None = None) -> tuple[torch.dtype, ...]:
    """The slow half dtypes (`slow_half_dtypes`) a step of `model` can multiply in: those of its parameters and
    buffers, and `compute_dtype`, the dtype autocast computes in; every slow one where a weight is stored quantized
    (integer storage: bitsandbytes dequantizes it into a dtype no tensor shows). () where none is slow here: the
    mode's Python dispatch of every op of a backward is then left out (0.15-0.3 s per backward of a 2.6 GB bf16
    Llama)."""
    present = {t.dtype for t in (*model.parameters(), *model.buffers())}
    if any(not d.is_floating_point for d in present):
        return slow_half_dtypes()
    return tuple(d for d in slow_half_dtypes() if d in present | {compute_dtype})


@contextlib.contextmanager
def fp32_half_matmul(dtypes: tuple[torch.dtype, ...] | None = None):
    """Within the block, CPU half-precision products of `dtypes` (default: the slow ones here) run in fp32. Yields
    the mode (`.promoted` counts them), or None when nothing on this machine needs it."""
    dtypes = slow_half_dtypes() if dtypes is None else dtypes
    if not dtypes:
        yield None
        return
    mode = _PromoteHalfProducts(dtypes)
    with mode:
        yield mode


def describe(mode) -> str | None:
    """For a finding's evidence: what was promoted, and why."""
    if mode is None or not mode.promoted:
        return None
    names = "/".join(sorted(str(d).removeprefix("torch.") for d in mode.promoted_dtypes))
    return (f"{mode.promoted} {names} matrix products of the backward computed in fp32 and rounded back: this CPU has "
            f"no native {names} GEMM (torch {torch.__version__.split('+')[0]}, pytorch/pytorch#146508)")
