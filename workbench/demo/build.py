"""The bundled demo: a two-stage Qwen2-VL fine-tune in miniature (docs/demo.md), built offline and deterministically.

    qwen2vl-base/      tiny Qwen2-VL, bf16, with a locally trained tokenizer and a Qwen2-VL processor
    qwen2vl-stage1/    the base with its vision tower fine-tuned (full model, bf16)
    qwen2vl-stage2/    a LoRA adapter on the language layers whose adapter_config.json names stage 1 as its base
    llama-text/        a tiny Llama-family text model, saved in shards (not Qwen-only, and the index path)

Built into a git-ignored cache (`.cache/demo` in the repo, or $WORKBENCH_CACHE/demo) under a stamp; rebuilt
only when the builder's version or location changes. Takes a few seconds.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from workbench.demo.training import TrainingSettings

DEMO_VERSION = "2"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                  "<|image_pad|>", "<|video_pad|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "What is in this image? A red box on a white background.",
    "Describe the nutrition label: calories, fat, protein, carbohydrates.",
    "The bounding box of the object is [12, 40, 96, 128].",
    "Fine-tuning vision language models with LoRA adapters and 4-bit quantization.",
    "user assistant system image text answer question detect locate the box",
] * 4


@dataclasses.dataclass(frozen=True)
class DemoPaths:
    root: Path

    @property
    def qwen_base(self) -> Path:
        return self.root / "qwen2vl-base"

    @property
    def qwen_stage1(self) -> Path:
        return self.root / "qwen2vl-stage1"

    @property
    def qwen_stage2(self) -> Path:
        return self.root / "qwen2vl-stage2"

    @property
    def llama(self) -> Path:
        return self.root / "llama-text"


def default_demo_root() -> Path:
    if os.environ.get("WORKBENCH_CACHE"):
        return Path(os.environ["WORKBENCH_CACHE"]) / "demo"
    from workbench.paths import PROJECT_ROOT as repo
    if (repo / "pyproject.toml").exists() and os.access(repo, os.W_OK):
        return repo / ".cache" / "demo"
    return Path.home() / ".cache" / "workbench" / "demo"


def build_tokenizer(special_tokens: list[str]):
    """A small byte-level BPE trained on a fixed corpus: deterministic, offline."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=special_tokens, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   extra_special_tokens={"image_token": "<|image_pad|>"} if "<|image_pad|>" in
                                   special_tokens else None)


def _qwen_config(tokenizer):
    from transformers import Qwen2VLConfig

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    return Qwen2VLConfig(
        text_config=dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}, tie_word_embeddings=False,
                         bos_token_id=None, eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"]),
        # every quantizable layer at least 64 wide: bitsandbytes 0.50.2's CPU inference path repacks 4-bit weights
        # per 64-value block and fails on narrower layers (no real model has them)
        vision_config=dict(depth=2, embed_dim=64, hidden_size=64, num_heads=4, mlp_ratio=2, patch_size=14,
                           spatial_merge_size=2, temporal_patch_size=2, in_chans=3),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False, dtype="bfloat16",
    )


def _image_processor():
    # Qwen2VLProcessor itself cannot be built here: its video half needs torchvision, which has no CPU build for
    # torch 2.13. The PIL image processor plus the tokenizer is what `workbench.model.inputs.vlm_inputs` combines.
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    # small images: 56..224 px sides, 14 px patches merged 2x2
    return Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=224 * 224, patch_size=14, merge_size=2,
                                    temporal_patch_size=2)


def _build(root: Path) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2VLForConditionalGeneration

    final = DemoPaths(root.parent / root.name.split(".building-")[0])
    paths = DemoPaths(root)
    torch.manual_seed(0)
    tokenizer = build_tokenizer(SPECIAL_TOKENS)
    tokenizer.chat_template = CHAT_TEMPLATE
    image_processor = _image_processor()

    base = Qwen2VLForConditionalGeneration(_qwen_config(tokenizer)).to(torch.bfloat16).eval()
    for folder in (paths.qwen_base, paths.qwen_stage1):
        tokenizer.save_pretrained(folder)
        image_processor.save_pretrained(folder)
    base.save_pretrained(paths.qwen_base)

    # stage 1: the vision tower "fine-tuned" (a deterministic perturbation), the language model untouched
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in base.model.visual.parameters():
            p.add_(torch.randn(p.shape, generator=generator).to(p.dtype) * 0.02)
    base.save_pretrained(paths.qwen_stage1)

    # stage 2: LoRA on the language layers of stage 1, "trained" (lora_B non-zero), recorded base = stage 1
    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, task_type="CAUSAL_LM",
                      target_modules=r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)")
    peft_model = get_peft_model(base, lora)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=generator).to(p.dtype) * 0.01)
    peft_model.peft_config["default"].base_model_name_or_path = str(final.qwen_stage1)
    peft_model.save_pretrained(paths.qwen_stage2)

    text_tokenizer = build_tokenizer(SPECIAL_TOKENS[:3])
    text_tokenizer.chat_template = CHAT_TEMPLATE
    llama = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(text_tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False,
        bos_token_id=None, eos_token_id=text_tokenizer.eos_token_id, pad_token_id=text_tokenizer.pad_token_id,
        dtype="bfloat16")).to(torch.bfloat16).eval()
    llama.save_pretrained(paths.llama, max_shard_size="60KB")
    text_tokenizer.save_pretrained(paths.llama)


