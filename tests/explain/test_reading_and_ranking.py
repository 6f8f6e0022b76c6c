"""Reading pasted text as it comes (ANSI colours, torchrun prefixes, DataParallel's re-raise, logs streamed in
blocks) and ranking the causes by the clues it holds."""

import io
import json

from workbench.explain import reading
from workbench.explain.ranking import explain_text
from workbench.explain.symptoms import load_symptoms

DP_CRASH = """\x1b[31m[rank0]: Traceback (most recent call last):\x1b[0m
[rank0]:   File "/home/me/scripts/train_recipe.py", line 412, in <module>
[rank0]:     trainer.train()
[rank0]:   File "/opt/conda/lib/python3.11/site-packages/transformers/trainer.py", line 3736, in training_step
[rank0]:     loss = self.compute_loss(model, inputs)
[rank0]:   File "/opt/conda/lib/python3.11/site-packages/torch/nn/parallel/data_parallel.py", line 193, in forward
[rank0]:     outputs = self.parallel_apply(replicas, inputs, module_kwargs)
[rank0]: RuntimeError: Caught RuntimeError in replica 0 on device 0.
[rank0]: Original Traceback (most recent call last):
[rank0]:   File "/opt/conda/lib/python3.11/site-packages/torch/nn/parallel/parallel_apply.py", line 96, in _worker
[rank0]:     output = module(*input, **kwargs)
[rank0]:   File "/opt/conda/lib/python3.11/site-packages/transformers/models/qwen2_vl/modeling_qwen2_vl.py", line 1404, in forward
[rank0]:     logits = self.lm_head(hidden_states)
[rank0]:   File "/opt/conda/lib/python3.11/site-packages/torch/nn/modules/linear.py", line 125, in forward
[rank0]:     return F.linear(input, self.weight, self.bias)
[rank0]: RuntimeError: expected mat1 and mat2 to have the same dtype, but got: float != c10::BFloat16
"""

ISLAND_CRASH = """Traceback (most recent call last):
  File "/work/eval.py", line 40, in <module>
    out = model.generate(**batch, max_new_tokens=64)
  File "/usr/lib/python3.10/site-packages/transformers/generation/utils.py", line 2215, in generate
    result = self._sample(
  File "/usr/lib/python3.10/site-packages/transformers/models/llama/modeling_llama.py", line 1190, in forward
    logits = self.lm_head(hidden_states)
RuntimeError: expected mat1 and mat2 to have the same dtype, but got: float != c10::BFloat16
"""


def test_ansi_colours_rank_prefixes_and_progress_bars_are_cleaned():
    assert reading.clean("\x1b[1;31m[rank3]: [rank3]: boom\x1b[0m\r  5%|#") == "boom\n  5%|#"
    assert reading.clean("[default1]:File x") == "File x"


def test_the_symptom_names_the_module_family_library_and_the_users_script():
    expl = explain_text(DP_CRASH)
    d = expl.as_dict()["symptom"]
    assert d["id"] == "dtype.linear_operands" and d["module"] == "lm_head" and d["family"] == "qwen2_vl"
    assert d["script"] == "/home/me/scripts/train_recipe.py" and d["library"] == "torch"
    assert "float != c10::BFloat16" in d["message"]


def test_dataparallel_frames_rank_the_replica_first_and_the_fix_names_the_users_script():
    expl = explain_text(DP_CRASH)
    top = expl.causes[0]
    assert top.cause.id == "dataparallel_replica" and top.cause.checks == ("parallel.trainer_wrap",)
    assert any("data_parallel.py" in why for why in top.why)
    assert "/home/me/scripts/train_recipe.py" in top.fix and "<script>" not in top.fix
    assert top.score > expl.causes[1].score


def test_the_same_error_in_generate_without_dataparallel_ranks_an_fp32_island_first():
    expl = explain_text(ISLAND_CRASH)
    assert expl.symptom.id == "dtype.linear_operands"
    assert expl.causes[0].cause.id != "dataparallel_replica"
    assert next(c for c in expl.causes if c.cause.id == "dataparallel_replica").score < expl.causes[0].score


def test_the_exception_that_ended_the_run_leads_and_earlier_warnings_are_listed_too():
    text = ("`use_cache=True` is incompatible with gradient checkpointing. Setting `use_cache=False`.\n"
            + ISLAND_CRASH)
    expl = explain_text(text)
    assert expl.symptom.id == "dtype.linear_operands"
    assert [s.symptom.id for s in expl.also] == ["grad.use_cache_checkpointing"]


def test_a_trainer_log_with_a_nan_logged_as_zero_is_the_hidden_nan_symptom():
    log = "".join(f"{{'loss': {v}, 'grad_norm': {g}, 'learning_rate': 2e-05, 'epoch': {i / 10}}}\n"
                  for i, (v, g) in enumerate([(2.31, 1.2), (1.9, 0.8), (0.0, "nan"), (0.0, "nan")]))
    expl = explain_text("  3%|▎  | 30/1000 [00:10<05:00]\n" + log)
    assert expl.symptom.id == "logs.hidden_nan"
    assert expl.as_dict()["symptom"]["metrics"]["grad_norm"]["nan"] == 2


def test_trainer_state_json_is_read_as_the_run_log():
    state = {"log_history": [{"loss": 0.0, "grad_norm": float("nan"), "step": 10},
                             {"loss": 0.0, "grad_norm": float("nan"), "step": 20}]}
    expl = explain_text(json.dumps(state))
    assert expl.symptom is not None and expl.symptom.id == "logs.hidden_nan"


