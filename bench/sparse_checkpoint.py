"""A 7B-shaped sharded safetensors checkpoint made of sparse files: real headers with real offsets, data regions
left as holes. ~16 GB apparent, next to nothing on disk; the config is Qwen2-VL-7B's shape. Tensor names are the
model's module paths (transformers 5 layout), not the legacy layout save_pretrained writes; the census maps both.

    .venv/bin/python bench/sparse_checkpoint.py OUT_DIR [--rows-every N]

Every weight of the all-holes checkpoint reads 0: its activations and gradients are 0 too, so a diagnosis of it
fails grad.flow and spends its time explaining the zeros. `rows_every=N` writes what a model that trains needs
(`_write_real_values`): the input embeddings whole, every N-th output row of every other weight matrix random
(N(0, 0.02), as a fresh model draws them), every norm's weight 1. At N = 64, 1.4 GB of 16.6 GB are data: the
residual streams carry them through every layer, so every tensor gets a gradient (an all-zero vision tower gets
none: its zero layers block each other).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import torch

SHARD_BYTES = 4 * 1024**3


def qwen2vl_7b_config():
    from transformers import Qwen2VLConfig

    return Qwen2VLConfig(
        text_config=dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                         num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False),
        vision_config=dict(depth=32, embed_dim=1280, hidden_size=3584, num_heads=16),
        tie_word_embeddings=False, dtype="bfloat16", architectures=["Qwen2VLForConditionalGeneration"])


def write_sparse_checkpoint(out: Path, rows_every: int | None = None) -> Path:
    from workbench.model.loading import meta_model

    out.mkdir(parents=True, exist_ok=True)
    config = qwen2vl_7b_config()
    config.save_pretrained(out)
    skeleton, _ = meta_model(config, torch.bfloat16)
    tensors = [(name, tuple(t.shape)) for name, t in skeleton.state_dict().items()]
    # LayerNorm and RMSNorm scales by their module's class (the merger's `ln_q` is one too): 1 where values are real
    norms = {f"{path}.weight" for path, module in skeleton.named_modules() if "norm" in type(module).__name__.lower()}
    shards: list[list[tuple[str, tuple]]] = [[]]
    size = 0
    for name, shape in tensors:
        nbytes = math.prod(shape) * 2
        if size + nbytes > SHARD_BYTES and shards[-1]:
            shards.append([])
            size = 0
        shards[-1].append((name, shape))
        size += nbytes
    weight_map, total = {}, 0
    for i, shard in enumerate(shards, 1):
        filename = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        header, offset = {"__metadata__": {"format": "pt"}}, 0
        for name, shape in shard:
            nbytes = math.prod(shape) * 2
            header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
            weight_map[name] = filename
        raw = json.dumps(header).encode()
        raw += b" " * (-len(raw) % 8)
        with open(out / filename, "wb") as fh:
            fh.write(len(raw).to_bytes(8, "little") + raw)
            fh.truncate(8 + len(raw) + offset)  # the data region is a hole
            if rows_every:
                _write_real_values(fh.fileno(), 8 + len(raw), header, rows_every, norms)
        total += offset
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    return out


def _write_real_values(fd: int, data_start: int, header: dict, rows_every: int, norms: set[str]) -> None:
    """Into one shard's holes: the input embeddings whole, every `rows_every`-th output row of every other weight
    matrix or convolution N(0, 0.02), every norm's weight 1; biases stay 0. Deterministic (one seeded generator per
    tensor name)."""
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        shape, (begin, _end) = entry["shape"], entry["data_offsets"]
        at = data_start + begin
        if name in norms:
            os.pwrite(fd, torch.ones(shape, dtype=torch.bfloat16).view(torch.uint8).numpy().tobytes(), at)
            continue
        if len(shape) < 2:  # biases stay 0, as a fresh model has them
            continue
        generator = torch.Generator().manual_seed(sum(name.encode()))
        rows, width = shape[0], math.prod(shape[1:])  # a convolution's output channels are its rows
        every = 1 if name.endswith("embed_tokens.weight") else rows_every
        for first in range(0, rows, 4096 * every):  # in chunks: the embeddings alone are 1.1 GB
            picked = range(first, min(rows, first + 4096 * every), every)
            values = (torch.randn(len(picked), width, generator=generator) * 0.02).to(torch.bfloat16)
            raw = values.view(torch.uint8).numpy()
            if every == 1:
                os.pwrite(fd, raw.tobytes(), at + first * width * 2)
                continue
            for i, row in enumerate(picked):
                os.pwrite(fd, raw[i].tobytes(), at + row * width * 2)


def write_adapter(base: Path, out: Path, r: int = 8, targets: tuple[str, ...] = ("q_proj", "v_proj")) -> Path:
    """A LoRA adapter for the 7B-shaped base, as PEFT saves one (adapter_config.json + adapter_model.safetensors):
    rank `r` on the language model's `targets`, real values (lora_A random, lora_B small, as after training)."""
    from safetensors.torch import save_file

    from workbench.model.loading import meta_model

    out.mkdir(parents=True, exist_ok=True)
    skeleton, _ = meta_model(qwen2vl_7b_config(), torch.bfloat16)
    generator = torch.Generator().manual_seed(0)
    tensors = {}
    for name, module in skeleton.named_modules():
        if "language_model" in name and name.rsplit(".", 1)[-1] in targets:
            prefix = f"base_model.model.{name}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(r, module.in_features, generator=generator).to(
                torch.bfloat16) * 0.02
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(module.out_features, r, generator=generator).to(
                torch.bfloat16) * 0.001
    save_file(tensors, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    (out / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": str(base), "r": r,
        "lora_alpha": 2 * r, "lora_dropout": 0.0, "target_modules": list(targets), "bias": "none",
        "modules_to_save": None, "use_rslora": False, "use_dora": False}, indent=1))
    return out


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default="/tmp/workbench-sparse-7b")
    parser.add_argument("--rows-every", type=int, help="write the values a model that trains needs (module docstring)")
    args = parser.parse_args()
    folder = write_sparse_checkpoint(Path(args.out), args.rows_every)
    apparent = sum(p.stat().st_size for p in folder.iterdir())
    on_disk = sum(p.stat().st_blocks * 512 for p in folder.iterdir())
    print(f"{folder}: {apparent / 1e9:.1f} GB apparent, {on_disk / 1e6:.1f} MB on disk")
