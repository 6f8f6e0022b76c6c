import math

import pytest

from workbench.model.vlm_batches import teacher_forced_inputs
from workbench.probes.evaluation.generation import evaluate_samples, teacher_forced_scores
from workbench.probes.evaluation.metrics import (
    METRICS,
    SampleRecord,
    box_iou,
    compute_metrics,
    metrics_table,
    register_metric,
    summarize,
)
from workbench.tasks.grounding import GroundingRow, make_sample


@pytest.mark.parametrize("a, b, expected", [
    ((0, 0, 10, 10), (0, 0, 10, 10), 1.0),          # identical
    ((0, 0, 10, 10), (20, 20, 30, 30), 0.0),        # disjoint
    ((0, 0, 10, 10), (10, 0, 20, 10), 0.0),         # touching edges
    ((0, 0, 10, 10), (5, 0, 15, 10), 1 / 3),        # half of each overlaps: 50 / 150
    ((0, 0, 10, 10), (0, 0, 5, 10), 0.5),           # one holds the other, twice its area
    ((0, 0, 500, 500), (250, 250, 750, 750), 1 / 7),
    ((5, 5, 5, 5), (5, 5, 5, 5), 0.0),              # empty union
])
def test_box_iou_on_hand_computed_cases(a, b, expected):
    assert box_iou(a, b) == pytest.approx(expected)
    assert box_iou(b, a) == pytest.approx(expected)


def _records():
    """Five scored samples (a perfect one, a near miss, a wrong box, no box, a crash) and an unreadable row."""
    ref = "[0, 0, 500, 500]"
    return [
        SampleRecord(0, ref, (0, 0, 500, 500), ref, (0, 0, 500, 500), iou=1.0, loss=0.1, token_accuracy=1.0),
        SampleRecord(1, ref, (0, 0, 500, 500), "[0, 0, 500, 750]", (0, 0, 500, 750), iou=2 / 3, loss=0.5,
                     token_accuracy=0.5),
        SampleRecord(2, ref, (0, 0, 500, 500), "[750, 750, 1000, 1000]", (750, 750, 1000, 1000), iou=0.0),
        SampleRecord(3, ref, (0, 0, 500, 500), "[0, 0", error="malformed box: [0, 0", error_kind="parse"),
        SampleRecord(4, ref, (0, 0, 500, 500), error="RuntimeError: boom", error_kind="exception"),
        SampleRecord(5, error="line 7: image not found: x.png", error_kind="dataset"),
    ]


def test_metrics_count_failures_instead_of_dropping_them():
    values = compute_metrics(_records())
    assert values["mean_iou"] == pytest.approx((1.0 + 2 / 3) / 5)
    assert values["detection_rate"] == pytest.approx(3 / 5)
    assert values["iou>0.5"] == pytest.approx(2 / 5)
    assert values["iou>0.7"] == pytest.approx(1 / 5)
    assert values["exact_match"] == pytest.approx(1 / 5)
    assert values["loss"] == pytest.approx(0.3) and values["token_accuracy"] == pytest.approx(0.75)


def test_summary_counts_every_kind_of_failure():
    summary = summarize(_records())
    assert (summary["n"], summary["scored"]) == (6, 5)
    assert summary["errors"] == {"dataset": 1, "exception": 1, "parse": 1}


def test_the_grounding_table():
    perfect = [SampleRecord(0, "[0, 0, 1, 1]", (0, 0, 1, 1), "[0, 0, 1, 1]", (0, 0, 1, 1), iou=1.0)]
    table = metrics_table({"base": _records(), "r1-llm-only": perfect})
    assert [row["Model"] for row in table] == ["base", "r1-llm-only"]
    assert list(table[0])[:5] == ["Model", "Mean IoU", "Det rate", "IoU>0.5", "IoU>0.7"]
    assert table[0]["Mean IoU"] == pytest.approx(1 / 3)
    assert (table[0]["n"], table[0]["failed"], table[0]["unreadable rows"]) == (5, 2, 1)
    assert table[1]["Mean IoU"] == table[1]["IoU>0.7"] == 1.0


def test_no_scored_sample_gives_no_value_rather_than_zero():
    values = compute_metrics([SampleRecord(0, error="bad row", error_kind="dataset")])
    assert values["mean_iou"] is None and values["detection_rate"] is None and values["loss"] is None


def test_metric_registry():
    @register_metric("boxes_found")
    def boxes_found(records):
        return float(sum(r.predicted_box is not None for r in records))

    try:
        assert compute_metrics(_records(), ["boxes_found"]) == {"boxes_found": 3.0}
        with pytest.raises(ValueError, match="already registered"):
            register_metric("boxes_found")(boxes_found)
    finally:
        del METRICS["boxes_found"]
    assert {"mean_iou", "detection_rate", "iou>0.5", "iou>0.7", "exact_match", "loss", "token_accuracy"} <= set(METRICS)


