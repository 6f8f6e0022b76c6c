"""Notebook 03's wrapping chain needs no load of its own: under the plain set-up it walks a copy of the shared model's
module tree, under qlora it reads the set-up's own steps, snapshotted as they ran. For a checkpoint, a 4-bit load, a
trained adapter and one with `modules_to_save` of a VLM, the adapters of a causal LM and an encoder-decoder, and
qlora on each family, its snapshots equal those of the chain on a fresh load; the shared model is left exactly as the
set-up returned it (tensors, flags, modes, module types, hooks, config); no load is made."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.entry_forms.artifacts import FAMILIES
from workbench.model import shared
from workbench.model.guard import model_fingerprint
from workbench.model.loading import LOADS, load_pretrained
from workbench.model.target import resolve_target
from workbench.probes.peft.probes import _walk_chain, peft_attribute_probe

pytestmark = pytest.mark.slow  # the families' adapters are real training runs


def structure(model) -> list[tuple]:
    """Per module: its name, class, hooks and attribute names; and the config: what a wrap could leave behind that
    the fingerprint (tensors, flags, modes) does not see."""
    modules = [(name, type(m).__name__, len(m._forward_hooks), len(m._forward_pre_hooks), len(m._backward_hooks),
                tuple(sorted(m.__dict__))) for name, m in model.named_modules()]
    return [*modules, ("config", model.config.to_json_string() if hasattr(model, "config") else None)]


# every form of the VLM; the adapter forms (PEFT's unload, the class built on meta) of the other two families; under
# qlora, the checkpoint and an adapter of each family
CASES = [("qwen2_vl", form, "plain") for form in ("checkpoint", "checkpoint-4bit", "adapter",
                                                  "adapter-modules_to_save")] + [
    (family, form, "plain") for family in FAMILIES if family != "qwen2_vl"
    for form in ("adapter", "adapter-modules_to_save")] + [
    ("qwen2_vl", "checkpoint", "qlora"), ("qwen2_vl", "adapter", "qlora"), ("olmo2", "adapter-modules_to_save", "qlora"),
    ("t5", "adapter", "qlora")]


@pytest.mark.parametrize("family, form, setup", CASES)
def test_the_chain_without_a_load_equals_a_chain_on_its_own_load(family, form, setup, artifacts_of):
    """plain: a copy of the shared model's module tree; qlora: the set-up's own steps, snapshotted as they ran (its
    4-bit load, whatever --quant said), and a tree copy for the Trainer."""
    built = artifacts_of(family)
    folder = {"checkpoint": built.checkpoint, "checkpoint-4bit": built.checkpoint, "adapter": built.adapter,
              "adapter-modules_to_save": built.adapter_saved_head}[form]
    target = resolve_target(str(folder), quant="4bit" if form.endswith("4bit") else "none", setup=setup)
    shared.reset()
    model = shared.prepare_shared(target).model
    before, before_structure = model_fingerprint(model), structure(model)
    weights = {n: p.detach().clone() for n, p in model.named_parameters() if p.is_floating_point()}
    loads = len(LOADS)

    derived = peft_attribute_probe(target)

    assert len(LOADS) == loads  # no load of its own
    assert derived.raw_from.startswith({"plain": "a copy of the shared model's module tree",
                                        "qlora": "the qlora set-up's own steps"}[setup])
    assert model_fingerprint(model) == before and structure(model) == before_structure
    assert all(torch.equal(weights[n], p) for n, p in model.named_parameters() if n in weights)
    shared.reset()
    quant = "4bit" if setup == "qlora" else target.quant
    own = _walk_chain(load_pretrained(target.model_dir, quant=quant), dataclasses.replace(target, quant=quant),
                      "a load of its own")
    assert [dataclasses.asdict(s) for s in derived.snapshots] == [dataclasses.asdict(s) for s in own.snapshots]
    assert derived.skipped == own.skipped
    assert [f.to_dict() for f in derived.findings()] == [
        {**f.to_dict(), "evidence": {**f.evidence, "raw_model_from": derived.raw_from}} for f in own.findings()]


def test_another_set_up_or_a_device_map_loads_its_own_and_says_why(artifacts_of):
    checkpoint = artifacts_of(FAMILIES[0]).checkpoint
    shared.reset()
    loads = len(LOADS)
    report = peft_attribute_probe(resolve_target(str(checkpoint), quant="4bit", setup="qlora_trl_legacy"))
    assert len(LOADS) == loads + 1 and "the qlora_trl_legacy set-up's model is already wrapped" in LOADS[-1]["why"]
    assert report.raw_from == "a load of its own (the qlora_trl_legacy set-up's model is already wrapped)"
    assert "The raw model: a load of its own" in report.view().html()
    report = peft_attribute_probe(resolve_target(str(checkpoint), device_map="cpu"))
    assert len(LOADS) == loads + 2 and "accelerate's hooks" in report.raw_from


def test_a_model_whose_tree_cannot_be_copied_gets_a_chain_on_a_load_of_its_own(artifacts_of, monkeypatch):
    checkpoint = artifacts_of(FAMILIES[0]).checkpoint

    def refuses(model):
        raise TypeError("cannot pickle '_thread.lock' object")  # what deepcopy raises on a module holding a lock

    monkeypatch.setattr("workbench.model.module_tree.tree_copy", refuses)
    shared.reset()
    loads = len(LOADS)
    report = peft_attribute_probe(resolve_target(str(checkpoint)))
    assert len(LOADS) == loads + 2  # the shared model, then the chain's own
    assert report.raw_from.startswith("a load of its own (the prepared model's module tree could not be copied "
                                      "(TypeError: cannot pickle")
    assert [s.step for s in report.snapshots] == ["raw model", "get_peft_model", "Trainer (n_gpu=1)"]