def test_a_log_streamed_in_small_blocks_reads_as_the_whole_text(monkeypatch):
    filler = "".join(f"step {i}: fine, nothing to see here\n" for i in range(20000))
    text = "transformers==4.46.0\n" + filler + DP_CRASH + filler
    monkeypatch.setattr(reading, "BLOCK_CHARS", 4096)  # the traceback straddles blocks
    streamed = reading.read_text(io.BytesIO(text.encode()), load_symptoms())
    whole = reading.read_text(text, load_symptoms())
    assert [h.symptom_id for h in streamed.hits] == [h.symptom_id for h in whole.hits]
    s, w = streamed.hits[0], whole.hits[0]
    assert (s.line_number, s.line, s.fields()) == (w.line_number, w.line, w.fields())
    assert [str(f) for f in s.frames] == [str(f) for f in w.frames] and len(s.frames) >= 4
    assert streamed.versions == {"transformers": "4.46.0"} and streamed.lines == whole.lines


def test_unknown_text_gets_no_cause_and_the_nearest_symptoms():
    expl = explain_text("ValueError: the widget frobnicated the padding token of the tokenizer\n")
    assert expl.symptom is None and expl.causes == []
    assert expl.nearest and expl.as_dict()["nearest"][0]["id"]
    assert "No known symptom" in str(expl)


def test_versions_stated_by_transformers_env_feed_version_clues():
    text = ("- `transformers` version: 4.46.1\n- PyTorch version (GPU?): 2.4.0+cu121 (True)\n"
            "{'loss': 31.5, 'grad_norm': 3.1, 'learning_rate': 1e-05, 'epoch': 0.01}\n")
    expl = explain_text(text)
    assert expl.reading.versions == {"transformers": "4.46.1", "torch": "2.4.0"}
    assert expl.symptom.id == "logs.ga_inflated_loss"
    assert any("transformers 4.46.1" in why for why in expl.causes[0].why)


WINDOWS_CHAINED = ("Traceback (most recent call last):\n"
                   '  File "C:\\Users\\İlker\\train.py", line 40, in <module>\n    trainer.train()\n'
                   '  File "C:\\Python311\\Lib\\site-packages\\torch\\nn\\parallel\\data_parallel.py", line 193, '
                   "in forward\n    outputs = self.parallel_apply(replicas, inputs, module_kwargs)\n"
                   '  File "C:\\Python311\\Lib\\site-packages\\transformers\\models\\llama\\modeling_llama.py", '
                   "line 1190, in forward\n    logits = self.lm_head(hidden_states)\n"
                   "RuntimeError: expected mat1 and mat2 to have the same dtype, but got: float != c10::BFloat16\n\n"
                   "During handling of the above exception, another exception occurred:\n\n"
                   "Traceback (most recent call last):\n"
                   '  File "/x/site-packages/wandb/sdk/wandb_run.py", line 2000, in finish\n    self.run.finish()\n'
                   "KeyError: 'x'\n" + "İstanbul, a line whose lowercase is longer\n" * 30)

IPYTHON = """---------------------------------------------------------------------------
RuntimeError                              Traceback (most recent call last)
Cell In[3], line 3
----> 3 out = model(**batch)
File ~/venv/lib/python3.11/site-packages/transformers/models/llama/modeling_llama.py:1190, in LlamaForCausalLM.forward(self)
   1189 hidden_states = outputs[0]
-> 1190 logits = self.lm_head(hidden_states)
RuntimeError: expected mat1 and mat2 to have the same dtype, but got: float != c10::BFloat16
"""


def test_windows_paths_a_chained_exception_and_letters_whose_lowercase_is_longer():
    import subprocess
    import sys

    code = ("import sys, json; from workbench.explain.ranking import explain_text; "
            "print(json.dumps(explain_text(sys.stdin.read()).as_dict(), allow_nan=False))")
    # a subprocess with a timeout: a gate that does not advance would loop forever
    result = subprocess.run([sys.executable, "-c", code], input=WINDOWS_CHAINED, capture_output=True, text=True,
                            timeout=120)
    data = json.loads(result.stdout)
    s = data["symptom"]
    assert (s["library"], s["family"], s["module"]) == ("transformers", "llama", "lm_head")  # not wandb's frame
    assert s["script"] == "C:/Users/İlker/train.py"
    assert data["causes"][0]["id"].endswith("dataparallel_replica")


def test_ipython_tracebacks_give_frames_and_the_failing_line():
    d = explain_text(IPYTHON).as_dict()["symptom"]
    assert (d["family"], d["module"], d["library"]) == ("llama", "lm_head", "transformers")


def test_an_earlier_traceback_lends_no_frames_to_a_later_error():
    first = ('Traceback (most recent call last):\n  File "/home/me/old_script.py", line 3, in <module>\n    f()\n'
             "RuntimeError: element 0 of tensors does not require grad and does not have a grad_fn\n")
    expl = explain_text(first + ISLAND_CRASH)
    assert expl.symptom.id == "dtype.linear_operands"
    assert all("old_script" not in f for f in expl.as_dict()["symptom"]["frames"])


def test_json_of_a_nan_log_is_strict_json():
    log = "".join(f"{{'loss': {v}, 'grad_norm': nan, 'learning_rate': 1e-05}}\n" for v in (0.0, 0.0, 0.0))
    text = json.dumps(explain_text(log).as_dict(), allow_nan=False)
    assert '"nan"' in text
