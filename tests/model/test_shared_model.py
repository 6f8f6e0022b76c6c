"""Load once, probe many: one prepared model shared by the steps of every notebook, and the steps that change it
leave it as the set-up returned it."""

import pytest
import torch

from workbench.model.guard import model_fingerprint, restored
from workbench.notebook import open_notebook


def census_frame(nb):
    return nb.run("census").to_frame().to_dict(orient="records")


def test_the_model_is_prepared_once_and_every_changing_step_restores_it(demo, tmp_path):
    from workbench.model.loading import LOADS

    options = dict(checkpoint=str(demo.qwen_stage2), quant="4bit", setup="qlora_trl_legacy", gpus=2,
                   findings_path=str(tmp_path / "f.json"))
    first = open_notebook("01_dtype_distribution", **options)
    first.run("static")
    loads = len(LOADS)
    prepared = first.run("prepared")
    assert len(LOADS) == loads + 1
    model = prepared.model
    before_census, before = census_frame(first), model_fingerprint(model)
    weights = {n: p.detach().clone() for n, p in model.named_parameters() if p.is_floating_point()}

    for name, steps in (("02_dataparallel", ("prepared", "wrap", "maps")),
                        ("04_forward_checks", ("prepared", "grads", "buffers", "forward"))):
        nb = open_notebook(name, **options)
        for step in steps:
            assert nb.run(step) is not None
        assert nb.results["prepared"] is prepared  # the same object: no second load
    assert len(LOADS) == loads + 1
    assert model_fingerprint(model) == before  # no tensor swapped, cast, frozen, unfrozen or moved; modes as they were
    assert all(torch.equal(weights[n], p) for n, p in model.named_parameters() if n in weights)  # no value changed
    again = open_notebook("01_dtype_distribution", **options)
    assert again.run("prepared") is prepared and census_frame(again) == before_census
    assert [f.verdict for f in nb.recorder.findings if f.id == "forward.dtype_flow"] == ["fail"]  # still the float != BFloat16 crash


def test_restored_undoes_a_cast_a_freeze_a_mode_change_and_keeps_values_exact():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4)).to(torch.float32)
    model.register_buffer("scale", torch.ones(2))
    exact = {n: p.detach().clone() for n, p in model.named_parameters()}
    before = model_fingerprint(model)
    with restored(model):
        for p in model.parameters():
            p.data = p.data.to(torch.bfloat16)  # what a simulated FSDP cast does: lossy for fp32 values
            p.requires_grad_(False)
        model.scale = torch.zeros(2, dtype=torch.float64)
        model.eval()
    assert model_fingerprint(model) == before
    assert all(torch.equal(exact[n], p) for n, p in model.named_parameters())


def test_a_new_target_frees_the_old_shared_model(demo, tmp_path):
    import gc
    import weakref

    from workbench.model.shared import prepare_shared
    from workbench.model.target import resolve_target

    old = prepare_shared(resolve_target(str(demo.llama)))
    ref = weakref.ref(old.model)
    del old
    prepare_shared(resolve_target(str(demo.llama), gpus=2))
    gc.collect()
    assert ref() is None  # never two resident


def run_notebooks(names, tmp_path, **options):
    """Each notebook's steps in order, in this process, as one kernel of a diagnosis runs them; their findings."""
    from workbench.catalog import notebook

    findings = {}
    tmp_path.mkdir(parents=True, exist_ok=True)
    for name in names:
        nb = open_notebook(name, findings_path=str(tmp_path / f"{name}.json"), **options)
        for step in notebook(name).steps:
            nb.run(step.name)
        findings[name] = [(f.id, f.verdict, f.title) for f in nb.recorder.findings]
    return findings


NOTEBOOKS_01_TO_04 = ("01_dtype_distribution", "02_dataparallel", "03_peft_attributes", "04_forward_checks")


def loads_of_03_alone_and_of_01_to_04(tmp_path, monkeypatch, **options):
    """On a model declared too big for two copies: (loads of notebook 03 alone, its findings), then (loads of
    notebooks 01-04 told which notebooks run, 03's findings among them)."""
    from workbench.model import shared
    from workbench.model.loading import LOADS

    monkeypatch.setattr("workbench.model.memory.two_copies_fit_easily", lambda target: False)
    shared.reset()
    loads = len(LOADS)
    alone = run_notebooks(["03_peft_attributes"], tmp_path / "alone", **options)  # no list of notebooks
    alone_loads = len(LOADS) - loads
    shared.reset()
    monkeypatch.setenv(shared.NOTEBOOKS_ENV, ",".join(NOTEBOOKS_01_TO_04))
    loads = len(LOADS)
    together = run_notebooks(NOTEBOOKS_01_TO_04, tmp_path / "together", **options)
    shared.reset()
    return (alone_loads, alone["03_peft_attributes"]), (len(LOADS) - loads, together["03_peft_attributes"])


def test_a_model_too_big_for_two_copies_is_still_loaded_twice_not_three_times(demo, tmp_path, monkeypatch):
    """A checkpoint too big to hold twice, under a set-up that casts the model past the chain (older trl's): notebook
    03's wrapping chain needs a raw copy of its own, which would free the shared model and have 03 prepare it again. Told which
    notebooks run, the first prepare walks the chain first; 03 gets that result, with the findings a chain of its
    own gives, and the model is loaded twice in all."""
    from workbench.model import shared
    from workbench.model.loading import LOADS

    options = dict(checkpoint=str(demo.llama), quant="4bit", setup="qlora_trl_legacy",
                   params_json='{"real_quant_max_bytes": 0}')
    (alone_loads, alone), (together_loads, together) = loads_of_03_alone_and_of_01_to_04(tmp_path, monkeypatch,
                                                                                          **options)
    assert (alone_loads, together_loads) == (2, 2) and together == alone
    monkeypatch.setenv(shared.NOTEBOOKS_ENV, "01_dtype_distribution")  # 03 not run: nothing walked ahead of time
    loads = len(LOADS)
    run_notebooks(["01_dtype_distribution"], tmp_path / "only01", **options)
    assert len(LOADS) == loads + 1
    shared.reset()


@pytest.mark.parametrize("setup", ["plain", "qlora"])
def test_under_the_plain_and_qlora_set_ups_notebooks_01_to_04_load_the_model_once(demo, tmp_path, monkeypatch, setup):
    """The plain set-up: 03's chain walks a copy of the shared model's module tree; qlora: it reads the set-up's own
    steps, snapshotted as they ran. Either way notebooks 01-04 load the model once, also where two copies would not
    fit, and 03's findings are those it gives alone."""
    options = dict(checkpoint=str(demo.llama), setup=setup, params_json='{"real_quant_max_bytes": 0}')
    (alone_loads, alone), (together_loads, together) = loads_of_03_alone_and_of_01_to_04(tmp_path, monkeypatch,
                                                                                          **options)
    assert (alone_loads, together_loads) == (1, 1) and together == alone
