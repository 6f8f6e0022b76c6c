"""One rank of a 2-rank torchrun (gloo, CPU): the tiny checkpoint trained by the real Trainer with WorkbenchCallback.

    python -m torch.distributed.run --nproc_per_node 2 -m ddp_run CHECKPOINT OUTPUT_DIR RESULTS healthy|masked|reentrant

Each rank writes RESULTS/rank<N>.json: how training ended, its losses, the report folder its callback wrote (None on
every rank but process zero).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(checkpoint: str, output_dir: str, results: str, planted: str) -> None:
    import torch.distributed as dist
    from tiny_runs import losses, trainer_for

    from workbench.integrations import WorkbenchCallback, WorkbenchStop
    from workbench.runtime import quiet_and_offline

    quiet_and_offline()
    rank = int(os.environ["RANK"])
    callback = WorkbenchCallback(raise_on="fail")
    trainer = trainer_for(Path(checkpoint), Path(output_dir), [callback], masked=planted == "masked",
                          reentrant=planted == "reentrant", ddp_backend="gloo")
    outcome = "trained"
    try:
        trainer.train()
    except WorkbenchStop as exc:
        outcome = f"stopped: {exc}"
    written = Path(results, f".rank{rank}.json.partial")  # written, then renamed: the launcher never reads half
    written.write_text(json.dumps({
        "rank": rank, "outcome": outcome, "losses": losses(trainer), "step": trainer.state.global_step,
        "world": dist.get_world_size() if dist.is_initialized() else 1,
        "report": str(callback.report_folder) if callback.report_folder else None}))
    written.rename(Path(results, f"rank{rank}.json"))
    del trainer, callback  # the DDP module and its reducer go before the process group they use
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:5])
