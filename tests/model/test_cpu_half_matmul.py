"""The fp32 route for half-precision products on a CPU without native bf16/fp16 GEMM: same graph, same dtypes, same
errors, same gradient verdicts as the stack's own kernels — only faster."""

import math

import pytest
import torch

from workbench.model.cpu_half_matmul import fp32_half_matmul, slow_half_dtypes
from workbench.model.setups import prepare_model
from workbench.model.target import resolve_target
from workbench.probes.forward.grad_flow import grad_flow_probe, normalize_name


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_products_keep_their_dtype_and_equal_the_fp32_product_rounded(dtype):
    torch.manual_seed(0)
    a, b, c = torch.randn(16, 64, dtype=dtype), torch.randn(64, 32, dtype=dtype), torch.randn(32, dtype=dtype)
    batched_a, batched_b = torch.randn(2, 16, 64, dtype=dtype), torch.randn(2, 64, 32, dtype=dtype)
    with fp32_half_matmul((dtype,)) as mode:
        products = [a @ b, torch.addmm(c, a, b), torch.bmm(batched_a, batched_b), torch.nn.functional.linear(a, b.t(), c)]
    assert mode.promoted == 4
    assert all(p.dtype == dtype for p in products)
    assert torch.equal(products[0], (a.float() @ b.float()).to(dtype))
    assert torch.equal(products[2], torch.bmm(batched_a.float(), batched_b.float()).to(dtype))


def test_a_dtype_mismatch_raises_the_stacks_own_error():
    a, b = torch.randn(4, 8, dtype=torch.bfloat16), torch.randn(8, 4)
    with pytest.raises(RuntimeError) as outside:
        a @ b
    with fp32_half_matmul((torch.bfloat16,)) as mode, pytest.raises(RuntimeError) as inside:
        a @ b
    assert str(inside.value) == str(outside.value) and mode.promoted == 0


def test_nothing_is_routed_where_the_cpu_has_native_half_gemm():
    with fp32_half_matmul(()) as mode:
        torch.randn(4, 4, dtype=torch.bfloat16) @ torch.randn(4, 4, dtype=torch.bfloat16)
    assert mode is None


def stack_gradients(model, inputs) -> dict[str, float | None]:
    """One backward on the stack's own kernels: each trainable tensor's gradient norm (None: no gradient)."""
    from workbench.model.heads import loss_of

    model.train()
    model.zero_grad(set_to_none=True)
    loss_of(model(**inputs)).backward()
    norms = {normalize_name(n): (float(p.grad.float().norm()) if p.grad is not None else None)
             for n, p in model.named_parameters() if p.requires_grad}
    model.zero_grad(set_to_none=True)
    return norms


@pytest.mark.parametrize("name", ["llama", "qwen2_tied", "llava", "t5", "bert_seq_cls"])
def test_grad_flow_of_a_full_fine_tune_matches_the_stacks_backward(family, name):
    """A model straight from from_pretrained (every tensor trainable): the probe's statuses equal those of a backward
    on torch's own kernels and its norms agree to bf16 rounding. The evidence says what was promoted for the bf16
    families (Llama, tied Qwen2, the LLaVA VLM); for the fp32 ones (T5 encoder-decoder, a BERT classifier) nothing
    is promoted and the evidence stays quiet."""
    from workbench.model.forward import with_labels
    from workbench.model.inputs import sample_inputs

    target = resolve_target(str(family(name)))
    prepared = prepare_model(target)
    model = prepared.model
    half = next(model.parameters()).dtype == torch.bfloat16
    assert half == (name in ("llama", "qwen2_tied", "llava"))  # the dtypes families.py saves them in
    inputs = with_labels(model, sample_inputs(model, target.model_dir)[0])
    torch.manual_seed(0)  # the same dropout masks in both steps (T5 and BERT train with dropout)
    result = grad_flow_probe(prepared, target)
    torch.manual_seed(0)
    expected = stack_gradients(model, inputs)
    rows = {r.name: r for r in result.rows}
    assert set(rows) == set(expected)
    for tensor, norm in expected.items():
        status = "none" if norm is None else "ok" if norm > 0 else "zero"
        assert rows[tensor].status == status, tensor
        if norm:
            assert rows[tensor].norm == pytest.approx(norm, rel=0.05), tensor
    evidence = result.findings()[0].evidence
    if half and torch.bfloat16 in slow_half_dtypes():
        kernels = evidence["backward_kernels"]
        assert "bfloat16 matrix products" in kernels and "float16" not in kernels.replace("bfloat16", "")
        assert "computed in fp32" in kernels and "pytorch/pytorch#146508" in kernels
    else:
        assert "backward_kernels" not in evidence


