"""train.fp16's fp32 forward casts one module at a time: the same reading as casting the whole model, the weights put
back as they were, and the whole-model cast for a forward that reads a weight outside its module's own forward."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from workbench.probes.train import fp16
from workbench.probes.train.fp16_headroom import read_headroom


def tiny_bf16_llama(tied: bool):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied)
    return LlamaForCausalLM(config).to(torch.bfloat16).eval()


def fingerprint(model):
    return {n: (t.dtype, t.data_ptr()) for n, t in [*model.named_parameters(), *model.named_buffers()]}


def test_one_module_at_a_time_reads_what_the_whole_model_cast_reads_and_puts_every_weight_back():
    inputs = {"input_ids": torch.arange(12).reshape(1, 12)}
    for tied in (False, True):
        model = tiny_bf16_llama(tied)
        before = fingerprint(model)
        per_module = fp16._fp32_forward(model, inputs, {"LlamaDecoderLayer"})
        assert fingerprint(model) == before  # the same tensors, bf16 again
        with fp16._cast_whole_model(model):
            whole = read_headroom(model, inputs, {"LlamaDecoderLayer"})
        assert (per_module.amp, per_module.half, per_module.residual) == (whole.amp, whole.half, whole.residual)


class ReadsItsChildsWeight(torch.nn.Module):
    """A forward that multiplies by a child's weight without calling the child (as some heads read embeddings)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8).to(torch.bfloat16)
        self.head = torch.nn.Linear(8, 8, bias=False).to(torch.bfloat16)

    def forward(self, x):
        return (self.proj(x) @ self.head.weight.T,)


def test_a_weight_read_outside_its_modules_forward_gets_the_whole_model_cast():
    model = ReadsItsChildsWeight()
    before = fingerprint(model)
    reading = fp16._fp32_forward(model, {"x": torch.ones(2, 8)}, set())
    assert reading.half and fingerprint(model) == before


def test_a_whole_model_cast_that_would_not_fit_is_refused_with_both_numbers(monkeypatch):
    """fp32 copies of every weight beside the originals: where they would take more than half the free memory (a
    7B's whole-model cast is 33 GB), the forward is refused as a ResourceError naming both numbers — the probe's
    `error` — and no weight is touched."""
    import pytest

    import workbench.model.memory as memory

    model = ReadsItsChildsWeight()
    before = fingerprint(model)
    need = sum(t.numel() * 4 for t in [*model.parameters(), *model.buffers()])
    monkeypatch.setattr(memory, "host_available_bytes", lambda: (2 * need - 2, "MemAvailable of this machine"))
    with pytest.raises(memory.ResourceError, match=r"an fp32 copy of 3 weights and buffers, which needs 0\.0 GiB: "
                                                   r"more than half the MemAvailable of this machine"):
        fp16._fp32_forward(model, {"x": torch.ones(2, 8)}, set())
    assert fingerprint(model) == before
    monkeypatch.setattr(memory, "host_available_bytes", lambda: (2 * need, "MemAvailable of this machine"))
    assert fp16._fp32_forward(model, {"x": torch.ones(2, 8)}, set()).half  # exactly half fits
    # each copy is held against the memory of the device it lands on: none to read for meta tensors
    memory.room_for_a_copy([torch.empty(2**30, device="meta")], "a meta copy")
