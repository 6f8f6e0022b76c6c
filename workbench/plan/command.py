"""`workbench plan CKPT`: the training step's memory on fake tensors, against a GPU or a budget; `--json`.

Exit codes: 0 it fits (or no budget was given), 1 it does not fit, 2 bad input (one line)."""

from __future__ import annotations

import json


def plan_command(args) -> int:
    from workbench.plan.planner import gpu_bytes, make_plan, parse_bytes
    from workbench.plan.setup import plan_setup

    if args.gpu and args.memory:
        from workbench.errors import UsageError

        raise UsageError("--gpu and --memory: give one (the GPU's memory, or the budget in bytes)")
    budget = gpu_bytes(args.gpu) if args.gpu else parse_bytes(args.memory) if args.memory else None
    setup = plan_setup(args.checkpoint, training_args=args.training_args, peft=args.peft, setup=args.setup,
                       seq=args.seq, batch=args.batch, device=args.device, dtype=args.dtype, base=args.base,
                       packed=True if args.packed else None, gpus=args.gpus,
                       accelerate_config=args.accelerate_config)
    plan = make_plan(setup, budget_bytes=budget, budget_name=args.gpu or args.memory, explore=not args.quick,
                     measure_heap=not args.no_heap_measure)
    if args.json:
        print(json.dumps(plan.as_dict(), indent=2, default=str))
    else:
        print(str(plan))
    return 1 if plan.fits is False else 0
