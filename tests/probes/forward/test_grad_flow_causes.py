"""grad.flow names why a trainable tensor gets no gradient: each cause planted on a tiny Llama (or LLaVA) where it
must be named, beside a healthy twin where it must stay quiet. The truth about a model and batch (not read,
selection only, computed without grad by the library, a loss that does not move with the tensor) is info; a
break (code that detaches, reentrant checkpointing of a tower whose input needs no grad, a backward that drops the
gradient) stays fail, with its site and fix."""

import pytest
import torch
from torch import nn

from workbench.model.setups import prepare_model
from workbench.model.target import resolve_target
from workbench.probes.forward.grad_flow import grad_flow_probe


def _llama(family):
    target = resolve_target(str(family("llama")))
    prepared = prepare_model(target)  # plain: a full fine-tune, every tensor trainable
    model = prepared.model
    return prepared, target, model.model.layers[0], model.config.hidden_size, model.dtype


def _finding(prepared, target):
    result = grad_flow_probe(prepared, target)
    return result, result.findings()[0]


class Detaching(nn.Module):
    """Custom code that detaches an MLP a healthy model trains."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x).detach()


class Routed(nn.Module):
    """An MLP scaled by a router's argmax choice; `weighted` also multiplies by the chosen probability."""

    def __init__(self, inner, hidden, dtype, weighted):
        super().__init__()
        self.inner, self.weighted = inner, weighted
        self.router = nn.Linear(hidden, 2, bias=False, dtype=dtype)

    def forward(self, x):
        logits = self.router(x)
        choice = logits.argmax(-1, keepdim=True)
        scale = torch.tensor([1.0, 0.5], dtype=x.dtype)[choice]
        out = self.inner(x) * scale
        return out * logits.softmax(-1).gather(-1, choice).to(x.dtype) if self.weighted else out


class DropGradient(torch.autograd.Function):
    """A custom op whose backward drops the gradient: the loss moves with its input, the gradient says not."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return torch.zeros_like(grad)


class Gated(nn.Module):
    """A side branch behind a zero-initialized gate (`broken`: behind a backward that drops its gradient)."""

    def __init__(self, inner, hidden, dtype, broken):
        super().__init__()
        self.inner, self.broken = inner, broken
        self.extra = nn.Linear(hidden, hidden, bias=False, dtype=dtype)
        self.gate = nn.Parameter(torch.zeros(hidden, dtype=dtype) if not broken else torch.ones(hidden, dtype=dtype))

    def forward(self, x):
        side = self.extra(x)
        return self.inner(x) + self.gate * (DropGradient.apply(side) if self.broken else side)


class SingleExpertGate(nn.Module):
    """A router whose gate is the softmax over the experts its mask leaves. The mask keeps only the top expert, so
    the gate is exactly 1 and the router's gradient exactly zero (as PhiMoE's sparsemixer when its jitter mask leaves
    one expert); which expert is picked (its scale) still moves the loss. Every token starts at the same small
    margin between the two experts, so a 1 % shift flips some picks and a 100x smaller one flips none. `broken`: the
    gate is the router's plain softmax probability behind a backward that drops its gradient."""

    def __init__(self, inner, hidden, broken):
        super().__init__()
        self.inner, self.broken = inner, broken
        row = torch.randn(hidden, generator=torch.Generator().manual_seed(0)) * 0.02
        self.weight = nn.Parameter(torch.stack([row, row]))  # fp32, read without autocast: the margin stays exact
        self.register_buffer("margin", torch.tensor([0.0, 3e-3]))

    def forward(self, x):
        logits = (x.float().unsqueeze(-2) * self.weight).sum(-1) + self.margin
        choice = logits.argmax(-1, keepdim=True)
        if self.broken:
            gate = DropGradient.apply(logits.softmax(-1)).gather(-1, choice)
        else:
            with torch.no_grad():
                keep = logits == logits.max(-1, keepdim=True).values
            gate = logits.masked_fill(~keep, float("-inf")).softmax(-1).gather(-1, choice)
        scale = torch.tensor([1.0, 0.5])[choice]
        return (self.inner(x).float() * scale * gate).to(x.dtype)


