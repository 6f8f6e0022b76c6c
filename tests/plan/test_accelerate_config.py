"""`workbench plan --accelerate-config FILE`: the launch read by accelerate's own launcher — its process count,
mixed precision, FSDP fields or DeepSpeed ZeRO stage — planned as the Trainer gets it under `accelerate launch`;
the same run stated in the training arguments plans the same; what the planner cannot plan is one line, exit 2."""

import os

import pytest

from tests.plan.test_plan import plan_here, tiny_qwen2

COMMON = """compute_environment: LOCAL_MACHINE
machine_rank: 0
num_machines: 1
num_processes: {processes}
mixed_precision: {precision}
use_cpu: false
"""


def accelerate_config(tmp_path, name, kind, processes=8, precision="bf16", extra=""):
    path = tmp_path / f"{name}.yaml"
    path.write_text(COMMON.format(processes=processes, precision=precision) + f"distributed_type: {kind}\n" + extra)
    return path


FSDP2 = """fsdp_config:
  fsdp_version: 2
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_reshard_after_forward: {reshard}
  fsdp_activation_checkpointing: {checkpointing}
  fsdp_offload_params: {offload}
  fsdp_cpu_ram_efficient_loading: true
  fsdp_state_dict_type: SHARDED_STATE_DICT
"""


def fsdp2(reshard="true", checkpointing="false", offload="false"):
    return FSDP2.format(reshard=reshard, checkpointing=checkpointing, offload=offload)


def fsdp1(strategy):
    return f"""fsdp_config:
  fsdp_version: 1
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_sharding_strategy: {strategy}
  fsdp_offload_params: false
  fsdp_sync_module_states: true
"""


def deepspeed(stage, offload="none"):
    return f"""deepspeed_config:
  zero_stage: {stage}
  offload_optimizer_device: {offload}
  offload_param_device: none
  zero3_init_flag: true
"""


def test_the_launch_gives_the_process_count_the_precision_and_the_sharding(tmp_path):
    from workbench.plan.setup import plan_setup

    folder = tiny_qwen2(tmp_path / "m")
    def launch_variables():
        return {k: v for k, v in os.environ.items() if k.startswith(("ACCELERATE_", "FSDP_"))}

    before = launch_variables()
    fsdp = plan_setup(str(folder), accelerate_config=str(accelerate_config(tmp_path, "fsdp", "FSDP", extra=fsdp2())))
    assert fsdp.gpus == 8 and fsdp.sharded and fsdp.precision == "bf16"
    assert "fsdp.yaml (distributed_type FSDP)" in fsdp.fsdp_source
    assert fsdp.as_dict()["bf16"] and fsdp.as_dict()["accelerate_config"].endswith("fsdp.yaml")
    assert launch_variables() == before  # read in a scoped environment, this process' own left as it was
    # --gpus wins over the file's num_processes, as accelerate launch's --num_processes does
    assert plan_setup(str(folder), gpus=2, accelerate_config=str(tmp_path / "fsdp.yaml")).gpus == 2

    ddp = plan_setup(str(folder), accelerate_config=str(accelerate_config(tmp_path, "ddp", "MULTI_GPU", 4, "fp16")))
    assert ddp.gpus == 4 and not ddp.sharded and ddp.fsdp is None and ddp.precision == "fp16"
    # the training arguments' own bf16 wins over the launch's mixed precision (TrainingArguments' rule)
    args = tmp_path / "args.yaml"
    args.write_text("bf16: true\n")
    assert plan_setup(str(folder), training_args=str(args), accelerate_config=str(tmp_path / "ddp.yaml")
                      ).precision == "bf16"

    zero3 = plan_setup(str(folder), accelerate_config=str(accelerate_config(tmp_path, "ds", "DEEPSPEED", 4,
                                                                            extra=deepspeed(3))))
    assert zero3.gpus == 4 and zero3.sharded and "ds.yaml (distributed_type DEEPSPEED): ZeRO-3" in zero3.fsdp_source


