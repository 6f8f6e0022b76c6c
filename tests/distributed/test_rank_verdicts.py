"""What the parent makes of a rank's result file, without launching torchrun (the launches are in
test_distributed.py, in the slow tier)."""

import json

from workbench.distributed.launcher import RankLog
from workbench.distributed.probes import DistributedResult
from workbench.errors import NotApplicable


def result_of_ranks(folder, exc) -> DistributedResult:
    for rank in range(2):
        log = RankLog(folder, rank, 2)
        log.stage("set-up for DDP")
        log.fail(exc)
    results = {r: json.loads((folder / f"rank{r}.json").read_text()) for r in range(2)}
    return DistributedResult(ranks=2, backend="gloo", checks=("ddp", "fsdp"), results=results, launch={})


def test_a_set_up_that_does_not_apply_on_the_ranks_is_a_skip_not_a_crash(tmp_path):
    reason = "The sft set-up trains causal LMs: BertForSequenceClassification is not one"
    found = result_of_ranks(tmp_path, NotApplicable("SFTTrainer needs a causal LM head.", title=reason)).findings()
    assert [(f.id, f.verdict, f.title) for f in found] == [
        ("distributed.ddp", "skip", reason), ("distributed.fsdp", "skip", reason)]
    assert found[0].detail == "SFTTrainer needs a causal LM head."


def test_a_rank_that_raises_anything_else_is_still_an_error(tmp_path):
    found = result_of_ranks(tmp_path, RuntimeError("rank one cannot read its shard")).findings()
    assert {f.verdict for f in found} == {"error"}
    assert found[0].title.startswith("Rank 0 crashed during set-up for DDP: RuntimeError")
