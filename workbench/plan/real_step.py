"""The real thing the plan predicts, measured: a real `transformers.Trainer` runs the same steps on the CPU, in a
process of its own (fresh, or forked from a kernel server: `host_heap.real_step_command`), on a model built from the
same config with random weights, and the resident memory it reaches above the loaded model is read from the kernel
(`ru_maxrss`, against VmRSS once the model is built). A forked process' `ru_maxrss` starts from its own resident size
at the fork, not from the server's peak (read in one: 373 MB, its server's 493 MB), so the rise is the step's either
way. Used by `make bench` and the tests to hold the planner to what a run does.

    python -m workbench.plan.real_step CONFIG_DIR ARGS_JSON [ADAPTER_CONFIG.json] --seq N [--scratch DIR]
    -> {"weights_bytes": …, "rss_before_bytes": …, "peak_rss_bytes": …, "above_weights_bytes": …, "seconds": …,
        "ran": {"batch", "seq", "steps", "packed", "gradient_checkpointing", "precision", "optimizer",
                "trainable_parameters"}}
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time


def _rss() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config_dir")
    parser.add_argument("training_args", help="JSON object of TrainingArguments fields")
    parser.add_argument("peft", nargs="?", help="an adapter_config.json: LoRA on the model")
    parser.add_argument("--seq", type=int, required=True)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--packed", action="store_true", help="no padded position (the plan's --packed)")
    parser.add_argument("--scratch", help="the folder the Trainer's output_dir is made in, and removed from "
                        "(default: the system's temporary folder)")
    args = parser.parse_args(argv)

    import gc

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, Trainer, TrainingArguments

    from workbench.runtime import quiet_and_offline

    quiet_and_offline()
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(args.config_dir)
    dtype = getattr(config, "dtype", None) or torch.float32
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype) if isinstance(dtype, str) else dtype)
    if args.peft:
        from peft import LoraConfig, get_peft_model

        fields = json.loads(open(args.peft).read())
        known = set(LoraConfig.__dataclass_fields__)
        model = get_peft_model(model, LoraConfig(**{k: v for k, v in fields.items() if k in known}))
    fields = json.loads(args.training_args)
    batch = int(fields.get("per_device_train_batch_size", 8))
    # each row's last position padded, as a padding collator leaves the shorter rows of a batch (the plan's default;
    # --packed: none)
    padded = 0 if args.packed else 1
    rows = [{"input_ids": [1 + (i + j) % 100 for j in range(args.seq)],
             "labels": [1 + (i + j) % 100 for j in range(args.seq - padded)] + [-100] * padded,
             "attention_mask": [1] * (args.seq - padded) + [0] * padded}
            for i in range(batch * args.steps * int(fields.get("gradient_accumulation_steps", 1)))]
    # the Trainer's output_dir (nothing is saved into it): removed with the step
    with tempfile.TemporaryDirectory(prefix="workbench-real-step-", dir=args.scratch) as out:
        training = TrainingArguments(output_dir=out, max_steps=args.steps, report_to=[], save_strategy="no",
                                     logging_strategy="no", use_cpu=True, dataloader_num_workers=0,
                                     disable_tqdm=True, **fields)
        trainer = Trainer(model=model, args=training, train_dataset=rows)
        gc.collect()
        before = _rss()
        start = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    weights = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    ran = {"batch": batch, "seq": args.seq, "steps": args.steps, "packed": args.packed,
           "gradient_checkpointing": bool(training.gradient_checkpointing),
           "precision": "bf16" if training.bf16 else "fp16" if training.fp16 else "no",
           "optimizer": type(getattr(trainer.optimizer, "optimizer", trainer.optimizer)).__name__,  # accelerate's wrap
           "trainable_parameters": trainable}
    print(json.dumps({"weights_bytes": weights, "rss_before_bytes": before, "peak_rss_bytes": peak,
                      "above_weights_bytes": peak - before, "seconds": seconds, "ran": ran}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