def test_the_route_is_asked_only_for_the_slow_dtypes_a_model_multiplies_in(monkeypatch):
    import workbench.model.cpu_half_matmul as route

    monkeypatch.setattr(route, "slow_half_dtypes", lambda: (torch.bfloat16, torch.float16))  # an AVX2 CPU's answer
    fp32 = torch.nn.Linear(4, 4)
    assert route.slow_half_dtypes_of(fp32) == ()
    assert route.slow_half_dtypes_of(fp32, torch.bfloat16) == (torch.bfloat16,)  # autocast computes in it
    assert route.slow_half_dtypes_of(torch.nn.Linear(4, 4).half(), torch.float16) == (torch.float16,)
    quantized = torch.nn.Module()
    quantized.weight = torch.nn.Parameter(torch.zeros(4, dtype=torch.uint8), requires_grad=False)
    assert route.slow_half_dtypes_of(quantized) == (torch.bfloat16, torch.float16)  # dequantized into any of them
    monkeypatch.setattr(route, "slow_half_dtypes", lambda: ())  # a CPU with native half GEMMs
    assert route.slow_half_dtypes_of(quantized, torch.bfloat16) == ()


@pytest.mark.parametrize("dtype, scale", [(torch.bfloat16, 1.0), (torch.float16, 1.0), (torch.float16, 1e-7),
                                          (torch.float16, 1e4), (torch.bfloat16, 0.0)])
def test_a_gradient_norm_in_its_own_dtype_keeps_the_fp32_norms_verdict_and_value(dtype, scale):
    """Tiny fp16 gradients (a norm under fp16's smallest normal number) and large ones (a norm past 65504) are taken
    again in fp32; the others agree with the fp32 norm to the dtype's rounding."""
    from workbench.probes.forward.grad_flow import _gradient_norm

    torch.manual_seed(0)
    grad = (torch.randn(64, 64) * scale).to(dtype)
    expected = float(grad.float().norm())
    status, norm = _gradient_norm(grad)
    assert status == ("ok" if expected > 0 else "zero")
    assert norm == pytest.approx(expected, rel=2 ** -8)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_half_precision_gradient_of_zeros_is_zero_and_a_lone_tiny_element_is_not(dtype, monkeypatch):
    """A gradient of ±0 only is exactly zero without the fp32 copy; one subnormal element among them (the dtype's
    smallest step) takes the fp32 path, whose norm it gets (fp16's 6e-8: nonzero); a NaN is no zero either."""
    from workbench.probes.forward.grad_flow import _gradient_norm

    zeros = torch.zeros(32, 32, dtype=dtype)
    zeros[0, :4] = -0.0
    copies = []
    real_float = torch.Tensor.float
    monkeypatch.setattr(torch.Tensor, "float", lambda self, *a, **k: copies.append(self) or real_float(self, *a, **k))
    assert _gradient_norm(zeros) == ("zero", 0.0) and not copies
    assert _gradient_norm(torch.zeros(0, dtype=dtype)) == ("zero", 0.0)
    lone = zeros.clone()
    mantissa_bits = {torch.bfloat16: 7, torch.float16: 10}[dtype]
    lone[5, 5] = torch.finfo(dtype).smallest_normal * 2 ** -mantissa_bits  # the dtype's smallest subnormal
    expected = float(real_float(lone).norm())  # bf16's smallest subnormal squares to 0 even in fp32: a zero norm
    assert _gradient_norm(lone) == (("ok" if expected > 0 else "zero"), expected) and copies  # the fp32 path
    assert expected > 0 or dtype == torch.bfloat16
    nan = zeros.clone()
    nan[1, 1] = float("nan")
    assert math.isnan(_gradient_norm(nan)[1])
    sparse = torch.zeros(8, 4, dtype=dtype).to_sparse()  # an nn.Embedding(sparse=True)'s gradient: the fp32 path
    assert _gradient_norm(sparse) == ("zero", 0.0)
