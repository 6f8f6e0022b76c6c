"""The FSDP plan: one rank's step under accelerate's own FSDP2 preparation on a fake process group, tracked by torch's
FSDPMemTracker, held to a real 2-rank torchrun (gloo, CPU) running the same steps under the same tracker on real
tensors; the units are the ones accelerate makes, a set-up the planner cannot shard is one line."""

import json
import warnings

import pytest

from tests.plan.test_plan import lora_file, plan_here, tiny_qwen2


def fsdp_args(tmp_path, name="fsdp.yaml", extra=""):
    path = tmp_path / name
    path.write_text("fsdp: true\n" + extra)
    return path


def sharded(folder, args, gpus=2, **options):
    from workbench.plan.fsdp_step import sharded_step
    from workbench.plan.setup import plan_setup

    setup = plan_setup(str(folder), training_args=str(args), device="cpu", gpus=gpus, **options)
    assert setup.sharded
    return sharded_step(setup)


@pytest.mark.slow  # two fake FSDP steps each (FSDP's first import alone is seconds): not in the fast tier
def test_fsdp_shards_the_model_states_per_rank_and_keeps_the_activations_whole(tmp_path):
    """Healthy: over 4 ranks each holds a quarter of the weights and optimizer states it holds over 2 (the tiny
    model's dimensions divide evenly), the activations are the same on each. The plan leaves this process'
    environment as it found it (accelerate's FSDP plugin writes FSDP_CPU_RAM_EFFICIENT_LOADING into it)."""
    import os

    folder = tiny_qwen2(tmp_path / "m")
    before = {k: v for k, v in os.environ.items() if k.startswith(("FSDP_", "ACCELERATE_"))}
    two, four = (sharded(folder, fsdp_args(tmp_path), gpus=n, seq=64, batch=4) for n in (2, 4))
    assert {k: v for k, v in os.environ.items() if k.startswith(("FSDP_", "ACCELERATE_"))} == before
    assert two.breakdown["weights"] == 2 * four.breakdown["weights"] > 0
    # each state tensor's `step` counter is whole on every rank: a thousandth
    assert abs(two.breakdown["optimizer states"] - 2 * four.breakdown["optimizer states"]) <= 1e-3 * two.peak_bytes
    assert two.breakdown["activations"] == four.breakdown["activations"]
    assert four.peak_bytes < two.peak_bytes
    assert any("FSDPMemTracker" in n and "model.layers.0" in n for n in two.notes)


@pytest.mark.slow
def test_a_model_without_wrap_classes_gathers_it_whole(tmp_path):
    """Planted: with no decoder-layer class to wrap (`transformer_layer_cls_to_wrap` naming only the embedding's
    class), accelerate makes no per-layer unit and the layers are gathered with the root: more unsharded weights than
    the healthy units; a class the model lacks is accelerate's own refusal, in one line."""
    folder = tiny_qwen2(tmp_path / "m")
    healthy = sharded(folder, fsdp_args(tmp_path), seq=32, batch=2)
    coarse = sharded(folder, fsdp_args(tmp_path, "coarse.yaml", "fsdp_config:\n  transformer_layer_cls_to_wrap: "
                                                                 "[Embedding]\n"), seq=32, batch=2)
    assert coarse.breakdown["unsharded weights"] > healthy.breakdown["unsharded weights"]
    result = plan_here(folder, "--training-args", fsdp_args(tmp_path, "nope.yaml", "fsdp_config:\n  "
                                                       "transformer_layer_cls_to_wrap: [NoSuchLayer]\n"), "--gpus", "2")
    assert result.returncode == 2 and "NoSuchLayer" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_zero3_is_planned_as_fsdp_and_what_is_not_planned_is_one_line(tmp_path):
    from workbench.plan.setup import plan_setup

    folder = tiny_qwen2(tmp_path / "m")
    for stage in (3, 2):
        (tmp_path / f"ds{stage}.json").write_text(json.dumps({"zero_optimization": {"stage": stage}}))
        (tmp_path / f"ds{stage}.yaml").write_text(f"deepspeed: {tmp_path / f'ds{stage}.json'}\n")
    setup = plan_setup(str(folder), training_args=str(tmp_path / "ds3.yaml"), gpus=2)
    assert setup.sharded and "ZeRO-3, planned as FSDP2 full sharding" in setup.fsdp_source
    for args, why in (((tmp_path / "ds2.yaml"),), "ZeRO stage 2"), (
            (fsdp_args(tmp_path, "off.yaml", "fsdp_config:\n  cpu_offload: true\n"),), "offloading is not planned"):
        result = plan_here(folder, "--training-args", *args, "--gpus", "2")
        assert result.returncode == 2 and why in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert plan_here(folder, "--gpus", "0").returncode == 2