class PaddedLookup(nn.Module):
    """An MLP plus an embedding table with a padding_idx, looked up at `ids` (all padding, or also other rows)."""

    def __init__(self, inner, hidden, dtype, only_padding):
        super().__init__()
        self.inner, self.only_padding = inner, only_padding
        self.table = nn.Embedding(4, hidden, padding_idx=0, dtype=dtype)

    def forward(self, x):
        positions = torch.arange(x.shape[-2]).expand(x.shape[:-1])
        ids = torch.zeros_like(positions) if self.only_padding else positions % 4
        return self.inner(x) + self.table(ids)


def test_healthy_llama_full_fine_tune_passes(family):
    prepared, target, *_ = _llama(family)
    _, finding = _finding(prepared, target)
    assert finding.verdict == "pass", (finding.title, finding.detail)


def test_custom_code_that_detaches_a_trained_module_fails_with_its_site(family):
    prepared, target, layer, *_ = _llama(family)
    layer.mlp = Detaching(layer.mlp)
    result, finding = _finding(prepared, target)
    assert finding.verdict == "fail", (finding.title, finding.detail)
    assert {r.cause for r in result.rows if r.status != "ok"} == {"code_cut"}
    assert "test_grad_flow_causes.py" in finding.detail and "in forward" in finding.detail
    assert "model.layers.0.mlp.inner" in finding.title and "Remove the detach" in finding.fix


@pytest.mark.parametrize("weighted", [False, True])
def test_a_router_read_only_into_its_argmax_is_design_not_a_break(family, weighted):
    prepared, target, layer, hidden, dtype = _llama(family)
    layer.mlp = Routed(layer.mlp, hidden, dtype, weighted)
    result, finding = _finding(prepared, target)
    router = [r for r in result.rows if r.name == "model.layers.0.mlp.router.weight"]
    if weighted:  # the chosen probability multiplies the output: the router trains
        assert finding.verdict == "pass" and router[0].status == "ok", (finding.title, finding.detail)
        return
    assert finding.verdict == "info", (finding.title, finding.detail)
    assert router[0].status == "none" and router[0].cause == "selection_only"
    assert "only through integer or boolean values" in finding.detail and "mlp.router.weight" in finding.detail


def test_a_parameter_no_forward_reads_is_not_exercised(family):
    prepared, target, layer, hidden, dtype = _llama(family)
    layer.mlp.register_parameter("mask_embedding", nn.Parameter(torch.zeros(hidden, dtype=dtype)))
    result, finding = _finding(prepared, target)
    assert finding.verdict == "info", (finding.title, finding.detail)
    assert result.unused == ["model.layers.0.mlp.mask_embedding"]
    assert "1 belong to modules whose output never reaches the loss" in finding.detail


