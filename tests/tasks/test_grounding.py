import json

import numpy as np
import pytest

from workbench.tasks.grounding import (
    GRID,
    IMAGE_SIZE,
    QUESTION,
    SCALE,
    format_box,
    make_sample,
    parse_box,
    read_dataset,
    write_dataset,
)


def test_a_sample_is_a_function_of_index_and_seed():
    a, b = make_sample(5, seed=3), make_sample(5, seed=3)
    assert np.array_equal(np.asarray(a.image), np.asarray(b.image))
    assert (a.box, a.answer, a.question) == (b.box, b.answer, QUESTION)
    other = make_sample(5, seed=4)
    assert not np.array_equal(np.asarray(a.image), np.asarray(other.image))


def test_boxes_lie_on_the_grid_and_the_answer_says_the_box():
    step = SCALE // GRID
    for index in range(50):
        sample = make_sample(index, seed=0)
        x1, y1, x2, y2 = sample.box
        assert all(v % step == 0 for v in sample.box) and x1 < x2 and y1 < y2
        assert sample.image.size == (IMAGE_SIZE, IMAGE_SIZE) and sample.image.mode == "RGB"
        assert parse_box(sample.answer) == (sample.box, None)


def test_box_pixels_differ_from_the_background():
    sample = make_sample(0, seed=0)
    pixels = np.asarray(sample.image).astype(float)
    x1, y1, x2, y2 = (v * IMAGE_SIZE // SCALE for v in sample.box)
    inside = np.zeros(pixels.shape[:2], dtype=bool)
    inside[y1:y2, x1:x2] = True
    assert np.abs(pixels[inside].mean(0) - pixels[~inside].mean(0)).max() > 30


def test_an_image_is_sixteen_image_tokens_for_the_demo_processor(demo):
    from workbench.model.inputs import load_vlm_parts, vlm_inputs

    tokenizer, image_processor = load_vlm_parts(demo.qwen_base)
    inputs = vlm_inputs(tokenizer, image_processor, make_sample(0).image, QUESTION)
    assert inputs["image_grid_thw"].tolist() == [[1, 8, 8]]
    assert int(inputs["mm_token_type_ids"].sum()) == 16


@pytest.mark.parametrize("text", [
    "[0, 250, 500, 1000]", "[0,250,500,1000]", "  [ 0 , 250 ,500,  1000 ]  ", "The box is [0, 250, 500, 1000].",
    "(0,250),(500,1000)", "(0, 250), (500, 1000)", "<|box_start|>(0,250),(500,1000)<|box_end|>",
])
def test_parse_box_reads_both_formats(text):
    assert parse_box(text) == ((0, 250, 500, 1000), None)


@pytest.mark.parametrize("text, reason", [
    (None, "empty answer"), ("   ", "empty answer"), ("no box here", "no box in the answer"),
    ("[0, 250, 500]", "malformed box"), ("[0, 250, 500, 1000", "malformed box"), ("(0,250),(500", "malformed box"),
    ("[500, 0, 250, 1000]", "inverted box"), ("[0, 0, 1200, 1000]", "outside 0..1000"),
    ("[0.5, 0, 1, 1]", "not integers"),
])
def test_parse_box_says_why_it_found_no_box(text, reason):
    box, error = parse_box(text)
    assert box is None and reason in error


def test_the_first_box_in_the_answer_wins():
    assert parse_box("(1,2),(3,4) then [5, 6, 7, 8]")[0] == (1, 2, 3, 4)
    assert format_box((1, 2, 3, 4)) == "[1, 2, 3, 4]"


def test_dataset_round_trip(tmp_path):
    write_dataset(tmp_path, 3, seed=7)
    rows = read_dataset(tmp_path)
    assert [r.error for r in rows] == [None] * 3
    for index, row in enumerate(rows):
        sample = make_sample(index, seed=7)
        assert (row.box, row.answer, row.question) == (sample.box, sample.answer, sample.question)
        assert np.array_equal(np.asarray(row.image), np.asarray(sample.image))    # PNG is lossless


def test_unreadable_rows_are_kept_with_their_error(tmp_path):
    write_dataset(tmp_path, 2, seed=0)
    (tmp_path / "images" / "broken.png").write_bytes(b"not a png")
    good = json.loads((tmp_path / "data.jsonl").read_text().splitlines()[0])
    bad_lines = [
        "{not json",
        json.dumps({k: v for k, v in good.items() if k != "answer"}),
        json.dumps({**good, "image": "images/missing.png"}),
        json.dumps({**good, "image": "images/broken.png"}),
        json.dumps({**good, "box": [1, 2, 3]}),
        json.dumps(["a", "list"]),
    ]
    with open(tmp_path / "data.jsonl", "a") as f:
        f.write("\n" + "\n".join(bad_lines) + "\n")
    rows = read_dataset(tmp_path)
    assert len(rows) == 2 + len(bad_lines)
    assert [r.error for r in rows[:2]] == [None, None]
    expected = ["malformed JSON", "missing field(s) answer", "image not found: images/missing.png",
                "image unreadable", "box is not four integers", "not a JSON object"]
    for row, reason in zip(rows[2:], expected):
        assert reason in row.error and row.image is None
        assert row.error.startswith(f"line {row.line}:")
    assert rows[2].line == 4     # the blank line before the bad ones is skipped, not renumbered