@pytest.mark.slow
def test_the_fake_fsdp_step_holds_what_a_real_torchrun_fsdp_step_holds(tmp_path):
    """One torchrun launch, 2 gloo ranks on the CPU, four set-ups measured in turn by the same tracker on real tensors
    (`workbench.plan.real_fsdp_step`), each step's own peak kept (`step_peaks`). The plan's peak is its second
    step's (the first holds no optimizer state yet). The real run takes three steps: its second and third are the
    same steady step measured twice, and it is held to the lower of them, because gloo's CPU collectives keep their
    buffers until gloo's own threads finish with them, so on a loaded host a step's peak can include a buffer that a
    quiet run frees a moment earlier: the timing adds, it never takes away. (A full suite run once failed the full
    fine-tune's second step on one rank this way; three launches side by side on the 2 cores, 6 ranks, never
    repeated it.) With PEFT and gradient checkpointing each step is 128 KiB above the one before in the real run and
    in the plan alike: torch's tracker keeps the step's input-embedding output, made a leaf by
    `enable_input_require_grads`, and its gradient (the same run without a tracker holds its resident memory flat
    over 600 steps); the lower there is the second step.
    Where activations dominate (full, LoRA, LoRA + checkpointing) the plan equals that real step's peak category by
    category, within 1 % of it: the same code and tracker on the same shapes, so 1 % is room for nothing but a shape
    detail. Where the model states dominate (a 16k vocabulary, 1 × 8) the peak falls in backward at a moment that
    differs between the fake collectives (which complete at once) and gloo's (whose reduce-scatter on the CPU stages
    more temporaries): measured −7.3 % on every rank of every launch on a quiet machine (9 of 9), and once −13.6 % on
    one rank in a full suite run (the real peak 2.1 MB higher: gloo's staging outlived by another moment of
    backward), held within 15 %. The weights and the optimizer states the steps leave, which depend on no moment,
    are equal. The first step is held within 10 % (15 % for the model states, measured −10 %): on CI one rank's LoRA
    first step once peaked above its second (its peak then held no optimizer state: at least the states' 77,936
    bytes, 1.6 %, above the plan's first step), which about 90 measurements here (12 launches, loaded or not) never
    showed, equal to the plan each time. Where an activation-dominated first step is more than 1 % away, the test
    warns with every step's breakdown (CI prints the warnings), so that a recurrence says where its bytes were."""
    from workbench.distributed.launcher import launch_ranks

    folder, wide = tiny_qwen2(tmp_path / "m"), tiny_qwen2(tmp_path / "wide", vocab=16000)
    adapter = str(lora_file(tmp_path))
    plain, checkpointed = fsdp_args(tmp_path), fsdp_args(tmp_path, "gc.yaml", "gradient_checkpointing: true\n")
    cases = [{"name": "full", "checkpoint": str(folder), "training_args": str(plain), "peft": None},
             {"name": "lora", "checkpoint": str(folder), "training_args": str(plain), "peft": adapter},
             {"name": "lora_checkpointing", "checkpoint": str(folder), "training_args": str(checkpointed),
              "peft": adapter},
             {"name": "states", "checkpoint": str(wide), "training_args": str(plain), "peft": None, "seq": 8,
              "batch": 1}]
    cases = [{"seq": 64, "batch": 4, **case} for case in cases]
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"cases": cases, "timeout": 500}))
    run = launch_ranks("workbench.plan.real_fsdp_step", ["--spec", str(spec), "--out", str(tmp_path / "out")],
                       ranks=2, timeout=500, out_dir=tmp_path / "out")
    assert run.ok and sorted(run.results) == [0, 1], run.output_tail[-3000:]
    for case in cases:
        planned = sharded(case["checkpoint"], case["training_args"], peft=case["peft"], seq=case["seq"],
                          batch=case["batch"])
        assert planned.phase == "backward (step 2)", (case["name"], planned.phase)
        for rank, result in run.results.items():
            real = result["sections"][case["name"]]
            first, *steady = real["step_peaks"]
            second = min(steady, key=lambda step: step["total"])
            where = (case["name"], rank, real["phases"], real["step_peaks"], planned.breakdown)
            assert real["breakdown"]["weights"] == planned.breakdown["weights"], where
            assert real["after_steps"]["optimizer states"] == planned.breakdown["optimizer states"] > 0, where
            if case["name"] == "states":
                assert abs(planned.peak_bytes - second["total"]) <= 0.15 * second["total"], where
            else:
                assert all(abs(second[k] - v) <= 0.01 * second["total"] for k, v in planned.breakdown.items()), where
            first_tolerance = 0.15 if case["name"] == "states" else 0.10
            assert abs(planned.first_step_peak_bytes - first["total"]) <= first_tolerance * first["total"], where
            if case["name"] != "states" and abs(planned.first_step_peak_bytes - first["total"]) > 0.01 * first["total"]:
                warnings.warn(f"a real first step away from the plan's by more than 1 %: {where}", stacklevel=1)
