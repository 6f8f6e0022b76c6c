"""The check catalog and the notebooks' probe sequences, as data: the one place a check and a step are declared.

    from workbench.catalog import CHECKS, NOTEBOOKS, check, notebook
    check("grad.flow").verdicts["skip"]      # 'nothing trainable'
    notebook("04_forward_checks").checks     # ('grad.flow', 'forward.mixed_precision_buffers', ...)

Everything else derives from here or is tested against it: the recorder learns which checks a probe answers
(`checks_reported_by`), the runner turns every declared check a notebook never reported into an `error`, each
notebook runs its steps by name (`nb.run("static")`), the panel runs the same steps, `python -m workbench checks`
prints the catalog and the README's catalog table is its `--markdown` output (a test keeps them equal).

Probes are named as "module:function" strings so reading the catalog imports neither torch nor transformers.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable, Mapping

VERDICTS = ("pass", "info", "warn", "fail", "error", "skip")


@dataclasses.dataclass(frozen=True)
class Check:
    id: str
    notebook: str
    question: str
    verdicts: Mapping[str, str]  # verdict -> what it means for this check
    probes: tuple[str, ...]  # "module:function" of each probe that reports it

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "notebook": self.notebook, "question": self.question,
                "verdicts": dict(self.verdicts), "probes": list(self.probes)}


@dataclasses.dataclass(frozen=True)
class Step:
    """One probe call of a notebook. Its inputs name the target, earlier steps, or the notebook's options.

    Input names: `target`; an earlier step's name (a step that could not run makes this one an `error`); the same
    with a trailing `?` (optional: None when that step did not run or could not run); `params.KEY` (the --params
    file's value, None when absent); `option.NAME` (a notebook parameter such as `distributed`).
    """

    name: str
    label: str
    probe: str
    args: tuple[str, ...] = ("target",)
    kwargs: Mapping[str, str] = dataclasses.field(default_factory=dict)
    own_model: bool = False  # loads and frees its own copy: run before the shared model is prepared
    mutates: bool = False  # changes the shared model (a training step, a cast, a wrap): run under guard.restored

    def function(self) -> Callable[..., Any]:
        return resolve_probe(self.probe)


@dataclasses.dataclass(frozen=True)
class NotebookSpec:
    name: str
    title: str
    group: str  # its tick box and tab in the panel
    steps: tuple[Step, ...]
    panel: bool = True  # runs inside one process (the panel can run it); False: it launches its own processes

    @property
    def checks(self) -> tuple[str, ...]:
        return tuple(c.id for c in CHECKS if c.notebook == self.name)

    def step(self, name: str) -> Step:
        for s in self.steps:
            if s.name == name:
                return s
        raise KeyError(f"notebook {self.name} has no step {name!r}; its steps: {[s.name for s in self.steps]}")


def resolve_probe(path: str) -> Callable[..., Any]:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


_DTYPE = "workbench.probes.dtype.probes"
_PARALLEL = "workbench.probes.parallel.probes"
_PEFT = "workbench.probes.peft.probes"
_PREPARE = Step("prepared", "prepare the model (set-up)", "workbench.model.shared:prepare_shared")
_SAVED = "workbench.probes.saved"
_DATA = "workbench.probes.data"

NOTEBOOKS: tuple[NotebookSpec, ...] = (
    NotebookSpec("00_saved_files", "00 · What the saved files say", "Saved files", (
        Step("files", "the saved files (headers, configs, tokenizer, meta skeleton)",
             f"{_SAVED}.files:saved_files_probe"),
        Step("weights", "the adapter's weights", f"{_SAVED}.adapter_weights:adapter_weights_probe", ("files",)),
        Step("targets", "what target_modules reaches", f"{_SAVED}.adapter_targets:adapter_targets_probe", ("files",)),
        Step("vocab", "tokenizer against the embeddings", f"{_SAVED}.tokenizer:tokenizer_vocab_probe", ("files",)),
        Step("special_tokens", "pad, EOS, BOS and the chat template", f"{_SAVED}.tokenizer:special_tokens_probe",
             ("files",)),
        Step("tied", "tied embeddings", f"{_SAVED}.config_checks:tied_embeddings_probe", ("files",)),
        Step("quantization", "quantization_config against the weights", f"{_SAVED}.config_checks:quantization_probe",
             ("files",)),
        Step("generation", "generation_config.json", f"{_SAVED}.config_checks:generation_config_probe", ("files",)),
    )),
    NotebookSpec("01_dtype_distribution", "01 · Dtype distribution", "Dtype census", (
        Step("static", "checkpoint headers", "workbench.probes.dtype.headers:checkpoint_probe"),
        Step("quantized", "4-bit and 8-bit census", f"{_DTYPE}:quantized_census_probe",
             kwargs={"static": "static?"}),
        _PREPARE,
        Step("census", "loaded census", f"{_DTYPE}:loaded_census_probe", ("prepared", "target", "static?")),
        Step("scenario_table", "all scenarios side by side", f"{_DTYPE}:with_loaded_row", ("quantized", "census")),
        Step("islands", "fp32 islands", f"{_DTYPE}:fp32_island_probe", ("prepared", "target")),
    )),
    NotebookSpec("02_dataparallel", "02 · DataParallel detection", "DataParallel", (
        _PREPARE,
        Step("wrap", "Trainer wrap (DataParallel)", f"{_PARALLEL}:trainer_wrap_probe", ("prepared", "target"),
             mutates=True),
        Step("maps", "device maps", f"{_PARALLEL}:device_map_probe", ("prepared", "target")),
    )),
    NotebookSpec("03_peft_attributes", "03 · PEFT attribute preservation", "Attributes", (
        Step("attribute_chain", "attributes through the wrapping chain", f"{_PEFT}:peft_attribute_probe",
             own_model=True),
        _PREPARE,
        Step("attributes", "your set-up's attributes", f"{_PEFT}:with_setup_attributes",
             ("attribute_chain", "prepared", "target")),
        Step("layers", "adapter layers (PEFT's status)", f"{_PEFT}:peft_layer_status_probe", ("prepared",)),
    )),
    NotebookSpec("04_forward_checks", "04 · Forward, dtype flow and gradients", "Forward flow", (
        _PREPARE,
        Step("grads", "gradient flow", "workbench.probes.forward.grad_flow:grad_flow_probe", ("prepared", "target"),
             mutates=True),
        Step("buffers", "mixed-precision buffers", "workbench.probes.dtype.buffers:mixed_precision_buffer_probe",
             ("prepared", "target"), mutates=True),
        Step("forward", "forward matrix and dtype flow", "workbench.probes.forward.scenarios:forward_scenarios_probe",
             ("prepared", "target"), mutates=True),
    )),
    NotebookSpec("05_evaluation", "05 · Evaluation across recipes", "Evaluation", (
        Step("recipes", "recipes", "workbench.probes.evaluation.recipes:recipes_for", ("target", "params.recipes")),
        Step("evaluation", "evaluation, one recipe at a time", "workbench.probes.evaluation.evaluate:evaluate_recipes",
             ("recipes", "target")),  # frees the shared model itself when it must load recipes beside it
    )),
    NotebookSpec("06_distributed", "06 · Distributed: DDP and FSDP2 under torchrun", "Distributed", (
        Step("dist", "DDP and FSDP2 under torchrun", "workbench.distributed.probes:distributed_probe",
             kwargs={"ranks": "option.distributed",
                     "ddp_find_unused_parameters": "params.ddp_find_unused_parameters"}),
    ), panel=False),
    NotebookSpec("07_data_path", "07 · The data path: what the model is trained on", "Data path", (
        Step("data_path", "the batches as your run builds them", f"{_DATA}.batches:data_path_probe",
             kwargs={"samples": "params.data_samples", "max_length": "params.max_length"}),
        Step("data_stats", "every row: labels, EOS, truncation", f"{_DATA}.stats:data_statistics_probe",
             ("data_path",)),
        Step("data_template", "chat template and tokenizer", f"{_DATA}.template:template_probe",
             ("data_path", "data_stats")),
        Step("token_view", "token view", f"{_DATA}.token_view:token_view_probe", ("data_path", "data_stats")),
    )),
)


def _c(id: str, nb: str, question: str, probes: tuple[str, ...], **verdicts: str) -> Check:
    return Check(id, nb, question, verdicts, probes)


_EVAL = ("workbench.probes.evaluation.evaluate:evaluate_recipes",)
CHECKS: tuple[Check, ...] = (
    _c("adapter.weights", "00_saved_files",
       "Is the adapter file itself trained: not empty (tensors of shape [0], what ZeRO-3 saves ungathered), not a "
       "no-op (every lora_B zero), free of NaN/inf; the update norm ‖B·A‖·scaling per module?",
       (f"{_SAVED}.adapter_weights:adapter_weights_probe",),
       **{"pass": "trained and finite (the table and plot of update norms)",
          "fail": "empty, no-op or non-finite", "skip": "no adapter"}),
    _c("adapter.targets", "00_saved_files",
       "What does target_modules (list, regex or all-linear) match on the base, by PEFT's own rule on a meta "
       "skeleton: per component, modules the adapter names that the base lacks, unintended reach, modules_to_save?",
       (f"{_SAVED}.adapter_targets:adapter_targets_probe",),
       **{"info": "the matches per component", "warn": "reaches the vision tower, a convolution or the head",
          "fail": "the adapter cannot apply (matches nothing, names missing modules, shapes differ)",
          "error": "the base's skeleton cannot be built", "skip": "no adapter"}),
    _c("tokenizer.vocab", "00_saved_files",
       "Does every token id fit the embeddings: len(tokenizer) and its largest added/special id against "
       "config.vocab_size, the embedding rows in the headers and the rows the adapter saves?",
       (f"{_SAVED}.tokenizer:tokenizer_vocab_probe",),
       **{"pass": "every id fits", "info": "the adapter saves resized embeddings (resize the base first)",
          "fail": "an id past the rows, or tokens added but the resized embeddings not saved",
          "error": "the tokenizer does not load", "skip": "no tokenizer files"}),
    _c("tokenizer.special_tokens", "00_saved_files",
       "Are pad, EOS and BOS right for training and generation: a pad token distinct from EOS, the chat "
       "template's end-of-turn token in generation's eos_token_id, BOS added once?",
       (f"{_SAVED}.tokenizer:special_tokens_probe",),
       **{"pass": "consistent", "warn": "no pad token, or pad = EOS",
          "fail": "end of turn not an EOS for generation, or a doubled BOS",
          "error": "the tokenizer does not load", "skip": "no tokenizer files"}),
    _c("config.tied_embeddings", "00_saved_files",
       "Does tie_word_embeddings agree with the saved head and embeddings, and with what the adapter trains?",
       (f"{_SAVED}.config_checks:tied_embeddings_probe",),
       **{"pass": "consistent", "warn": "identical tensors declared untied",
          "fail": "tied while the adapter or checkpoint trains them apart, or untied with no head saved"}),
    _c("config.quantization", "00_saved_files",
       "Does quantization_config in config.json agree with the dtypes in the weights, and is the adapter's base "
       "pre-quantized (a merge into it rounds the update)?", (f"{_SAVED}.config_checks:quantization_probe",),
       **{"pass": "declaration and weights agree", "warn": "an adapter on a pre-quantized base",
          "fail": "a 16-bit model declaring 4-bit, or quantized weights with no declaration"}),
    _c("config.generation", "00_saved_files",
       "Does generation_config.json pass the strict validation save_pretrained runs at every checkpoint save?",
       (f"{_SAVED}.config_checks:generation_config_probe",),
       **{"pass": "valid", "warn": "refused by the strict validation (raises at save once modified)",
          "fail": "invalid even to the lenient validation", "skip": "no generation_config.json"}),
    _c("checkpoint.integrity", "01_dtype_distribution",
       "Are the checkpoint's files present and whole: shards listed in the index present and holding what it says, "
       "headers that parse, data that matches its header?", ("workbench.probes.dtype.headers:checkpoint_probe",),
       **{"pass": "complete and consistent", "warn": "loads, with oddities (stray files, mixed .bin)",
          "fail": "damaged: missing shard, truncated file, lying header"}),
    _c("dtype.census", "01_dtype_distribution",
       "Which dtypes do the parameters and buffers have, per component found from the model's structure (vision / "
       "projector / language / encoder / decoder / head), as the set-up loads them, beside the header census? "
       "Tied tensors are counted once.", (f"{_DTYPE}:loaded_census_probe",),
       **{"pass": "the census (always; it is evidence, not a verdict)"}),
    _c("dtype.quantized_census", "01_dtype_distribution",
       "What does the census look like under 4-bit and 8-bit: predicted on the meta device by transformers' own "
       "bitsandbytes quantizer, verified by a real load where the checkpoint is small?",
       (f"{_DTYPE}:quantized_census_probe",),
       **{"pass": "prediction (and, where run, the real load) agree", "warn": "prediction and real load disagree"}),
    _c("dtype.fp32_islands", "01_dtype_distribution",
       "Which floating tensors differ from the compute dtype, frozen modules and buffers first?",
       (f"{_DTYPE}:fp32_island_probe",),
       **{"pass": "none", "info": "only intentional or contained ones (rotary buffers, _keep_in_fp32_modules, PEFT's "
                                  "fp32 adapters, prepare_model_for_kbit_training's upcast, norms that return their "
                                  "input's dtype)",
          "warn": "islands that can promote activations"}),
    _c("parallel.trainer_wrap", "02_dataparallel",
       "Will the installed transformers.Trainer wrap the model in nn.DataParallel with N GPUs; effective n_gpu, "
       "train batch and steps per epoch; does a forward survive a replica thread?", (f"{_PARALLEL}:trainer_wrap_probe",),
       **{"pass": "no wrap, batch as configured",
          "warn": "wrapped but the replica forward survives, or the batch is multiplied without a wrap",
          "fail": "wrapped and the replica forward crashes"}),
    _c("parallel.device_map", "02_dataparallel",
       "What does device_map give (or would give on N GPUs with --max-memory): devices spanned, cpu/disk entries?",
       (f"{_PARALLEL}:device_map_probe",),
       **{"pass": "spans the GPUs, nothing offloaded", "info": "the whole model lands on one GPU",
          "warn": "offload, or bitsandbytes refusing cpu entries"}),
    _c("peft.attributes", "03_peft_attributes",
       "Which attributes the Trainer and accelerate read survive each wrapping step (raw → k-bit → PEFT → Trainer → "
       "your set-up)?", (f"{_PEFT}:peft_attribute_probe", f"{_PEFT}:with_setup_attributes"),
       **{"info": "the table; nothing the Trainer reads is lost",
          "fail": "a Trainer-read attribute changes or is lost"}),
    _c("peft.layer_status", "03_peft_attributes",
       "What does PEFT's own get_layer_status / get_model_status say per adapter layer, and do LoRA A/B dtypes "
       "match the base layer's compute dtype?", (f"{_PEFT}:peft_layer_status_probe",),
       **{"pass": "regular", "info": "A/B dtype differs (PEFT casts around it)",
          "warn": "irregular or disabled layers", "skip": "no adapter"}),
    _c("grad.flow", "04_forward_checks",
       "After one training step, which trainable tensors have a gradient that is None or zero, per component?",
       ("workbench.probes.forward.grad_flow:grad_flow_probe",),
       **{"pass": "every trainable tensor gets a gradient (lora_A zero while lora_B is zero is normal)",
          "info": "the rest belong to modules whose output never reaches the loss (CLIP's post_layernorm under "
                  "LLaVA)",
          "fail": "trainable tensors get none, or 4-bit layers were handed over packed for CPU inference; the "
                  "cause named", "error": "the step itself crashed",
          "skip": "nothing trainable"}),
    _c("forward.mixed_precision_buffers", "04_forward_checks",
       "With FSDP-style mixed precision (parameters cast, buffers not), does a buffer promote activations?",
       ("workbench.probes.dtype.buffers:mixed_precision_buffer_probe",),
       **{"pass": "no buffer off the compute dtype", "info": "buffers off the compute dtype that promote nothing",
          "fail": "a buffer promotes activations (named)"}),
    _c("forward.scenarios", "04_forward_checks",
       "Which forward passes of the scenario matrix (eval/train × autocast × replica thread × adapters) pass?",
       ("workbench.probes.forward.scenarios:forward_scenarios_probe",),
       **{"pass": "every scenario passes", "fail": "a scenario fails (with its error)"}),
    _c("forward.dtype_flow", "04_forward_checks",
       "In the first failing scenario, which module's input dtype disagrees with its weight, and which module "
       "produced that input?", ("workbench.probes.forward.scenarios:forward_scenarios_probe",),
       **{"pass": "nothing failed", "warn": "a failure that is not a dtype mismatch",
          "fail": "the producing and the raising module named"}),
    _c("eval.metrics", "05_evaluation",
       "Per recipe: the metrics on the evaluation set, the best recipe and its gain over the base.", _EVAL,
       **{"pass": "every recipe evaluated", "warn": "a recipe could not load, or every sample raised",
          "error": "no recipe could, or the dataset has no usable row", "skip": "no dataset"}),
    _c("eval.memory", "05_evaluation",
       "Is memory freed between recipes: peak per recipe, and what is still held after freeing?", _EVAL,
       **{"pass": "freed", "warn": "memory held grows from one recipe to the next"}),
    _c("adapter.base_model", "05_evaluation",
       "Was the adapter loaded onto the base it was trained on (adapter_config.json against the loaded base, "
       "LoRA shapes, sampled weights)?", _EVAL + ("workbench.probes.evaluation.lineage:adapter_lineage_probe",),
       **{"pass": "the recorded base", "info": "another path with identical weights (a copy)",
          "warn": "the recorded base is a hub id not in the offline cache", "fail": "another base, naming both",
          "error": "the recorded base cannot be found", "skip": "no adapter"}),
    _c("placement.offload", "05_evaluation",
       "Which modules landed on cpu / disk / meta, and what does that break (flash-attention)?",
       _EVAL + ("workbench.probes.evaluation.placement:placement_probe",),
       **{"pass": "nothing offloaded", "warn": "modules offloaded (named, with bytes)",
          "fail": "flash-attention with a module off CUDA"}),
    _c("distributed.ddp", "06_distributed",
       "Under torchrun and DDP: name prefixes, gradient sync, unused parameters, the Trainer's "
       "find_unused_parameters against reentrant checkpointing.", ("workbench.distributed.probes:distributed_probe",),
       **{"pass": "gradients equal on every rank", "warn": "unused tensors, or your name pattern loses matches",
          "fail": "the Trainer's wrapping raises, or gradients differ", "error": "a rank crashed or timed out",
          "skip": "not asked, or would not fit"}),
    _c("distributed.fsdp", "06_distributed",
       "Under FSDP2 with MixedPrecisionPolicy: does a buffer left in fp32 promote activations?",
       ("workbench.distributed.probes:distributed_probe",),
       **{"pass": "no promotion", "warn": "fails, not on a dtype", "fail": "the buffer named",
          "error": "a rank crashed or timed out", "skip": "not asked, or fully_shard refuses a quantized model"}),
    _c("data.labels", "07_data_path",
       "In the batches your run builds, which rows supervise nothing (every label -100: loss 0 or NaN), which "
       "supervise no token of their answer, which supervise the prompt when the run means answer-only loss?",
       (f"{_DATA}.stats:data_statistics_probe",),
       **{"pass": "every answer supervised, prompts masked", "info": "whole-sequence loss: prompts supervised by design",
          "warn": "prompts supervised under answer-only loss, or < 1 % of rows dropped by trl as unsupervised",
          "fail": "rows with nothing supervised (batched, or ≥ 1 % dropped by trl), or answers unsupervised "
                  "(rows named)", "skip": "no --data"}),
    _c("data.eos", "07_data_path",
       "Is the end-of-turn / EOS token a supervised label in every row that reaches a batch whole?",
       (f"{_DATA}.stats:data_statistics_probe",),
       **{"pass": "in every uncut row", "warn": "missing or masked in some rows (named)",
          "fail": "in none: the model never learns to stop (pad = EOS masked as padding, named by id)",
          "skip": "no --data, or no uncut supervised row"}),
    _c("data.truncation", "07_data_path",
       "Which rows does max_length cut, and of those, whose answer is cut or lost entirely? The length "
       "distribution against max_length.", (f"{_DATA}.stats:data_statistics_probe",),
       **{"pass": "no row cut", "warn": "rows cut, answers (nearly all) intact",
          "fail": "answers lost, or cut in ≥ 1 % of rows (named)", "skip": "no --data"}),
    _c("data.template", "07_data_path",
       "Does a batched row start with BOS twice (template BOS + tokenizer BOS), does render-then-encode differ "
       "from apply_chat_template(tokenize=True), does the raw text hold special tokens?",
       (f"{_DATA}.template:template_probe",),
       **{"pass": "template, tokenizer and text agree (no BOS at all cannot double)",
          "warn": "render-then-encode differs, or special tokens in the text (rows named)",
          "fail": "batched rows start with BOS twice", "skip": "no --data"}),
)


def check(check_id: str) -> Check:
    for c in CHECKS:
        if c.id == check_id:
            return c
    raise KeyError(f"no check {check_id!r} in the catalog; see `python -m workbench checks`")


def notebook(name: str) -> NotebookSpec:
    for nb in NOTEBOOKS:
        if nb.name == name:
            return nb
    raise KeyError(f"no notebook {name!r} in the catalog: {[n.name for n in NOTEBOOKS]}")


def checks_reported_by(func: Callable[..., Any]) -> tuple[str, ...]:
    """The check ids a probe function answers, from the catalog (none for a helper such as prepare_model)."""
    path = f"{getattr(func, '__module__', '')}:{getattr(func, '__name__', '')}"
    return tuple(c.id for c in CHECKS if path in c.probes)


def markdown_table() -> str:
    """The README's catalog table."""
    lines = ["| id | notebook | what it answers | verdicts |", "|---|---|---|---|"]
    for c in CHECKS:
        verdicts = " · ".join(f"`{v}` {meaning}" for v, meaning in c.verdicts.items())
        lines.append(f"| `{c.id}` | {c.notebook[:2]} | {c.question} | {verdicts} |")
    return "\n".join(lines)
