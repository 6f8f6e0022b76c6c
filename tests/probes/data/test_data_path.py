"""Notebook 07, the data path: the demo's healthy chat data, and each defect planted the way users plant it."""

from __future__ import annotations

import html
import json

import pytest

from workbench.demo.chat_data import chat_rows, write_chat_data
from workbench.errors import UsageError
from workbench.model.target import resolve_target
from workbench.notebook import NOTEBOOK_PARAMETERS
from workbench.probes.data.batches import data_path_probe
from workbench.probes.data.sources import open_source
from workbench.probes.data.stats import data_statistics_probe
from workbench.probes.data.template import template_probe
from workbench.probes.data.token_view import token_view_probe

STEPS = ("data_path", "data_stats", "data_template", "token_view")


def diagnose_data(checkpoint, data=None, **options):
    """The four steps as notebook 07 runs them: {check: finding}, and the token view's HTML."""
    target = resolve_target(str(checkpoint), data=str(data) if data else None, **options)
    params = target.params
    path = data_path_probe(target, samples=params.get("data_samples"), max_length=params.get("max_length"))
    stats = data_statistics_probe(path)
    findings = stats.findings() + template_probe(path, stats).findings()
    return {f.id: f for f in findings}, token_view_probe(path, stats).view().html()


@pytest.fixture(scope="module")
def chat_data(tmp_path_factory):
    return write_chat_data(tmp_path_factory.mktemp("data") / "chat.jsonl", rows=40)


def test_the_demo_chat_data_is_healthy(demo, chat_data):
    found, view = diagnose_data(demo.llama, chat_data)
    verdicts = {k: f.verdict for k, f in found.items()}
    # messages rows without assistant-only loss: trl trains the whole sequence, prompts included by design
    assert verdicts == {"data.labels": "info", "data.eos": "pass", "data.truncation": "pass",
                        "data.template": "pass"}, {k: f.detail for k, f in found.items()}
    assert found["data.labels"].evidence["rows_batched"] == 40
    assert "no BOS token" in found["data.template"].detail  # the demo tokenizer has none: it cannot double it
    assert "&lt;|im_end|&gt;" in view and "#c8e6c9" in view and "row 0" in view


def test_prompt_completion_rows_saved_with_datasets_are_completion_only(demo, tmp_path):
    from datasets import Dataset

    rows = [{"prompt": r["messages"][:-1], "completion": r["messages"][-1:]} for r in chat_rows(30)]
    Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"))
    source = open_source(tmp_path / "saved")
    assert (source.kind, source.format, source.total, source.conversational) == ("saved", "prompt-completion", 30, True)
    found, view = diagnose_data(demo.llama, tmp_path / "saved")
    # trl's default for prompt/completion: completion-only loss; the prompt's -100 is by design, not a defect
    assert found["data.labels"].verdict == "pass", found["data.labels"].detail
    assert found["data.eos"].verdict == "pass" and found["data.truncation"].verdict == "pass"
    assert "#e0e0e0" in view  # masked prompt tokens shown grey


def test_pad_equal_to_eos_masked_by_the_collator_fails_eos(demo, chat_data):
    found, view = diagnose_data(demo.llama, chat_data, setup="data_setups:pad_is_eos")
    eos = found["data.eos"]
    assert eos.verdict == "fail" and "0 %" in eos.title
    assert "pad = EOS" in eos.detail and "pad_token_id 2" in eos.detail and "pad token distinct" in eos.fix
    assert eos.evidence["pad_token_id"] == eos.evidence["eos_token_id"] == 2
    assert eos.evidence["eos_unsupervised"]["rows"][:3] == [0, 1, 2]  # rows named
    assert found["data.labels"].evidence["built_by"] == "trainer"
    assert "the end-of-turn / EOS token is not a supervised label" in view


