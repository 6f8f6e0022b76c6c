import torch

from workbench.model.inputs import sample_inputs
from workbench.model.loading import load_pretrained
from workbench.model.setups import prepare_model
from workbench.model.target import resolve_target
from workbench.probes.parallel.probes import trainer_wrap_probe
from workbench.probes.parallel.replica import replica_forward_check
from workbench.probes.parallel.trainer_wrap import observe_trainer


def test_two_gpus_halve_the_steps_the_dataparallel_signature(demo):
    model = load_pretrained(demo.qwen_base)
    one = observe_trainer(model, 1)
    two = observe_trainer(model, 2)
    assert not one.wraps_data_parallel and one.steps_per_epoch == 136 and one.train_batch_size == 2
    assert two.wraps_data_parallel and two.steps_per_epoch == 68 and two.train_batch_size == 4
    assert any("args._n_gpu = 2" in s for s in two.simulated)


def test_quantized_model_refused_then_observed(demo):
    model = load_pretrained(demo.qwen_base, quant="4bit")
    observation = observe_trainer(model, 2)
    assert "refuses" in observation.note
    assert not observation.wraps_data_parallel and observation.train_batch_size == 4  # batch still doubled
    assert not getattr(model, "_hf_peft_config_loaded", False)  # the flag was restored


def test_replica_thread_runs_without_the_callers_autocast(demo):
    prepared = prepare_model(resolve_target(str(demo.qwen_stage2), quant="4bit", setup="qlora_trl_legacy"))
    inputs, how = sample_inputs(prepared.model, demo.qwen_stage1)
    assert "image + text" in how and "pixel_values" in inputs
    main, replica, bare = replica_forward_check(prepared.model, inputs, torch.bfloat16)
    assert main.ok and main.autocast_active and main.same_as is None  # run: the contrast to the failing replica
    assert not replica.autocast_active and not replica.ok and "BFloat16" in replica.error
    assert not bare.ok and bare.error == replica.error and bare.same_as.startswith("the replica thread's forward")


def test_the_main_threads_forward_without_autocast_runs_where_a_new_thread_would_keep_autocast(demo, monkeypatch):
    """The replica's forward stands for the main thread's without autocast only where torch says a new thread runs
    without it: told otherwise, that forward runs too. Where the replica's forward runs, the main thread's under
    autocast is not run (no verdict reads it; notebook 04's matrix runs it), and its row says so."""
    import workbench.probes.parallel.replica as replica_module

    prepared = prepare_model(resolve_target(str(demo.qwen_base)))
    inputs, _ = sample_inputs(prepared.model, demo.qwen_base)
    forwards = []
    prepared.model.register_forward_pre_hook(lambda module, args: forwards.append(1))
    main, replica, bare = replica_forward_check(prepared.model, inputs, torch.bfloat16)
    assert replica.ok and replica.same_as is None and bare.same_as.startswith("the replica thread's forward")
    assert main.ok is None and main.same_as == replica_module.MAIN_THREAD_NOT_RUN and len(forwards) == 1
    monkeypatch.setattr(replica_module, "autocast_reaches_a_new_thread", lambda device_type, dtype: True)
    forwards.clear()
    main, replica, bare = replica_forward_check(prepared.model, inputs, torch.bfloat16)
    assert len(forwards) == 2 and main.ok is None and replica.ok and bare.ok and bare.same_as is None


def test_healthy_bf16_model_on_two_gpus_warns_and_stays_runnable(demo):
    target = resolve_target(str(demo.qwen_base), gpus=2)
    report = trainer_wrap_probe(prepare_model(target), target)
    finding = report.findings()[0]
    assert finding.verdict == "warn" and "136 → 68" in finding.title
    assert [outcome.ok for outcome in report.replica] == [None, True, True]  # the main thread's: notebook 04's


def test_planted_fp32_norm_before_bf16_head_fails(demo):
    target = resolve_target(str(demo.qwen_base), gpus=2)
    prepared = prepare_model(target)
    prepared.model.model.language_model.norm.float()  # what older trl's casting did: norms fp32, lm_head bf16
    finding = trainer_wrap_probe(prepared, target).findings()[0]
    assert finding.verdict == "fail"
    assert "nn.DataParallel" in finding.title and "float != c10::BFloat16" in finding.detail
    assert "_n_gpu = 1" in finding.fix


def test_one_gpu_passes(demo):
    target = resolve_target(str(demo.qwen_base), gpus=1)
    report = trainer_wrap_probe(prepare_model(target), target)
    assert report.findings()[0].verdict == "pass" and report.replica == []


def test_the_demo_stage2_names_the_releases_that_crash(demo):
    target = resolve_target(str(demo.qwen_stage2), gpus=2, quant="4bit", setup="qlora_trl_legacy")
    finding = trainer_wrap_probe(prepare_model(target), target).findings()[0]
    assert finding.verdict == "warn" and "multiplied by 2" in finding.title
    assert "4.30" in finding.detail and "float != c10::BFloat16" in finding.detail
    assert "5.6" not in finding.detail.split("would wrap it:")[1].split(".")[0]


def test_gpus_not_stated_the_planted_crash_is_a_warn_naming_the_launch(demo):
    target = resolve_target(str(demo.qwen_base))  # no --gpus: one GPU judged, two observed
    assert not target.gpus_stated and target.gpus == 1 and target.as_contract()["gpus"] is None
    prepared = prepare_model(target)
    prepared.model.model.language_model.norm.float()  # the seeds' fp32 norm before a bf16 head
    report = trainer_wrap_probe(prepared, target)
    (finding,) = report.findings()
    assert finding.verdict == "warn" and finding.title.startswith("If one training process sees 2 or more GPUs")
    assert "float != c10::BFloat16" in finding.detail and "--gpus 2" in finding.fix and "torchrun" in finding.fix
    assert finding.evidence["gpus_not_stated"]["observed_with"]["DataParallel"] is True


def test_gpus_not_stated_a_healthy_model_passes_and_says_what_two_gpus_would_do(demo):
    target = resolve_target(str(demo.qwen_base))
    report = trainer_wrap_probe(prepare_model(target), target)
    (finding,) = report.findings()
    assert finding.verdict == "pass" and "GPUs not stated" in finding.detail and "136 → 68" in finding.detail
    assert [outcome.ok for outcome in report.replica] == [None, True, True]


def test_gpus_not_stated_and_no_batch_the_model_accepts_is_still_a_pass_saying_so(demo):
    """A model that accepts none of the workbench's batches (here: its forward refuses every call): the one-GPU verdict
    needs none, and the unstated two-GPU launch says its replica forward was not run instead of an error."""
    target = resolve_target(str(demo.qwen_base))
    prepared = prepare_model(target)

    def refuse(*_args, **_kwargs):
        raise RuntimeError("planted: this model accepts no batch")

    prepared.model.register_forward_pre_hook(refuse)
    (finding,) = trainer_wrap_probe(prepared, target).findings()
    assert finding.verdict == "pass" and "replica forward was not run" in finding.detail
    assert "Could not build a batch" in finding.detail or "BatchNotAccepted" in finding.detail