@pytest.mark.parametrize("broken", [False, True])
def test_a_zero_gradient_is_the_truth_only_when_the_loss_does_not_move(family, broken):
    prepared, target, layer, hidden, dtype = _llama(family)
    layer.mlp = Gated(layer.mlp, hidden, dtype, broken)
    before = {n: p.detach().clone() for n, p in prepared.model.named_parameters()}
    result, finding = _finding(prepared, target)
    extra = next(r for r in result.rows if r.name == "model.layers.0.mlp.extra.weight")
    assert extra.status == "zero"
    if broken:  # the loss moves with `extra`, yet its gradient is zero: the custom backward drops it
        assert finding.verdict == "fail" and extra.cause == "loss_moves", (finding.title, finding.detail)
        assert "custom autograd.Function" in finding.detail
    else:  # the zero-initialized gate multiplies the branch away: the first step's truth, the gate named
        assert finding.verdict == "info" and extra.cause == "loss_independent", (finding.title, finding.detail)
        assert result.zero_factors == ["model.layers.0.mlp.gate"]
        assert "model.layers.0.mlp.gate" in finding.detail and "loss does not move" in finding.detail
    after = dict(prepared.model.named_parameters())
    assert all(torch.equal(value, after[n].detach()) for n, value in before.items())  # shifts put back exactly


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_reentrant_checkpointing_of_a_tower_whose_input_needs_no_grad(family, use_reentrant):
    target = resolve_target(str(family("llava")))
    prepared = prepare_model(target)
    model = prepared.model
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": use_reentrant})
    model.enable_input_require_grads()
    vision = model.model.vision_tower
    for frozen in (vision.embeddings, vision.pre_layrnorm):  # frozen, as in a LoRA run: the blocks' input needs no grad
        frozen.requires_grad_(False)
    # transformers 5.23 hooks each sub-model's get_input_embeddings(); a tower without one (GLM-4V's) has no hook
    for module in vision.modules():
        for key, hook in list(module._forward_hooks.items()):
            if hook.__name__.startswith("make_inputs_require_grad"):
                del module._forward_hooks[key]
    result, finding = _finding(prepared, target)
    if not use_reentrant:
        assert finding.verdict in ("pass", "info"), (finding.title, finding.detail)
        return
    assert finding.verdict == "fail", (finding.title, finding.detail)
    cut = [r for r in result.rows if r.cause == "checkpoint_cut"]
    assert cut and all(r.name.startswith("model.vision_tower.") for r in cut)
    assert "`model.vision_tower.encoder`" in finding.detail and "trl#835" in finding.detail
    assert "'use_reentrant': False" in finding.fix and "model.get_submodule('model.vision_tower" in finding.fix


@pytest.mark.parametrize("broken", [False, True])
def test_a_loss_that_moves_only_across_a_discrete_choice_is_flat_between_choices(family, broken):
    prepared, target, layer, hidden, _ = _llama(family)
    layer.mlp = SingleExpertGate(layer.mlp, hidden, broken)
    result, finding = _finding(prepared, target)
    router = next(r for r in result.rows if r.name == "model.layers.0.mlp.weight")
    assert router.status == "zero"
    if broken:  # the plain softmax moves the loss without any pick flipping, yet its gradient is dropped
        assert finding.verdict == "fail" and router.cause == "loss_moves", (finding.title, finding.detail)
        assert "custom autograd.Function" in finding.detail
    else:  # the gate is exactly 1: only the pick moves the loss, and the argmax that flips is named
        assert finding.verdict == "info" and router.cause == "choice_only", (finding.title, finding.detail)
        assert "test_grad_flow_causes.py" in router.where and "in forward" in router.where
        assert "only across a discrete choice" in finding.detail and "mlp.weight" in finding.detail


@pytest.mark.parametrize("only_padding", [True, False])
def test_an_embedding_read_only_at_its_padding_row_is_named_not_a_break(family, only_padding):
    prepared, target, layer, hidden, dtype = _llama(family)
    layer.mlp = PaddedLookup(layer.mlp, hidden, dtype, only_padding)
    result, finding = _finding(prepared, target)
    table = next(r for r in result.rows if r.name == "model.layers.0.mlp.table.weight")
    if not only_padding:  # rows other than padding_idx are read: they train
        assert finding.verdict == "pass" and table.status == "ok", (finding.title, finding.detail)
        return
    assert finding.verdict == "info", (finding.title, finding.detail)
    assert table.status == "zero" and table.cause == "padding_row_only" and table.where == "padding_idx=0"
    assert "only at their padding_idx row" in finding.detail and "mlp.table.weight" in finding.detail


