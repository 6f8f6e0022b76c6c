"""The four fine-tuning recipes of the demo's write-up (docs/demo.md), trained for real on the CPU from the demo's tiny Qwen2-VL.

    grounding-base   the demo base taught the answer format: language model + lm_head fully trained on answers
                     shuffled between images, so it writes boxes but does not find them (a full checkpoint)
    r1-llm-only      LoRA on the language model (q/k/v/o/gate/up/down)
    r2-vision-only   LoRA on the vision tower (the blocks' qkv/proj/fc1/fc2 and the merger's MLP)
    r3-stage1        full fine-tune of the vision tower (a full checkpoint)
    r3-stage2        LoRA on the language model trained on r3-stage1: its adapter_config.json names r3-stage1
    r4-joint         LoRA on the vision tower and the language model together

Why a format base: the write-up's recipes started from Qwen2-VL-7B-Instruct, which already writes boxes (their base
scored 0.098 mean IoU). The demo base is random: its lm_head rows are so small that no hidden state gives a token
more than a ~2.5 logit margin, and its language model carries no answer format, so a recipe that adapts only the
vision tower could never learn to answer. `grounding-base` plays the instruct model's part: fluent in the format,
blind to the box (it gives about the same box whatever the image). Every recipe trains on it, records it (or
r3-stage1) as its base the way PEFT records it, and changes only the modules its name says.

Vision-only adaptation learns more slowly here than language-side adaptation (the base's language model was
trained to look past the image), so r2 trains three times as many steps; stage 1, a full fine-tune, uses a tenth of the
LoRA learning rate. Each recipe's description says what it trained.

A plain torch loop rather than `transformers.Trainer`: these are demo fixtures built inside a test session's
budget (about a minute on 2 cores: 1,150 steps of 16 samples), the Trainer's per-step machinery costs more than the
tiny model's step, and nothing here is about the Trainer. Deterministic: fixed seeds for the data, the LoRA initialization and
the batch order. A finished build is reused while its stamp (settings, base, library versions) matches.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from pathlib import Path
from typing import Callable

from workbench.model.vlm_batches import collate_teacher_forced, teacher_forced_inputs
from workbench.tasks.grounding import GroundingRow, read_dataset, write_dataset

RECIPES_VERSION = "2"
LLM_TARGETS = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"
VISION_TARGETS = r".*visual\.(blocks\.\d+\.(attn\.qkv|attn\.proj|mlp\.fc1|mlp\.fc2)|merger\.mlp\.(0|2))"
TRAIN_SEED, EVAL_SEED = 0, 1          # the splits are drawn with different seeds: no sample is in both
PROCESSOR_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "preprocessor_config.json")


@dataclasses.dataclass(frozen=True)
class TrainingSettings:
    """Split sizes and how each recipe trains (a recipe scales `steps` and `lr` by its own factors)."""

    train_samples: int = 128
    eval_samples: int = 48
    steps: int = 150
    batch_size: int = 16
    lr: float = 6e-3
    warmup_steps: int = 10
    lora_rank: int = 8
    seed: int = 0
    threads: int = 2


@dataclasses.dataclass(frozen=True)
class TrainingRecipe:
    """What one recipe trains: LoRA on the modules matching `lora_targets`, or every parameter under the `full`
    module prefixes. `on`: the recipe whose output is its base (None: the base given to `build_recipes`)."""

    name: str
    description: str
    lora_targets: str | None = None
    full: tuple[str, ...] = ()
    on: str | None = None
    shuffled_answers: bool = False
    steps_scale: float = 1.0
    lr_scale: float = 1.0


FORMAT_BASE = TrainingRecipe("grounding-base", "the demo base taught the answer format: language model + lm_head, fully, "
                     "on shuffled answers", full=("model.language_model.", "lm_head."), shuffled_answers=True,
                     steps_scale=2 / 3)
RECIPES = (
    TrainingRecipe("r1-llm-only", "LoRA on the language model", lora_targets=LLM_TARGETS, on=FORMAT_BASE.name),
    TrainingRecipe("r2-vision-only", "LoRA on the vision tower", lora_targets=VISION_TARGETS, on=FORMAT_BASE.name,
           steps_scale=3),
    TrainingRecipe("r3-stage1", "full fine-tune of the vision tower", full=("model.visual.",), on=FORMAT_BASE.name,
           lr_scale=0.1),
    TrainingRecipe("r3-stage2", "LoRA on the language model, on r3-stage1", lora_targets=LLM_TARGETS, on="r3-stage1"),
    TrainingRecipe("r4-joint", "LoRA on the vision tower and the language model", lora_targets=f"({VISION_TARGETS})|({LLM_TARGETS})",
           on=FORMAT_BASE.name),
)


def write_splits(folder: Path, settings: TrainingSettings) -> dict[str, Path]:
    """grounding-train and grounding-eval under `folder` (kept when already written with the same size)."""
    paths = {}
    for name, n, seed in (("grounding-train", settings.train_samples, TRAIN_SEED),
                          ("grounding-eval", settings.eval_samples, EVAL_SEED)):
        paths[name] = folder / name
        data = paths[name] / "data.jsonl"
        if not data.exists() or len(data.read_text().splitlines()) != n:
            write_dataset(paths[name], n, seed)
    return paths


def shuffled(rows: list[GroundingRow]) -> list[GroundingRow]:
    """Each image with the next row's answer: answers that say nothing about their images."""
    return [dataclasses.replace(row, answer=rows[(i + 1) % len(rows)].answer, box=rows[(i + 1) % len(rows)].box)
            for i, row in enumerate(rows)]


