"""eval.metrics is head-aware: a model whose head the recipes' generation metrics cannot score (a classifier, a bare
encoder, a text-only LM: the evaluation set asks about images) is loaded and measured, and the check says skip with
the reason — with or without an evaluation dataset, never an error."""

import json

import pytest

from workbench.catalog import notebook
from workbench.notebook import open_notebook
from workbench.tasks.grounding import write_dataset


@pytest.fixture(scope="module")
def grounding(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("grounding"), 2, seed=3)


@pytest.mark.parametrize("name, model_class, reason", [
    ("bert_seq_cls", "BertForSequenceClassification", "generation metrics need a generative head"),
    ("bert_encoder", "BertModel", "generation metrics need a generative head"),
    ("t5", "T5ForConditionalGeneration", "need an image-text-to-text model"),
    ("llama", "LlamaForCausalLM", "need an image-text-to-text model"),
])
@pytest.mark.parametrize("with_dataset", [False, True])
def test_a_head_the_metrics_cannot_score_is_a_skip_with_its_reason(family, grounding, tmp_path, name, model_class,
                                                                   reason, with_dataset):
    params = json.dumps({"eval_dataset": str(grounding)} if with_dataset else {})
    nb = open_notebook("05_evaluation", checkpoint=str(family(name)), params_json=params,
                       findings_path=str(tmp_path / "f.json"))
    for step in notebook("05_evaluation").steps:
        nb.run(step.name)
    found = {f.id: f for f in nb.recorder.findings}
    assert set(found) == set(notebook("05_evaluation").checks)
    metrics = found["eval.metrics"]
    assert metrics.verdict == "skip" and reason in metrics.title and model_class in metrics.title, metrics
    assert metrics.evidence["heads"][name]["model_class"] == model_class
    assert not [f for f in found.values() if f.verdict in ("error", "fail", "warn")], found
    assert found["eval.memory"].verdict == "pass"  # it was still loaded and measured
    [row] = nb.results["evaluation"].table()
    assert row["n"] is None and row["error"] == "" and model_class in row["not scored"]