class WindowCompressor(nn.Module):
    """Compresses every `window` tokens into one entry, as DeepSeek-V4's HCA compressor does
    (transformers/models/deepseek_v4/modeling_deepseek_v4.py, DeepseekV4HCACompressor.forward): a batch shorter than
    the window slices its projection to zero tokens and returns `new_zeros` in its place."""

    def __init__(self, hidden, dtype, window):
        super().__init__()
        self.window = window
        self.kv_proj = nn.Linear(hidden, hidden, bias=False, dtype=dtype)

    def forward(self, x):
        kv = self.kv_proj(x)
        usable = (kv.shape[1] // self.window) * self.window
        chunk = kv[:, :usable]
        if chunk.shape[1] > 0:
            return chunk.view(kv.shape[0], usable // self.window, self.window, -1).mean(2)
        return chunk.new_zeros((kv.shape[0], 0, kv.shape[-1]))


class Compressed(nn.Module):
    """An MLP plus the sum of a compressor's entries."""

    def __init__(self, inner, hidden, dtype, window):
        super().__init__()
        self.inner = inner
        self.compressor = WindowCompressor(hidden, dtype, window)

    def forward(self, x):
        return self.inner(x) + self.compressor(x).sum(1, keepdim=True)


@pytest.mark.parametrize("window", [2, 100_000])
def test_a_compressor_whose_window_this_batch_never_fills_is_not_exercised(family, window):
    prepared, target, layer, hidden, dtype = _llama(family)
    layer.mlp = Compressed(layer.mlp, hidden, dtype, window)
    result, finding = _finding(prepared, target)
    proj = next(r for r in result.rows if r.name == "model.layers.0.mlp.compressor.kv_proj.weight")
    if window == 2:  # the batch fills windows: the compressor trains
        assert finding.verdict == "pass" and proj.status == "ok", (finding.title, finding.detail)
        return
    # read, but its projection is sliced to nothing and replaced by new_zeros: nothing of it reaches the loss
    assert finding.verdict == "info", (finding.title, finding.detail)
    assert proj.status == "none" and proj.cause == "not_read"
    assert result.unused == ["model.layers.0.mlp.compressor.kv_proj.weight"]


@pytest.mark.parametrize("detach", [False, True])
def test_a_detach_under_non_reentrant_checkpointing_is_the_codes_not_the_checkpoints(family, detach):
    prepared, target, layer, *_ = _llama(family)
    prepared.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if detach:
        layer.mlp = Detaching(layer.mlp)
    result, finding = _finding(prepared, target)
    if not detach:  # non-reentrant checkpointing records the graph: everything trains
        assert finding.verdict == "pass", (finding.title, finding.detail)
        return
    assert finding.verdict == "fail", (finding.title, finding.detail)
    assert {r.cause for r in result.rows if r.status != "ok"} == {"code_cut"}
    assert "reentrant" not in finding.detail and "Remove the detach" in finding.fix
    assert "test_grad_flow_causes.py" in finding.detail


@pytest.mark.parametrize("nan", [False, True])
def test_a_nan_loss_is_no_verdict_not_a_break(family, nan):
    """NaN != NaN: with a NaN loss every shifted tensor would read as 'the loss moves', 21 false breaks."""
    prepared, target, *_ = _llama(family)
    if nan:
        prepared.model.lm_head.register_forward_hook(lambda _m, _i, out: out * float("nan"))
    _, finding = _finding(prepared, target)
    assert finding.verdict == ("error" if nan else "pass"), (finding.title, finding.detail)
    assert ("no gradient verdict is possible" in finding.title + finding.detail) == nan


class LayerDrop(nn.Module):
    """A layerdrop in the way BART's, Whisper's and canary's encoders draw it: from the global random state."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        if self.training and torch.rand([]) < 0.5:
            return torch.zeros_like(x)
        return self.inner(x)


def test_a_layerdrop_draw_does_not_depend_on_what_ran_before(family):
    """Notebook 03's Trainer reseeds the global state: the draw (so the verdict) must not follow the order of probes,
    and the probe leaves the global state as it found it."""
    prepared, target, layer, *_ = _llama(family)
    layer.mlp = LayerDrop(layer.mlp)
    answers = set()
    for seed in range(6):
        torch.manual_seed(seed)
        state = torch.random.get_rng_state()
        result, finding = _finding(prepared, target)
        answers.add((finding.verdict, finding.title, tuple(sorted(r.name for r in result.rows if r.status != "ok"))))
        assert torch.equal(torch.random.get_rng_state(), state)
    assert len(answers) == 1, answers


def test_zero_gradients_too_large_to_shift_stay_unexplained_and_say_why(family, monkeypatch):
    """Asking whether the loss moves with a zero gradient's tensor keeps a copy of it to put back; where that copy
    would take more than half the free memory (a model whose gradients are almost all zero, at 7B) the question is
    not asked: the zero gradient stays a fail, saying why it was not explained, and no weight is touched."""
    import workbench.model.memory as memory

    prepared, target, layer, hidden, dtype = _llama(family)
    layer.mlp = Gated(layer.mlp, hidden, dtype, False)
    before = {n: p.detach().clone() for n, p in prepared.model.named_parameters()}
    monkeypatch.setattr(memory, "host_available_bytes", lambda: (1024, "MemAvailable of this machine"))
    result, finding = _finding(prepared, target)
    extra = next(r for r in result.rows if r.name == "model.layers.0.mlp.extra.weight")
    assert extra.status == "zero" and extra.cause is None and result.zero_factors == []
    assert finding.verdict == "fail", (finding.title, finding.detail)
    assert "was not asked: shifting 1 tensors keeps a copy of them to put back, which needs" in finding.detail
    assert "more than half the MemAvailable of this machine (0.0 GiB)" in finding.evidence[
        "zero_gradients_not_explained"]
    after = dict(prepared.model.named_parameters())
    assert all(torch.equal(value, after[n].detach()) for n, value in before.items())


@pytest.mark.parametrize("zeroed", [("down_proj",), ("o_proj", "down_proj"), ("up_proj", "down_proj")])
def test_all_zero_tensors_that_hold_each_other_at_zero_fail_where_one_that_moves_first_is_named(family, zeroed):
    """A weight left all zero holds back the gradients behind it until it moves (a zero `down_proj`, or LLaMA Pro's
    zero `o_proj` and `down_proj` in an added block, each getting a gradient of its own): info, naming it. Two all-zero
    factors of one product (`up_proj` and `down_proj`) each get an exactly zero gradient: neither moves the loss
    alone, so neither can move first, and the block never trains: a fail naming both."""
    prepared, target, layer, *_ = _llama(family)
    modules = {"down_proj": layer.mlp.down_proj, "up_proj": layer.mlp.up_proj, "o_proj": layer.self_attn.o_proj}
    with torch.no_grad():
        for name in zeroed:
            modules[name].weight.zero_()
    result, finding = _finding(prepared, target)
    names = {f"model.layers.0.{'self_attn' if n == 'o_proj' else 'mlp'}.{n}.weight" for n in zeroed}
    by_name = {r.name: r for r in result.rows}
    if zeroed != ("up_proj", "down_proj"):  # each zero tensor gets a gradient of its own: the first step moves it
        assert finding.verdict == "info", (finding.title, finding.detail)
        assert all(by_name[n].status == "ok" for n in names)
        assert set(result.zero_factors) == names
        return
    assert finding.verdict == "fail", (finding.title, finding.detail)
    assert {n for n, r in by_name.items() if r.cause == "mutual_zeros"} == names
    assert by_name["model.layers.0.mlp.gate_proj.weight"].status == "zero"
    assert "hold each other's gradient at zero" in finding.detail
    assert "2 more get an exactly zero gradient while they are zero" in finding.detail  # gate_proj and the norm
    assert all(n in finding.detail for n in names) and "initialize" in finding.fix.lower()
    assert any(f"model.get_parameter('{n}')" in finding.fix for n in names), finding.fix


@pytest.mark.parametrize("lora_a_zero", [False, True])
def test_a_fresh_lora_is_normal_and_one_whose_lora_a_is_zero_too_never_trains(family, lora_a_zero):
    """A fresh LoRA: lora_B starts at zero, so every lora_A gradient is exactly zero on the first step, and lora_B
    gets one (normal, info). With lora_A zero too (an adapter saved or initialized as zeros), lora_B's gradient is
    zero as well: neither moves first, and the adapter never trains (a fail naming them)."""
    import dataclasses

    from workbench.model.setups import add_fresh_lora

    prepared, target, *_ = _llama(family)
    prepared = dataclasses.replace(prepared, model=add_fresh_lora(prepared.model), setup="a fresh LoRA")
    lora_a = {n: p for n, p in prepared.model.named_parameters() if ".lora_A." in n}
    assert lora_a
    if lora_a_zero:
        with torch.no_grad():
            for p in lora_a.values():
                p.zero_()
    result, finding = _finding(prepared, target)
    causes = {r.cause for r in result.rows if r.status != "ok"}
    if not lora_a_zero:
        assert finding.verdict in ("pass", "info") and causes == {"lora_b_zero"}, (finding.title, finding.detail)
        assert all(r.status == "ok" for r in result.rows if r.role == "lora_B")
        return
    assert finding.verdict == "fail", (finding.title, finding.detail)
    assert {r.role for r in result.rows if r.cause == "mutual_zeros"} == {"lora_A", "lora_B"}
    assert "hold each other's gradient at zero" in finding.detail


class ZeroPairBehindDrop(nn.Module):
    """An MLP plus a side branch of two all-zero factors (`b(a(x))`) behind a backward that drops the gradient:
    shifted together they move the loss, yet no shift gives them a gradient."""

    def __init__(self, inner, hidden, dtype):
        super().__init__()
        self.inner = inner
        self.a = nn.Linear(hidden, hidden, bias=False, dtype=dtype)
        self.b = nn.Linear(hidden, hidden, bias=False, dtype=dtype)
        with torch.no_grad():
            self.a.weight.zero_()
            self.b.weight.zero_()

    def forward(self, x):
        return self.inner(x) + DropGradient.apply(self.b(self.a(x)))


@pytest.mark.parametrize("drop", [False, True])
def test_too_many_zero_gradients_to_shift_each_alone_are_told_apart_by_one_step_with_the_zeros_shifted(
        family, monkeypatch, drop):
    """Over MAX_SEPARATE_CHECKS zero gradients (a checkpoint whose MLPs were all zeroed: two per layer, each the
    other's gradient), each is not shifted alone: one training step runs with the all-zero ones shifted together.
    Two all-zero factors (`up_proj`, `down_proj`) both get a gradient there: held by each other's zeros, a fail
    naming them, with what they hold (`gate_proj`, the norm) named as behind them. The same pair behind a backward
    that drops the gradient gets none there: it stays a dropped gradient, and no weight is left moved."""
    import workbench.probes.forward.grad_flow as grad_flow

    monkeypatch.setattr(grad_flow, "MAX_SEPARATE_CHECKS", 1)  # the tiny Llama has a few zero gradients, not 17
    prepared, target, layer, hidden, dtype = _llama(family)
    if drop:
        layer.mlp = ZeroPairBehindDrop(layer.mlp, hidden, dtype)
        names = {"model.layers.0.mlp.a.weight", "model.layers.0.mlp.b.weight"}
    else:
        with torch.no_grad():
            layer.mlp.up_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        names = {"model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.down_proj.weight"}
    before = {n: p.detach().clone() for n, p in prepared.model.named_parameters()}
    result, finding = _finding(prepared, target)
    by_name = {r.name: r for r in result.rows}
    assert all(by_name[n].status == "zero" for n in names)
    assert finding.verdict == "fail", (finding.title, finding.detail)
    if drop:
        assert {by_name[n].cause for n in names} == {"loss_moves"}, [by_name[n] for n in names]
        assert "custom autograd.Function" in finding.detail
    else:
        assert {n for n, r in by_name.items() if r.cause == "mutual_zeros"} == names
        assert {n for n, r in by_name.items() if r.cause == "behind_zeros"} == {
            "model.layers.0.mlp.gate_proj.weight", "model.layers.0.post_attention_layernorm.weight"}
        assert "hold each other's gradient at zero" in finding.detail
        assert "a nonzero one in a training step run with them shifted together" in finding.detail
        assert "2 more get an exactly zero gradient while these are zero" in finding.detail
        assert any(f"model.get_parameter('{n}')" in finding.fix for n in names), finding.fix
    after = dict(prepared.model.named_parameters())
    assert all(torch.equal(value, after[n].detach()) for n, value in before.items())  # shifts put back exactly