def _load_for_training(base: Path, recipe: TrainingRecipe, settings: TrainingSettings):
    """The base in fp32 with exactly the recipe's parameters trainable (a PeftModel for LoRA recipes)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2VLForConditionalGeneration

    torch.manual_seed(settings.seed)
    model = Qwen2VLForConditionalGeneration.from_pretrained(str(base), dtype=torch.float32)
    if recipe.lora_targets:
        config = LoraConfig(r=settings.lora_rank, lora_alpha=2 * settings.lora_rank, lora_dropout=0.0,
                            target_modules=recipe.lora_targets, task_type="CAUSAL_LM")
        return get_peft_model(model, config)      # records `base` as base_model_name_or_path
    for name, parameter in model.named_parameters():
        parameter.requires_grad = name.startswith(recipe.full)
    return model


def train(model, rows: list[GroundingRow], tokenizer, image_processor, settings: TrainingSettings) -> list[float]:
    """AdamW on the trainable parameters, linear warm-up then linear decay, batches drawn with a fixed seed;
    the loss is the reference answer's (prompt tokens masked). Returns every step's loss."""
    import torch

    examples = [teacher_forced_inputs(tokenizer, image_processor, r.image, r.question, r.answer) for r in rows]
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=settings.lr,
                                  weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / settings.warmup_steps) * (1 - step / settings.steps))
    order = torch.Generator().manual_seed(settings.seed)
    losses = []
    model.train()
    for _ in range(settings.steps):
        picked = torch.randint(0, len(examples), (settings.batch_size,), generator=order).tolist()
        loss = model(**collate_teacher_forced([examples[i] for i in picked], tokenizer.pad_token_id)).loss
        loss.backward()
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss))
    model.eval()
    return losses


def _save(model, recipe: TrainingRecipe, base: Path, folder: Path) -> None:
    """An adapter folder (LoRA recipes) or a full bf16 checkpoint (the base's dtype), with the base's tokenizer
    and image processor beside it."""
    import torch

    if folder.exists():
        shutil.rmtree(folder)
    if recipe.lora_targets:
        model.save_pretrained(str(folder))
    else:
        model.to(torch.bfloat16).save_pretrained(str(folder))
    for name in PROCESSOR_FILES:
        if (base / name).exists():
            shutil.copy2(base / name, folder / name)


def train_recipe(recipe: TrainingRecipe, base: Path, rows: list[GroundingRow], folder: Path,
                 settings: TrainingSettings = TrainingSettings(), log: Callable[[str], object] = print) -> Path:
    """Train one recipe on `base` with the training rows and save it into `folder`."""
    from workbench.model.inputs import load_vlm_parts

    start = time.perf_counter()
    tokenizer, image_processor = load_vlm_parts(base)
    settings = dataclasses.replace(settings, steps=round(settings.steps * recipe.steps_scale),
                                   lr=settings.lr * recipe.lr_scale)
    model = _load_for_training(base, recipe, settings)
    losses = train(model, shuffled(rows) if recipe.shuffled_answers else rows, tokenizer, image_processor,
                   settings)
    _save(model, recipe, base, folder)
    tail = losses[-20:]
    log(f"  {recipe.name}: {recipe.description}; {settings.steps} steps at lr {settings.lr:g}, loss "
        f"{losses[0]:.3f} -> {sum(tail) / len(tail):.3f}, {time.perf_counter() - start:.1f} s")
    return folder


def _stamp(base_dir: Path, settings: TrainingSettings) -> str:
    import peft
    import torch
    import transformers

    weights = sorted(base_dir.glob("*.safetensors"))
    return json.dumps({"recipes": RECIPES_VERSION, "base": str(base_dir), "settings": dataclasses.asdict(settings),
                       "base_weights": [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in weights],
                       "torch": torch.__version__, "transformers": transformers.__version__,
                       "peft": peft.__version__}, sort_keys=True)


def _usable(rows: list[GroundingRow], log: Callable[[str], object]) -> list[GroundingRow]:
    bad = [r for r in rows if r.error]
    if bad:
        log(f"  {len(bad)} unreadable training rows left out (first: {bad[0].error})")
    return [r for r in rows if not r.error]


def build_recipes(base_dir: Path, out_dir: Path, *, dataset_dir: Path | None = None,
                  log: Callable[[str], object] = print, settings: TrainingSettings = TrainingSettings(),
                  force: bool = False) -> dict[str, Path]:
    """Write the grounding splits, train `grounding-base` from `base_dir`, then every recipe of `RECIPES`, into
    `out_dir`. Returns {name: folder} for grounding-train, grounding-eval, grounding-base and each recipe.
    `dataset_dir`: where the splits go (default `out_dir`). A build whose stamp matches is reused unless `force`.

        >>> paths = build_recipes(build_demo().qwen_base, Path(".cache/recipes"))   # doctest: +SKIP
        >>> sorted(paths)                                                           # doctest: +SKIP
        ['grounding-base', 'grounding-eval', 'grounding-train', 'r1-llm-only', 'r2-vision-only', ...]
    """
    import torch

    base_dir, out_dir = Path(base_dir).resolve(), Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = write_splits(Path(dataset_dir).resolve() if dataset_dir else out_dir, settings)
    names = [FORMAT_BASE.name, *(r.name for r in RECIPES)]
    paths.update({name: out_dir / name for name in names})
    stamp_file, stamp = out_dir / "RECIPES_STAMP.json", _stamp(base_dir, settings)
    if not force and stamp_file.exists() and stamp_file.read_text() == stamp:
        log(f"recipes reused from {out_dir}")
        return paths
    stamp_file.unlink(missing_ok=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(min(settings.threads, threads))  # never more than the process was given (OMP_NUM_THREADS)
    try:
        rows = _usable(read_dataset(paths["grounding-train"]), log)
        start = time.perf_counter()
        for recipe in (FORMAT_BASE, *RECIPES):
            base = paths[recipe.on] if recipe.on else base_dir
            train_recipe(recipe, base, rows, paths[recipe.name], settings, log)
        log(f"recipes trained in {time.perf_counter() - start:.1f} s")
    finally:
        torch.set_num_threads(threads)
    stamp_file.write_text(stamp)
    return paths