def _stamp(root: Path) -> str:
    """What the demo was built with. The versions are read without importing the libraries (`library_versions`: an
    imported library's `__version__`, else its installed metadata, the same string): a `workbench diagnose` of the
    demo that finds it built imported peft, and with it transformers, torch and bitsandbytes, only to read them
    (6 s of the CLI process' 8 s of CPU on 2 cores)."""
    from workbench.environment import library_versions

    versions = library_versions()
    return json.dumps({"demo": DEMO_VERSION, "root": str(root), "transformers": versions["transformers"],
                       "peft": versions["peft"]})


def _move_into_place(building: Path, final: Path) -> None:
    """Swap a finished build in for the old one: readers see the old folder or the new one, never half of either."""
    old = final.with_name(f"{final.name}.old-{os.getpid()}")
    if final.exists():
        os.replace(final, old)
    os.replace(building, final)
    shutil.rmtree(old, ignore_errors=True)


def build_demo(root: str | Path | None = None, force: bool = False) -> DemoPaths:
    """Build the demo checkpoints (or reuse them when the stamp matches). Safe with two builds at once."""
    root = Path(root) if root else default_demo_root()
    root = root.resolve()
    stamp_file = root / "DEMO_STAMP.json"
    if not force and stamp_file.exists() and stamp_file.read_text() == _stamp(root):
        return DemoPaths(root)
    root.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f"{root.name}.building-", dir=root.parent))
    try:
        _build(building)
        (building / "DEMO_STAMP.json").write_text(_stamp(root))
        _move_into_place(building, root)
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return DemoPaths(root)


@dataclasses.dataclass(frozen=True)
class DemoRecipes:
    root: Path

    @property
    def recipes_file(self) -> Path:
        return self.root / "recipes.yaml"

    @property
    def eval_dataset(self) -> Path:
        return self.root / "grounding-eval"


RECIPE_ORDER = ("r1-llm-only", "r2-vision-only", "r3-stage2", "r4-joint")


def _recipes_stamp(paths: DemoPaths) -> tuple[Path, str]:
    # recipe_training keeps its own RECIPES_STAMP.json beside this one
    return paths.root / "recipes" / "DEMO_RECIPES_STAMP.json", _stamp(paths.root) + "/recipes-1"


def demo_recipes_ready(root: str | Path | None = None) -> bool:
    """Whether the demo's recipes are trained (for these library versions): notebook 05 need not train them."""
    stamp_file, stamp = _recipes_stamp(build_demo(root))
    return stamp_file.exists() and stamp_file.read_text() == stamp


def build_demo_recipes(root: str | Path | None = None, force: bool = False, log=print,
                       settings: TrainingSettings | None = None) -> DemoRecipes:
    """The four recipe shapes of the write-up (docs/demo.md), trained for real on the CPU on the synthetic grounding task (a few minutes
    once; cached under its own stamp beside the demo), with the recipes file notebook 05 evaluates. `settings`: the
    splits and schedule (default `TrainingSettings()`, the write-up's story; the test suite's default tier trains a
    short schedule, which writes the same folders but not the scores). Trained recipes are reused whatever schedule
    trained them: the recipes folder's RECIPES_STAMP.json records it."""
    import yaml

    from workbench.demo.training import TrainingSettings, build_recipes

    paths = build_demo(root)
    target = paths.root / "recipes"
    stamp_file, stamp = _recipes_stamp(paths)
    if not force and demo_recipes_ready(root):
        return DemoRecipes(target)
    building = Path(tempfile.mkdtemp(prefix="recipes.building-", dir=paths.root))
    try:
        log(f"training the demo recipes into {target} (once; a few minutes on 2 cores)")
        built = build_recipes(paths.qwen_base, building, log=log, settings=settings or TrainingSettings())
        # the adapters record their bases inside `building`; point them at the final folder before the move
        for adapter in building.glob("*/adapter_config.json"):
            text = adapter.read_text().replace(str(building), str(target))
            adapter.write_text(text)
        # the reference row: the base that already writes boxes (as Qwen2-VL-Instruct did in the write-up), which
        # every recipe was trained from; the random demo base could not even answer
        listing = {"base": "grounding-base", "dataset": "grounding-eval", "max_new_tokens": 24,
                   "recipes": [{"name": n.replace("r3-stage2", "r3-two-stage"), "path": n} for n in RECIPE_ORDER
                               if n in built]}
        (building / "recipes.yaml").write_text("# The demo's recipes, trained by workbench.demo.training\n"
                                               + yaml.safe_dump(listing, sort_keys=False))
        stamp_file_tmp = building / stamp_file.name
        stamp_file_tmp.write_text(stamp)
        _move_into_place(building, target)
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return DemoRecipes(target)


@dataclasses.dataclass(frozen=True)
class DemoArguments:
    """How `make diagnose` with no CKPT diagnoses the demo: its stage 2 as a 2024-era trl SFTTrainer prepared it
    (4-bit, QLoRA, older trl's bf16 casting, 2 GPUs)."""

    checkpoint: str
    quant: str
    setup: str
    gpus: int
    params_json: str


def demo_arguments(root: str | Path | None = None) -> DemoArguments:
    paths = build_demo(root)
    return DemoArguments(checkpoint=str(paths.qwen_stage2), quant="4bit", setup="qlora_trl_legacy", gpus=2,
                         # base-vs-checkpoint row (01); the demo's trained recipes (05, built on first use)
                         params_json=json.dumps({"compare": [str(paths.qwen_base)], "recipes": f"demo:{paths.root}"}))