def test_fsdp1_strategies_are_planned_as_fully_shard_or_refused():
    from workbench.errors import UsageError
    from workbench.plan.fsdp import as_fsdp2

    assert as_fsdp2({}, {"FSDP_VERSION": "1", "FSDP_SHARDING_STRATEGY": "SHARD_GRAD_OP"}) == (
        {"fsdp_version": 2, "reshard_after_forward": False}, 1)
    assert as_fsdp2({"fsdp_version": 1, "reshard_after_forward": "full_shard"}, {}) == (
        {"fsdp_version": 2, "reshard_after_forward": True}, 1)
    assert as_fsdp2({}, {"FSDP_VERSION": "1", "FSDP_SHARDING_STRATEGY": "2"})[0]["reshard_after_forward"] is False
    assert as_fsdp2({"fsdp_version": 2, "reshard_after_forward": False}, {}) == (
        {"fsdp_version": 2, "reshard_after_forward": False}, 2)
    with pytest.raises(UsageError, match="HYBRID_SHARD: not planned"):
        as_fsdp2({}, {"FSDP_VERSION": "1", "FSDP_SHARDING_STRATEGY": "HYBRID_SHARD"})


def test_what_the_planner_cannot_plan_is_one_line_and_exit_2(tmp_path):
    folder = tiny_qwen2(tmp_path / "m")
    broken = tmp_path / "broken.yaml"
    broken.write_text("distributed_type: [not, a, type\n")
    for config, why in ((tmp_path / "missing.yaml", "no such file"),
                        (broken, "accelerate cannot read it"),
                        (accelerate_config(tmp_path, "z2", "DEEPSPEED", extra=deepspeed(2)), "ZeRO stage 2"),
                        (accelerate_config(tmp_path, "z3off", "DEEPSPEED", extra=deepspeed(3, "cpu")),
                         "offloading is not planned"),
                        (accelerate_config(tmp_path, "off", "FSDP", extra=fsdp2(offload="true")),
                         "fsdp_offload_params: offloading is not planned"),
                        (accelerate_config(tmp_path, "hybrid", "FSDP", extra=fsdp1("HYBRID_SHARD")),
                         "HYBRID_SHARD: not planned")):
        result = plan_here(folder, "--accelerate-config", config, "--seq", "32", "--batch", "2", "--device", "cpu")
        assert result.returncode == 2 and why in result.stderr, (config.name, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.slow  # fake FSDP steps (FSDP's first import alone is seconds): not in the fast tier
def test_the_run_stated_in_an_accelerate_config_plans_as_the_same_run_in_training_arguments(tmp_path):
    """Healthy: FSDP2 over 2 ranks in bf16 said by an accelerate config, and said by `fsdp: true` + `bf16: true` in
    the training arguments, plan the same rank; the config's own activation checkpointing (accelerate's
    fsdp2_apply_ac) holds fewer activations, and an FSDP1 SHARD_GRAD_OP config keeps the layers gathered after
    forward (more unsharded weights) where FULL_SHARD reshards them."""
    from workbench.plan.fsdp_step import sharded_step
    from workbench.plan.setup import plan_setup

    folder = tiny_qwen2(tmp_path / "m")
    args = tmp_path / "args.yaml"
    args.write_text("fsdp: true\nbf16: true\n")

    def step(**options):
        setup = plan_setup(str(folder), device="cpu", seq=64, batch=4, **options)
        assert setup.sharded and setup.gpus == 2
        return sharded_step(setup)

    def config(name, extra):
        return str(accelerate_config(tmp_path, name, "FSDP", processes=2, extra=extra))

    stated = step(training_args=str(args), gpus=2)
    launched = step(accelerate_config=config("fsdp", fsdp2()))
    assert launched.peak_bytes == stated.peak_bytes and launched.breakdown == stated.breakdown
    checkpointed = step(accelerate_config=config("ac", fsdp2(checkpointing="true")))
    assert checkpointed.breakdown["activations"] < launched.breakdown["activations"]
    full, grad_op = (step(accelerate_config=config(s.lower(), fsdp1(s))) for s in ("FULL_SHARD", "SHARD_GRAD_OP"))
    # the printed plan says where the launch came from
    from workbench.plan.planner import make_plan

    ddp = make_plan(plan_setup(str(folder), device="cpu", seq=64, batch=4, accelerate_config=str(
        accelerate_config(tmp_path, "ddp", "MULTI_GPU", processes=4))), explore=False)
    assert "4 GPUs (DDP); the launch (processes, mixed precision, sharding) read from the accelerate config" in str(ddp)
    assert "bf16 autocast" in str(ddp)
    assert full.breakdown == launched.breakdown
    assert any("fsdp_config version 1" in note for note in grad_op.notes)
    assert grad_op.peak_bytes > full.peak_bytes
