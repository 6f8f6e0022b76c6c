"""One rank of `workbench explain --reproduce` for DDP symptoms, started under torchrun (gloo on the CPU):

    python -m torch.distributed.run --nproc_per_node 2 … -m workbench.explain.ddp_replay --spec SPEC --out DIR

SPEC names the twin (target arguments) and the trials: each a set of toggle values (`reentrant` checkpointing,
`find_unused_parameters`, `static_graph`). Every trial builds the twin afresh through the user's set-up, turns
gradient checkpointing on as the Trainer does, wraps it in DistributedDataParallel as asked and runs two
synchronised training steps (an error of the reducer shows on the first backward or the second step). Each rank
writes DIR/rank<N>.json after every trial (`launcher.RankLog`), so a rank that crashes still says what it found.
"""

from __future__ import annotations

import gc
import sys

from workbench.distributed.launcher import RankLog, rank_main


def run_trials(spec: dict, log: RankLog) -> None:
    import datetime as dt

    import torch
    import torch.distributed as dist

    from workbench.distributed.ddp import ddp_trial, enable_checkpointing
    from workbench.distributed.train_step import rank_inputs
    from workbench.model.setups import prepare_model
    from workbench.model.target import resolve_target
    from workbench.runtime import quiet_and_offline

    torch.set_num_threads(1)  # ranks share the machine's cores
    quiet_and_offline()
    dist.init_process_group("gloo", timeout=dt.timedelta(seconds=float(spec.get("timeout", 300))))
    target = resolve_target(**spec["target"])
    rank = dist.get_rank()
    results = []
    for values in spec["trials"]:
        log.stage(f"trial {values}")
        torch.manual_seed(0)
        model = prepare_model(target).model
        enable_checkpointing(model, reentrant=values["reentrant"])
        model.train()
        inputs, _how = rank_inputs(model, target, rank)
        trial = ddp_trial(model, inputs, None, "replay", "replay", find_unused_parameters=values["find_unused"],
                          static_graph=values["static_graph"])
        results.append({"values": values, "error": trial["error"]})
        log.section("trials", {"results": results})
        del model
        gc.collect()


def main(argv: list[str] | None = None) -> int:
    return rank_main(__doc__.splitlines()[0], run_trials, argv, default_timeout=300)


if __name__ == "__main__":
    sys.exit(main())
