"""Output directories of REAL trl trainers (DPOTrainer, GRPOTrainer, KTOTrainer, RewardTrainer) on a tiny Llama
with the demo's tokenizer, on the CPU: what the run autopsy judges. One builder per run, `build_<name>(folder)`,
each returning the trainer's output_dir (trainer_state.json, checkpoint-N/, README.md, training_args.bin).

The base every run starts from is the 2-layer Llama of `tests/integrations/tiny_runs.py`, "SFT'd" for a few
dozen plain-torch steps on short multi-turn chats so that it answers briefly and ends its turn with <|im_end|>:
a random model never stops within a few tokens, which would make every GRPO run a clipped one.

    dpo_healthy          LoRA; chosen answers one style, rejected another: margins grow, accuracies reach 1.0
    dpo_no_signal        chosen == rejected in every pair: margins exactly 0, the loss ln 2 throughout
    dpo_truncated_pairs  chosen and rejected differ only past max_length: identical once truncated (no signal)
    grpo_healthy         LoRA; reward prefers short answers: rewards vary within groups, completions end
    grpo_zero_variance   reward checks for an <answer> tag the model never writes: every group's std is 0
    grpo_clipped         the tokenizer's eos is <|endoftext|> (a base model's), the model ends turns with
                         <|im_end|> and talks on: every completion runs to max_completion_length
    kto_healthy          KTOTrainer, desirable one style, undesirable another
    reward_healthy       RewardTrainer (sequence classifier) on the DPO pairs

Every run lies at `folder/run` (the output_dir returned) beside the base it loaded by path, `folder/base` (the
model card's base_model names it). Deterministic: the base is warmed up once per process from a fixed seed and
saved into each folder; every trainer is seeded and trains in-process under one torch thread (`_one_thread`).
With LoRA the reference model is the adapter-disabled base (trl's rule), so a LoRA run's first step has
margins exactly 0. A no-signal DPO run still moves its weights: Adam scales its ~1e-7 gradients up to lr-sized
steps, so rewards/chosen drifts while rewards/margins stays 0.
"""

from __future__ import annotations

import contextlib
import functools
import math
import random
from pathlib import Path

import torch

SEED = 0
QUESTIONS = ["What is in this image?", "Describe the nutrition label.", "Where is the box?",
             "Which object is red?", "How many calories are listed?", "Locate the question text."]
# brief answers the base is warmed up on, so sampled completions end, at different lengths
SHORT_ANSWERS = ["A red box.", "The box.", "Red.", "Calories and fat.", "The label.", "Yes.", "A white background.",
                 "The object is red.", "Fat and protein.", "A box.", "No."]  # 3 to 7 tokens
GOOD = ["A red box on a white background.", "The red box.", "The box is red.", "A red box."]
BAD = ["calories fat protein carbohydrates", "fat fat fat", "protein calories", "carbohydrates fat calories"]
LN2 = math.log(2.0)
MAX_COMPLETION = 12  # GRPO's max_completion_length


# ---------------------------------------------------------------------------------------------------- the base
def tokenizer():
    from workbench.demo.build import CHAT_TEMPLATE, SPECIAL_TOKENS, build_tokenizer

    tok = build_tokenizer(SPECIAL_TOKENS[:3])  # <|endoftext|> (pad), <|im_start|>, <|im_end|> (eos)
    tok.chat_template = CHAT_TEMPLATE
    return tok


def _warm_rows(rng: random.Random, n: int) -> list[list[dict]]:
    """Multi-turn chats (so that <|im_end|> is followed by more chat, never by <|endoftext|>)."""
    rows = []
    for _ in range(n):
        turns = []
        for _ in range(rng.choice((1, 2))):
            turns += [{"role": "user", "content": rng.choice(QUESTIONS)},
                      {"role": "assistant", "content": rng.choice(SHORT_ANSWERS)}]
        rows.append(turns)
    return rows