def test_a_response_template_that_never_matches_fails_labels(demo, chat_data):
    found, view = diagnose_data(demo.llama, chat_data, setup="data_setups:response_template_never_matches")
    labels = found["data.labels"]
    assert labels.verdict == "fail" and "40 of 40 rows (100.0 %) every label -100" in labels.detail
    assert labels.evidence["nothing_supervised"]["rows"][:3] == [0, 1, 2]
    assert "response template" in labels.fix
    # the same collator with the template's own assistant header: answers supervised, prompts masked
    healthy, _ = diagnose_data(demo.llama, chat_data, setup="data_setups:response_template_matches")
    assert healthy["data.labels"].verdict == "pass" and healthy["data.eos"].verdict == "pass"


def test_max_length_shorter_than_the_answers_fails_truncation(demo, chat_data, tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text("max_length: 24\n")
    from workbench.params import load_params

    found, view = diagnose_data(demo.llama, chat_data, params=load_params(params))
    trunc = found["data.truncation"]
    assert trunc.verdict == "fail" and "max_length 24" in trunc.title
    evidence = trunc.evidence
    assert evidence["truncated"]["count"] == 40 and evidence["lengths"]["max"] > 24
    assert evidence["answer_lost"]["count"] + evidence["answer_cut"]["count"] == 40
    assert evidence["answer_lost"]["rows"][0] == 0  # row 0 has a system turn: its answer starts past 24 tokens
    assert found["data.eos"].verdict == "skip"  # nothing reaches a batch whole: no EOS to judge
    assert "data:image/png;base64" in diagnose_stats_html(demo, chat_data, 24)
    # completion-only loss: rows whose answer is cut away entirely have nothing supervised, and trl drops them
    completion = tmp_path / "pc.jsonl"
    completion.write_text("".join(json.dumps({"prompt": r["messages"][:-1], "completion": r["messages"][-1:]}) + "\n"
                                  for r in chat_rows(40)))
    found, _ = diagnose_data(demo.llama, completion, params={"max_length": 24})
    assert found["data.truncation"].verdict == "fail" and "trl drops the" in found["data.truncation"].detail
    assert found["data.truncation"].evidence["dropped_by_truncation"] > 0


def diagnose_stats_html(demo, data, max_length):
    target = resolve_target(str(demo.llama), data=str(data))
    return data_statistics_probe(data_path_probe(target, max_length=max_length)).view().html()


def test_a_template_that_doubles_bos_fails_template(demo, copy_of, tmp_path):
    from tokenizers.processors import TemplateProcessing
    from transformers import AutoTokenizer

    from workbench.demo.build import CHAT_TEMPLATE

    ckpt = copy_of(demo.llama, "llama-bos")
    tokenizer = AutoTokenizer.from_pretrained(ckpt)
    tokenizer.add_special_tokens({"bos_token": "<s>"})
    tokenizer._tokenizer.post_processor = TemplateProcessing(single="<s> $A", special_tokens=[
        ("<s>", tokenizer.bos_token_id)])
    tokenizer.chat_template = "{{ bos_token }}" + CHAT_TEMPLATE
    tokenizer.save_pretrained(ckpt)
    tokenizer = AutoTokenizer.from_pretrained(ckpt)
    assert tokenizer("hi")["input_ids"][0] == tokenizer.bos_token_id  # the tokenizer adds BOS itself
    # the rows stored already rendered, as many scripts do: render (template BOS) then encode (tokenizer BOS)
    data = tmp_path / "rendered.jsonl"
    data.write_text("".join(json.dumps({"text": tokenizer.apply_chat_template(r["messages"], tokenize=False)}) + "\n"
                            for r in chat_rows(12)))
    found, view = diagnose_data(ckpt, data)
    template = found["data.template"]
    assert template.verdict == "fail" and "12 batched row(s)" in template.title, template.detail
    assert "<s> twice" in template.detail and "add_special_tokens=False" in template.fix
    # the same tokenizer with messages rows: trl tokenizes inside apply_chat_template (one BOS); rendering then
    # encoding would double it: a warn, not a fail
    messages = write_chat_data(tmp_path / "messages.jsonl", rows=12)
    found, _ = diagnose_data(ckpt, messages)
    assert found["data.template"].verdict == "warn" and "render-then-encode" in found["data.template"].detail
    assert found["data.template"].evidence["batched_rows_with_bos_twice"]["count"] == 0


def test_special_tokens_in_the_raw_text_warn(demo, tmp_path):
    rows = list(chat_rows(10))
    rows[3]["messages"][-1]["content"] += " <|im_end|> and more"
    data = tmp_path / "special.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    found, _ = diagnose_data(demo.llama, data)
    assert found["data.template"].verdict == "warn" and found["data.template"].evidence[
        "special_tokens_in_text"]["rows"] == [3]


def test_without_data_every_check_says_skip_and_how_to_give_it(demo):
    found, view = diagnose_data(demo.llama)
    assert {k: f.verdict for k, f in found.items()} == dict.fromkeys(
        ("data.labels", "data.eos", "data.truncation", "data.template"), "skip")
    assert all("--data FILE" in f.detail for f in found.values()) and "--data FILE" in view


def test_data_samples_caps_the_rows_read(demo, chat_data):
    found, _ = diagnose_data(demo.llama, chat_data, params={"data_samples": 7})
    assert found["data.labels"].evidence["rows_read"] == 7


def test_data_is_a_target_option_that_round_trips(demo, chat_data):
    target = resolve_target(str(demo.llama), data=str(chat_data))
    assert "data" in NOTEBOOK_PARAMETERS and resolve_target(**target.options()) == target
    with pytest.raises(UsageError, match="does not exist"):
        resolve_target(str(demo.llama), data=str(chat_data) + ".missing")


def test_unreadable_rows_are_named(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "x"}\n')
    with pytest.raises(UsageError, match="none of the formats"):
        open_source(bad)


def test_the_panel_runs_the_data_path(demo, chat_data, tmp_path):
    from workbench.interactive.panel import GROUPS, PanelSession

    assert "Data path" in GROUPS  # ticked by default: without data it only says skip
    session = PanelSession(tmp_path)
    target = session.validate(str(demo.llama), data=str(chat_data))
    findings = {f.id: f.verdict for f in session.run(target, {"Data path"})}
    assert findings == {"data.labels": "info", "data.eos": "pass", "data.truncation": "pass", "data.template": "pass",
                        "data.pairs": "skip"}  # no preference trainer in a plain set-up
    html = "".join(r.view().html() for r in session.results["Data path"])
    assert "#c8e6c9" in html and "max_length" in html


def test_a_real_sft_trainer_is_the_source_of_truth(demo, tmp_path):
    data = tmp_path / "pc.jsonl"
    data.write_text("".join(json.dumps({"prompt": r["messages"][:-1], "completion": r["messages"][-1:]}) + "\n"
                            for r in chat_rows(24)))
    found, view = diagnose_data(demo.llama, data, setup="data_setups:sft_trainer")
    labels = found["data.labels"]
    assert labels.evidence["built_by"] == "trainer" and "SFTTrainer" in labels.evidence["masking"]
    assert labels.verdict == "pass" and labels.evidence["rows_read"] == 24, labels.detail  # prompts masked by design
    assert found["data.eos"].verdict == "pass"
    assert found["data.truncation"].evidence["max_length"] == 48  # the Trainer's own args.max_length


def test_a_setup_may_return_its_trainer_to_every_notebook(demo, chat_data):
    from workbench.model.setups import prepare_model

    pc = chat_data.with_name("pc-prepare.jsonl")
    pc.write_text("".join(json.dumps({"prompt": r["messages"][:-1], "completion": r["messages"][-1:]}) + "\n"
                          for r in chat_rows(8)))
    prepared = prepare_model(resolve_target(str(demo.llama), setup="data_setups:sft_trainer", data=str(pc)))
    assert type(prepared.trainer).__name__ == "SFTTrainer" and prepared.model is prepared.trainer.model
    assert "SFTTrainer your set-up returned" in prepared.description


def test_pre_tokenized_rows_with_their_own_labels(demo, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(demo.llama)
    rows = []
    for r in chat_rows(6):
        ids = list(tokenizer.apply_chat_template(r["messages"], tokenize=True, return_dict=True)["input_ids"])
        rows.append({"input_ids": ids, "labels": [-100] * len(ids)})  # a script that masked everything
    data = tmp_path / "tokenized.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert open_source(data).format == "tokenized"
    found, _ = diagnose_data(demo.llama, data)
    # trl keeps a labels column as is; with max_length set it drops the rows that supervise nothing: all of them
    labels = found["data.labels"]
    assert labels.verdict == "fail" and labels.evidence["dropped_unsupervised"]["count"] == 6, labels.detail
    assert "6 of 6 rows (100.0 %) nothing to supervise: trl drops the row" in labels.detail


# --- the official Llama-3 / Gemma 3 layout: template BOS + tokenizer BOS ------------------------------------------
@pytest.mark.parametrize("layout", ["llama3", "gemma3"])
def test_the_llama3_and_gemma3_bos_layout_batches_bos_once(layout, tmp_path):
    from data_setups import bos_in_template_checkpoint
    from transformers import AutoTokenizer

    ckpt = bos_in_template_checkpoint(tmp_path / layout, layout)
    tokenizer = AutoTokenizer.from_pretrained(ckpt)
    found, view = diagnose_data(ckpt, write_chat_data(tmp_path / "messages.jsonl", rows=12))
    template = found["data.template"]
    # trl tokenizes messages with apply_chat_template(tokenize=True): one BOS per batched row, no fail; rendering then
    # encoding would double it, which stays a warn about such code
    assert template.verdict == "warn" and template.evidence["batched_rows_with_bos_twice"] == {"count": 0, "rows": []}
    assert "none of the 12 batched rows starts with BOS twice" in template.detail, template.detail
    assert found["data.labels"].verdict == "info" and found["data.eos"].verdict == "pass", found
    assert found["data.truncation"].verdict == "pass"
    assert html.escape(tokenizer.bos_token) in view  # the token view shows the batched rows' BOS


# --- the rows' own text, before trl's preparation ----------------------------------------------------------------
def plain_prompt_completion(path, rows=20, edit=None):
    """Plain-text prompt/completion rows (trl appends the EOS text to each completion when it prepares them)."""
    records = [{"prompt": r["messages"][-2]["content"], "completion": " " + r["messages"][-1]["content"]}
               for r in chat_rows(rows)]
    for index, record in enumerate(records):
        if edit:
            edit(index, record)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_plain_prompt_completion_rows_are_healthy_and_a_planted_special_token_warns(demo, tmp_path):
    found, _ = diagnose_data(demo.llama, plain_prompt_completion(tmp_path / "pc.jsonl"))
    assert {k: f.verdict for k, f in found.items()} == dict.fromkeys(
        ("data.labels", "data.eos", "data.truncation", "data.template"), "pass"), {
        k: f.detail for k, f in found.items()}
    assert found["data.template"].evidence["special_tokens_in_text"] == {"count": 0, "rows": []}

    def plant(index, record):
        if index == 7:
            record["completion"] += "<|im_end|> and more"
    found, _ = diagnose_data(demo.llama, plain_prompt_completion(tmp_path / "special.jsonl", edit=plant))
    template = found["data.template"]
    assert template.verdict == "warn" and template.title == "Special tokens in the raw text"
    assert template.evidence["special_tokens_in_text"] == {"count": 1, "rows": [7]}
    assert "rows 7" in template.detail and "rows 7 of special.jsonl" in template.fix


# --- blank answers ---------------------------------------------------------------------------------------------
def blank(record, key):
    if key == "completion":
        record["completion"] = ""
    else:
        record["messages"][-1]["content"] = " \n"


def test_blank_completions_fail_labels_and_their_healthy_twin_passes(demo, tmp_path):
    data = plain_prompt_completion(tmp_path / "blank.jsonl", edit=lambda i, r: blank(r, "completion"))
    found, view = diagnose_data(demo.llama, data)
    labels = found["data.labels"]
    # each row supervises only the EOS trl appends: the model learns to answer with EOS alone
    assert labels.verdict == "fail" and "20 of 20 row(s) have a blank answer" in labels.title, labels.detail
    assert labels.evidence["blank_answer"] == {"count": 20, "rows": list(range(20))}
    assert labels.evidence["blank_answer_example"]["supervised_answer_ids"] == [2]  # <|im_end|>, the EOS alone
    assert "all it supervises is the EOS appended to it" in labels.detail and "unsloth #2515" in labels.detail
    assert "blank.jsonl" in labels.fix and "row['completion'].strip()" in labels.fix
    assert found["data.eos"].verdict == "pass"  # EOS is supervised: only the answer is missing
    assert "a blank answer" in view
    healthy, _ = diagnose_data(demo.llama, plain_prompt_completion(tmp_path / "healthy.jsonl"))
    assert healthy["data.labels"].verdict == "pass" and healthy["data.labels"].evidence["blank_answer"]["count"] == 0


def test_blank_assistant_messages_fail_labels_and_one_in_two_hundred_warns(demo, chat_data, tmp_path):
    rows = list(chat_rows(40))
    for r in rows:
        blank(r, "messages")
    data = tmp_path / "blank-messages.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    found, _ = diagnose_data(demo.llama, data)
    labels = found["data.labels"]
    assert labels.verdict == "fail" and labels.evidence["blank_answer"]["count"] == 40, labels.detail
    # whole-sequence loss: the answer region is the blank content, the end of turn and its newline
    assert labels.evidence["blank_answer_example"]["tokens"] == ["Ġ", "Ċ", "<|im_end|>", "Ċ"]
    assert "all it supervises is the template's end of turn (<|im_end|>)" in labels.detail
    assert "any(m['content'].strip() for m in row['messages'] if m['role'] == 'assistant')" in labels.fix
    # the same rows as prompt/completion conversations, completion-only loss
    pc = tmp_path / "blank-pc.jsonl"
    pc.write_text("".join(json.dumps({"prompt": r["messages"][:-1], "completion": r["messages"][-1:]}) + "\n"
                          for r in rows))
    found, _ = diagnose_data(demo.llama, pc)
    assert found["data.labels"].verdict == "fail" and found["data.labels"].evidence["blank_answer"]["count"] == 40
    assert "row['completion']" in found["data.labels"].fix
    # one blank answer in 200 rows: below FAIL_SHARE, a warn naming it; the healthy demo data stays info
    rows = list(chat_rows(200))
    blank(rows[123], "messages")
    one = tmp_path / "one-blank.jsonl"
    one.write_text("".join(json.dumps(r) + "\n" for r in rows))
    found, _ = diagnose_data(demo.llama, one)
    labels = found["data.labels"]
    assert labels.verdict == "warn" and labels.evidence["blank_answer"] == {"count": 1, "rows": [123]}
    assert "1 row(s) with a blank answer" in labels.title and "rows 123" in labels.fix
    healthy, _ = diagnose_data(demo.llama, chat_data)
    assert healthy["data.labels"].verdict == "info" and healthy["data.labels"].evidence["blank_answer"]["count"] == 0


def test_blank_completions_in_a_real_sft_trainer_fail_labels(demo, tmp_path):
    data = tmp_path / "blank-pc.jsonl"
    data.write_text("".join(json.dumps({"prompt": r["messages"][:-1], "completion": [
        {"role": "assistant", "content": ""}]}) + "\n" for r in chat_rows(8)))
    found, _ = diagnose_data(demo.llama, data, setup="data_setups:sft_trainer")
    labels = found["data.labels"]
    assert labels.evidence["built_by"] == "trainer" and labels.verdict == "fail", labels.detail
    assert labels.evidence["blank_answer"]["count"] == 8


# --- answers lost to max_length: data.labels and data.truncation agree --------------------------------------------
@pytest.mark.parametrize("shape", ["messages", "prompt-completion"])
def test_answers_lost_to_max_length_are_deferred_to_truncation(demo, tmp_path, shape):
    rows = list(chat_rows(20))
    data = tmp_path / f"{shape}.jsonl"
    data.write_text("".join(json.dumps(r if shape == "messages" else {
        "prompt": r["messages"][:-1], "completion": r["messages"][-1:]}) + "\n" for r in rows))
    found, _ = diagnose_data(demo.llama, data, params={"max_length": 24})
    labels, truncation = found["data.labels"], found["data.truncation"]
    lost = truncation.evidence["answer_lost"]
    assert truncation.verdict == "fail" and lost["count"] > 0
    # the same rows, counted by both; data.labels does not claim that every row supervises its answer
    assert labels.evidence["answer_lost"] == lost, (labels.evidence["answer_lost"], lost)
    assert labels.verdict == "info" and "lost their answer to max_length" in labels.title, labels.title
    assert "data.truncation reports them" in labels.detail and str(lost["rows"][0]) in labels.detail
    assert "Every row supervises its answer" not in labels.title
    if shape == "prompt-completion":  # completion-only: trl drops the rows left with nothing supervised
        assert "trl drops" in labels.detail and labels.evidence["nothing_supervised"]["count"] == 0


# --- EOS missing in some rows, rows cut with their answers nearly all whole: warns naming the rows -------------------
def test_pre_tokenized_answers_without_their_end_of_turn_warn_eos_naming_the_rows(demo, tmp_path):
    # a preprocessing script that masks the prompt and, for two rows, tokenized the conversation with
    # continue_final_message=True: those answers never end with <|im_end|>
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(demo.llama)

    def tokenized(name, unfinished):
        rows = []
        for index, r in enumerate(chat_rows(20)):
            prompt = list(tokenizer.apply_chat_template(r["messages"][:-1], tokenize=True, return_dict=True,
                                                        add_generation_prompt=True)["input_ids"])
            ids = list(tokenizer.apply_chat_template(r["messages"], tokenize=True, return_dict=True,
                                                     continue_final_message=index in unfinished)["input_ids"])
            rows.append({"input_ids": ids, "labels": [-100] * len(prompt) + ids[len(prompt):]})
        path = tmp_path / name
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return path

    found, view = diagnose_data(demo.llama, tokenized("tokenized.jsonl", {4, 13}))
    eos = found["data.eos"]
    assert eos.verdict == "warn" and eos.title == "EOS supervised in 90.0 % of uncut rows", eos
    assert eos.evidence["eos_unsupervised"] == {"count": 2, "rows": [4, 13]}
    assert (eos.evidence["eligible_rows"], eos.evidence["eos_supervised_rows"]) == (20, 18)
    assert "rows 4, 13" in eos.detail and "rows 4, 13 of tokenized.jsonl" in eos.fix and "<|im_end|>" in eos.fix
    assert "the end-of-turn / EOS token is not a supervised label" in view
    healthy, _ = diagnose_data(demo.llama, tokenized("finished.jsonl", set()))
    assert healthy["data.eos"].verdict == "pass", healthy["data.eos"].detail


def test_one_long_answer_in_two_hundred_rows_warns_truncation_naming_it(demo, chat_data, tmp_path):
    rows = list(chat_rows(200))
    rows[57]["messages"][-1]["content"] = " ".join(["word"] * 400)  # one answer far past max_length
    data = tmp_path / "one-long.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    found, _ = diagnose_data(demo.llama, data, params={"max_length": 256})
    trunc = found["data.truncation"]
    # 0.5 % of the answers cut, none lost: below the share that fails, a warn naming the row
    assert trunc.verdict == "warn" and trunc.title == "1 row(s) cut by max_length 256", trunc
    assert trunc.evidence["truncated"] == trunc.evidence["answer_cut"] == {"count": 1, "rows": [57]}
    assert trunc.evidence["answer_lost"]["count"] == 0 and trunc.evidence["lengths"]["max"] > 256
    assert "rows 57; 1 answer(s) cut" in trunc.detail
    assert "rows 57 of one-long.jsonl" in trunc.fix and f"max {trunc.evidence['lengths']['max']}" in trunc.fix
    assert found["data.eos"].verdict == "pass"  # the cut row has no EOS to judge; every other row supervises it
    healthy, _ = diagnose_data(demo.llama, chat_data, params={"max_length": 256})
    assert healthy["data.truncation"].verdict == "pass"