@pytest.fixture(scope="module")
def base_parts(demo):
    import torch
    from transformers import Qwen2VLForConditionalGeneration

    from workbench.model.inputs import load_vlm_parts

    torch.set_num_threads(min(2, torch.get_num_threads()))
    tokenizer, image_processor = load_vlm_parts(demo.qwen_base)
    return Qwen2VLForConditionalGeneration.from_pretrained(demo.qwen_base), tokenizer, image_processor


def test_teacher_forced_inputs_label_only_the_answer(base_parts):
    _, tokenizer, image_processor = base_parts
    sample = make_sample(0)
    inputs = teacher_forced_inputs(tokenizer, image_processor, sample.image, sample.question, sample.answer)
    labels = inputs["labels"][0]
    answer = labels[labels != -100]
    assert tokenizer.decode(answer) == sample.answer + tokenizer.eos_token
    assert inputs["input_ids"][0, -len(answer):].tolist() == answer.tolist()
    assert inputs["input_ids"].shape == inputs["attention_mask"].shape == inputs["mm_token_type_ids"].shape


def test_teacher_forced_scores_of_the_random_base(base_parts):
    model, tokenizer, image_processor = base_parts
    sample = make_sample(0)
    inputs = teacher_forced_inputs(tokenizer, image_processor, sample.image, sample.question, sample.answer)
    loss, accuracy = teacher_forced_scores(model, inputs)
    assert abs(loss - math.log(len(tokenizer))) < 1.0        # a random model: about uniform over the vocabulary
    assert 0.0 <= accuracy <= 1.0


def test_evaluate_samples_keeps_every_failure_in_its_record(base_parts):
    model, tokenizer, image_processor = base_parts
    sample = make_sample(0)
    rows = [
        sample,
        GroundingRow(line=2, error="line 2: image not found: images/x.png"),
        GroundingRow(line=3, image_path="images/y.png", question=sample.question, answer=sample.answer,
                     box=sample.box, image=None),       # claims to be readable, has no image: generation raises
    ]
    seen = []
    model.train()
    records = evaluate_samples(model, tokenizer, image_processor, rows, max_new_tokens=8,
                               progress=lambda done, total, record: seen.append((done, total, record.index)))
    assert model.training                                 # the caller's mode is given back
    assert seen == [(1, 3, 0), (2, 3, 1), (3, 3, 2)]
    first, unreadable, crashed = records
    assert first.prediction is not None and first.loss is not None and first.seconds > 0
    assert first.error_kind in (None, "parse") and (first.error is None) == (first.predicted_box is not None)
    assert unreadable.error_kind == "dataset" and "image not found" in unreadable.error
    assert crashed.error_kind == "exception" and crashed.prediction is None
    summary = summarize(records)
    assert summary["scored"] == 2 and summary["errors"]["dataset"] == 1 and summary["errors"]["exception"] == 1


def asked_differently(n: int) -> list:
    """n samples whose questions differ in length, so their prompts do too."""
    import dataclasses

    return [dataclasses.replace(make_sample(i), question=make_sample(i).question + " Answer briefly." * i)
            for i in range(n)]


def test_batched_generation_gives_each_sample_the_answer_it_gets_alone(base_parts):
    """Left-padded batches (prompts of different lengths: questions differ) against one sample at a time: the same
    greedy answers, the same teacher-forced scores."""
    model, tokenizer, image_processor = base_parts
    rows = asked_differently(6)
    alone = evaluate_samples(model, tokenizer, image_processor, rows, max_new_tokens=8, batch_size=1)
    batched = evaluate_samples(model, tokenizer, image_processor, rows, max_new_tokens=8, batch_size=4)
    assert [r.prediction for r in batched] == [r.prediction for r in alone]
    assert [r.index for r in batched] == list(range(6))
    for a, b in zip(alone, batched):
        assert b.loss == pytest.approx(a.loss, abs=1e-4) and b.token_accuracy == pytest.approx(a.token_accuracy)


def test_a_batch_that_fails_is_retried_one_sample_at_a_time(base_parts, monkeypatch):
    """A batch that raises (out of memory on a GPU) is run again sample by sample: every row still gets its answer,
    and a sample that fails alone keeps its own error while its neighbours are scored."""
    model, tokenizer, image_processor = base_parts
    rows = asked_differently(3)
    expected = [r.prediction for r in evaluate_samples(model, tokenizer, image_processor, rows, 8, batch_size=1)]
    generate = model.generate

    def refusing_batches(**inputs):
        if inputs["input_ids"].shape[0] > 1:
            raise RuntimeError("CUDA out of memory (planted)")
        if tokenizer.decode(inputs["input_ids"][0]).count("Answer briefly.") == 1:  # rows[1]'s question
            raise ValueError("this sample breaks the model (planted)")
        return generate(**inputs)

    monkeypatch.setattr(model, "generate", refusing_batches)
    records = evaluate_samples(model, tokenizer, image_processor, rows, 8, batch_size=3)
    assert [records[0].prediction, records[2].prediction] == [expected[0], expected[2]]
    assert records[1].error_kind == "exception" and "planted" in records[1].error and records[1].prediction is None
    assert "out of memory" not in (records[0].error or "") + (records[2].error or "")