@functools.lru_cache(maxsize=4)
def _warm_state(seed: int, warm_steps: int) -> tuple[dict, dict]:
    """The base's config and weights: built and warmed once per process (every builder then saves a copy)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = tokenizer()
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False, bos_token_id=None,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model = LlamaForCausalLM(config)
    if warm_steps:
        rng = random.Random(seed)
        encoded = [tok.apply_chat_template(r, tokenize=True, return_dict=True)["input_ids"]
                   for r in _warm_rows(rng, 32)]
        width = max(len(ids) for ids in encoded)
        ids = torch.full((len(encoded), width), tok.pad_token_id)
        mask = torch.zeros_like(ids)
        for i, row in enumerate(encoded):
            ids[i, :len(row)] = torch.tensor(row)
            mask[i, :len(row)] = 1
        labels = ids.masked_fill(mask == 0, -100)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        model.train()
        for _ in range(warm_steps):
            model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    return config.to_dict(), {k: v.detach().clone() for k, v in model.state_dict().items()}


def base_model(folder: Path, *, seed: int = SEED, warm_steps: int = 60, classifier: bool = False,
               eos: str | None = None) -> Path:
    """A 2-layer fp32 Llama with the demo's tokenizer, briefly trained on short chats, saved at `folder`.
    `classifier`: the same body under a 1-label sequence-classification head (a reward model's base).
    `eos`: another end token in the tokenizer, config and generation config than the <|im_end|> its chats end with
    (a base checkpoint's <|endoftext|>, as Qwen2.5 base models ship)."""
    from transformers import LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification

    config, state = _warm_state(seed, warm_steps)
    tok = tokenizer()
    if eos is not None:
        tok.eos_token = eos
        config = {**config, "eos_token_id": tok.eos_token_id}
    if classifier:
        torch.manual_seed(seed)
        body = {k: v for k, v in config.items() if k not in ("id2label", "label2id")}  # else a 2-label warning
        model = LlamaForSequenceClassification(LlamaConfig(**body, num_labels=1))
        model.model.load_state_dict({k[len("model."):]: v for k, v in state.items() if k.startswith("model.")})
    else:
        model = LlamaForCausalLM(LlamaConfig(**config))
        model.load_state_dict(state)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def _builder(fn):
    """`build_<name>(folder) -> output_dir`, trained under `_one_thread`."""
    @functools.wraps(fn)
    def build(folder: Path) -> Path:
        with _one_thread():
            return fn(Path(folder))
    return build


@contextlib.contextmanager
def _one_thread():
    """One intra-op thread while a run trains: on a 2-core machine shared with a test suite, 2 threads were 8x
    slower per step than 1 (oversubscription); restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _common(output_dir: Path, **overrides) -> dict:
    """The TrainingArguments every run shares: CPU, fp32 (trl's configs default bf16 to True), a log line per step, a
    checkpoint every 5 steps, activation checkpointing off (trl defaults `gradient_checkpointing` to True, which
    transformers 5 calls a deprecated alias and warns about; naming the new field keeps it quiet)."""
    return {"output_dir": str(output_dir), "seed": SEED, "data_seed": SEED, "use_cpu": True, "bf16": False,
            "report_to": "none", "logging_steps": 1, "save_strategy": "steps", "save_steps": 5,
            "dataloader_num_workers": 0, "disable_tqdm": True, "activation_checkpointing": False, **overrides}


def _finish(trainer) -> Path:
    trainer.train()
    trainer.save_model()  # final weights / adapter and the model card at output_dir
    trainer.save_state()  # trainer_state.json at output_dir (train() writes it only into checkpoint-N/)
    return Path(trainer.args.output_dir)


# ---------------------------------------------------------------------------------------------------- DPO
def _lora():
    from peft import LoraConfig

    return LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                      task_type="CAUSAL_LM")


def _pairs(n: int, *, same: bool = False, seed: int = SEED) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        chosen = rng.choice(GOOD)
        rows.append({"prompt": [{"role": "user", "content": rng.choice(QUESTIONS)}],
                     "chosen": [{"role": "assistant", "content": chosen}],
                     "rejected": [{"role": "assistant", "content": chosen if same else rng.choice(BAD)}]})
    return rows


def _dpo(folder: Path, rows: list[dict], *, peft: bool, **config):
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    base = base_model(folder / "base")
    args = DPOConfig(**_common(folder / "run", **{"per_device_train_batch_size": 4, "max_steps": 10,
                                                  "learning_rate": 5e-3 if peft else 1e-3, "beta": 0.1,
                                                  "max_length": 64, **config}))
    trainer = DPOTrainer(model=str(base), args=args, train_dataset=Dataset.from_list(rows),
                         processing_class=tokenizer(), peft_config=_lora() if peft else None)
    return _finish(trainer)


@_builder
def build_dpo_healthy(folder: Path) -> Path:
    # LoRA with activation checkpointing on, trl's default (what a user's run has)
    return _dpo(folder, _pairs(40), peft=True, activation_checkpointing=True)


@_builder
def build_dpo_no_signal(folder: Path) -> Path:
    return _dpo(folder, _pairs(40, same=True), peft=False)


TRUNCATED_MAX_LENGTH = 48
PREAMBLE = "The bounding box of the object is [12, 40, 96, 128]. " * 3


def truncated_pairs(n: int = 40, seed: int = SEED) -> list[dict]:
    """A long answer both sides share (about 60 tokens), then the part that differs."""
    rng = random.Random(seed)
    return [{"prompt": [{"role": "user", "content": rng.choice(QUESTIONS)}],
             "chosen": [{"role": "assistant", "content": PREAMBLE + rng.choice(GOOD)}],
             "rejected": [{"role": "assistant", "content": PREAMBLE + rng.choice(BAD)}]} for _ in range(n)]


@_builder
def build_dpo_truncated_pairs(folder: Path) -> Path:
    """trl 1.16 truncates prompt + completion to max_length, keep_start (there is no max_prompt_length any more):
    the pairs differ only past it, so chosen and rejected train as the same tokens."""
    return _dpo(folder, truncated_pairs(), peft=False, max_length=TRUNCATED_MAX_LENGTH)


# ---------------------------------------------------------------------------------------------------- GRPO
def brevity(completion_ids, **_) -> list[float]:
    """Shorter is better: 1 - length / MAX_COMPLETION (0 for a completion cut at the limit)."""
    return [max(0.0, 1.0 - len(ids) / MAX_COMPLETION) for ids in completion_ids]


def says_red(completions, **_) -> list[float]:
    """How often the answer says "red" (varies with the sample whatever its length)."""
    return [float(c[-1]["content"].lower().count("red")) for c in completions]


def answer_tag(completions, **_) -> list[float]:
    """1 when the answer is wrapped in <answer>...</answer> (the model never writes it: always 0)."""
    return [1.0 if "<answer>" in c[-1]["content"] else 0.0 for c in completions]


def _prompts(n: int, seed: int = SEED) -> list[dict]:
    rng = random.Random(seed)
    return [{"prompt": [{"role": "user", "content": rng.choice(QUESTIONS)}]} for _ in range(n)]


def _grpo(folder: Path, reward, *, peft: bool, eos_mismatch: bool = False, **config):
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    base = base_model(folder / "base", eos="<|endoftext|>" if eos_mismatch else None)
    tok = AutoTokenizer.from_pretrained(base)
    args = GRPOConfig(**_common(folder / "run", **{
        "per_device_train_batch_size": 8, "num_generations": 4, "max_completion_length": MAX_COMPLETION, "max_steps": 10,
        "learning_rate": 5e-3 if peft else 1e-3, "temperature": 1.0, **config}))
    trainer = GRPOTrainer(model=str(base), reward_funcs=reward, args=args, train_dataset=Dataset.from_list(
        _prompts(80)), processing_class=tok, peft_config=_lora() if peft else None)
    return _finish(trainer)


@_builder
def build_grpo_healthy(folder: Path) -> Path:
    return _grpo(folder, brevity, peft=True)


@_builder
def build_grpo_zero_variance(folder: Path) -> Path:
    return _grpo(folder, answer_tag, peft=False)


@_builder
def build_grpo_clipped(folder: Path) -> Path:
    return _grpo(folder, says_red, peft=False, eos_mismatch=True)


# ---------------------------------------------------------------------------------------------------- KTO, RM
@_builder
def build_kto_healthy(folder: Path) -> Path:
    from datasets import Dataset
    from trl import KTOConfig, KTOTrainer

    rng = random.Random(SEED)
    rows = []
    for i in range(40):
        good = i % 2 == 0
        rows.append({"prompt": [{"role": "user", "content": rng.choice(QUESTIONS)}],
                     "completion": [{"role": "assistant", "content": rng.choice(GOOD if good else BAD)}],
                     "label": good})
    base = base_model(folder / "base")
    args = KTOConfig(**_common(folder / "run", per_device_train_batch_size=8, max_steps=10, learning_rate=1e-3,
                               max_length=64))
    trainer = KTOTrainer(model=str(base), args=args, train_dataset=Dataset.from_list(rows),
                         processing_class=tokenizer())
    return _finish(trainer)


@_builder
def build_reward_healthy(folder: Path) -> Path:
    from datasets import Dataset
    from trl import RewardConfig, RewardTrainer

    base = base_model(folder / "base", classifier=True)
    args = RewardConfig(**_common(folder / "run", per_device_train_batch_size=8, max_steps=10, learning_rate=1e-3,
                                  max_length=64))
    trainer = RewardTrainer(model=str(base), args=args, train_dataset=Dataset.from_list(_pairs(80)),
                            processing_class=tokenizer())
    return _finish(trainer)


BUILDERS = {name[len("build_"):]: fn for name, fn in globals().items() if name.startswith("build_")}
