"""One rank of `workbench explain --reproduce` for DDP symptoms, started under torchrun (gloo on the CPU):

    python -m torch.distributed.run --nproc_per_node 2 … -m workbench.explain.ddp_replay --spec SPEC --out DIR

SPEC names the twin (target arguments) and the trials: each a set of toggle values (`reentrant` checkpointing,
`find_unused_parameters`, `static_graph`). Every trial builds the twin afresh through the user's set-up, turns
gradient checkpointing on as the Trainer does, wraps it in DistributedDataParallel as asked and runs two
synchronised training steps (an error of the reducer shows on the first backward or the second step). Each rank
writes DIR/rank<N>.json after every trial (`launcher.RankLog`), so a rank that crashes still says what it found.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import traceback
from pathlib import Path

from workbench.distributed.launcher import RankLog, start_watchdog


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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True, help="JSON: target arguments, trials, timeout")
    parser.add_argument("--out", required=True, help="folder for rank<N>.json")
    args = parser.parse_args(argv)
    log = RankLog(Path(args.out), int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)))
    code = 0
    try:
        spec = json.loads(Path(args.spec).read_text())
        start_watchdog(spec.get("launcher_pid"), float(spec.get("timeout", 300)) + 30)
        run_trials(spec, log)
        log.stage("done")
    except Exception as exc:  # noqa: BLE001 - written with its traceback for the parent to report
        log.fail(exc)
        traceback.print_exc()
        code = 1
    finally:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and code == 0:
            dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main())
