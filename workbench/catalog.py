"""The check catalog and the notebooks' probe sequences, as data: the one place a check and a step are declared.

    from workbench.catalog import CHECKS, NOTEBOOKS, check, notebook
    check("grad.flow").verdicts["skip"]      # 'nothing trainable'
    notebook("04_forward_checks").checks     # ('grad.flow', 'forward.mixed_precision_buffers', ...)

Each name is written once. A step names its probe ("module:function", so reading the catalog imports neither torch
nor transformers) and the checks it reports (`reports=`); a check's probes are derived from the steps. Everything
else derives from here or is tested against it: the recorder is told each step's checks (a crash becomes an `error`
on them; a finding the catalog does not declare is refused), the runner turns every declared check a notebook never
reported into an `error`, each notebook runs its steps by name or by function (`nb.run("static")`), the panel runs
the same steps, `python -m workbench checks` prints the catalog (`--where ID`: the probe's file and line, its result
class and its tests), and the README's catalog table and docs/checks.md are generated from it (`make docs`; a test
keeps them equal).
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
    detail: str = ""  # what the probe examines and how, for docs/checks.md (markdown)

    @property
    def steps(self) -> tuple[Step, ...]:
        """The steps that report this check (a step declares it in `reports`)."""
        return tuple(s for nb in NOTEBOOKS for s in nb.steps if self.id in s.reports)

    @property
    def probes(self) -> tuple[str, ...]:
        """"module:function" of each probe that reports it, derived from the steps."""
        return tuple(dict.fromkeys(s.probe for s in self.steps))

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "notebook": self.notebook, "question": self.question,
                "verdicts": dict(self.verdicts), "detail": self.detail, "probes": list(self.probes)}


@dataclasses.dataclass(frozen=True)
class Step:
    """One probe call of a notebook. Its inputs name the target, earlier steps, or the notebook's options.

    Input names: `target`; an earlier step's name (a step that could not run makes this one an `error`); the same
    with a trailing `?` (optional: None when that step did not run or could not run; `prepared?` also in a notebook
    without the prepare step: the shared model a driver seeds, the callback's live one); `params.KEY` (the --params
    file's value, None when absent); `option.NAME` (a notebook parameter such as `distributed`).
    """

    name: str
    label: str
    probe: str
    args: tuple[str, ...] = ("target",)
    kwargs: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # loads and frees its own copy (where model.shared.loads_own_copy says so): run before the shared model is prepared
    own_model: bool = False
    mutates: bool = False  # changes the shared model (a training step, a cast, a wrap): run under guard.restored
    reports: tuple[str, ...] = ()  # the check ids its result's findings answer
    # the Trainer callback's pre-flight runs it on the live model (True), or its report says skip with this reason
    live: bool | str = True

    def function(self) -> Callable[..., Any]:
        return resolve_probe(self.probe)


@dataclasses.dataclass(frozen=True)
class NotebookSpec:
    name: str
    title: str
    group: str  # its tick box and tab in the panel
    steps: tuple[Step, ...]
    panel: bool = True  # runs inside one process (the panel can run it); False: it launches its own processes
    trainer_output_only: bool = False  # runs only when the target is (or sits in) a Trainer output_dir; else skip
    needs_model: bool = True  # False: reads files alone (the run autopsy), so it runs when the model cannot be found
    training_args_only: bool = False  # runs only with --training-args (the memory plan); else not executed: skip

    @property
    def checks(self) -> tuple[str, ...]:
        return tuple(c.id for c in CHECKS if c.notebook == self.name)

    def step(self, name: str | Callable[..., Any]) -> Step:
        """A step by its name, or by its probe function (`nb.run(grad_flow_probe)`: go-to-definition works)."""
        for s in self.steps:
            if s.name == name or (callable(name) and s.probe == probe_path(name)):
                return s
        shown = name if isinstance(name, str) else probe_path(name)
        raise KeyError(f"notebook {self.name} has no step {shown!r}; its steps: {[s.name for s in self.steps]}")


def resolve_probe(path: str) -> Callable[..., Any]:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def probe_path(function: Callable[..., Any]) -> str:
    """The "module:function" a step would name this function by."""
    return f"{getattr(function, '__module__', '')}:{getattr(function, '__name__', '')}"


_DTYPE = "workbench.probes.dtype.probes"
_PARALLEL = "workbench.probes.parallel.probes"
_PEFT = "workbench.probes.peft.probes"
_PREPARE = Step("prepared", "prepare the model (set-up)", "workbench.model.shared:prepare_shared")
_SAVED_FILES_ONLY = ("reads the checkpoint's saved headers and predicted 4-/8-bit loads against them: `workbench "
                     "diagnose` on a checkpoint your run saves")
_SAVED = "workbench.probes.saved"
_DATA = "workbench.probes.data"
_RUN = "workbench.probes.run"
_TRAIN = "workbench.probes.train"
_SERVE = "workbench.probes.serve"

NOTEBOOKS: tuple[NotebookSpec, ...] = (
    NotebookSpec("00_saved_files", "00 · What the saved files say", "Saved files", (
        Step("files", "the saved files (headers, configs, tokenizer, meta skeleton)",
             f"{_SAVED}.files:saved_files_probe"),
        Step("weights", "the adapter's weights", f"{_SAVED}.adapter_weights:adapter_weights_probe", ("files",),
             reports=("adapter.weights",)),
        Step("targets", "what target_modules reaches", f"{_SAVED}.adapter_targets:adapter_targets_probe", ("files",),
             reports=("adapter.targets",)),
        Step("vocab", "tokenizer against the embeddings", f"{_SAVED}.tokenizer:tokenizer_vocab_probe", ("files",),
             reports=("tokenizer.vocab",)),
        Step("special_tokens", "pad, EOS, BOS and the chat template", f"{_SAVED}.tokenizer:special_tokens_probe",
             ("files",), reports=("tokenizer.special_tokens",)),
        Step("tied", "tied embeddings", f"{_SAVED}.config_checks:tied_embeddings_probe", ("files",),
             reports=("config.tied_embeddings",)),
        Step("quantization", "quantization_config against the weights", f"{_SAVED}.config_checks:quantization_probe",
             ("files",), reports=("config.quantization",)),
        Step("generation", "generation_config.json", f"{_SAVED}.config_checks:generation_config_probe", ("files",),
             reports=("config.generation",)),
    )),
    NotebookSpec("01_dtype_distribution", "01 · Dtype distribution", "Dtype census", (
        Step("static", "checkpoint headers", "workbench.probes.dtype.headers:checkpoint_probe",
             reports=("checkpoint.integrity",), live=_SAVED_FILES_ONLY),
        Step("quantized", "4-bit and 8-bit census", f"{_DTYPE}:quantized_census_probe",
             kwargs={"static": "static?"}, live=_SAVED_FILES_ONLY),
        _PREPARE,
        Step("census", "loaded census", f"{_DTYPE}:loaded_census_probe", ("prepared", "target", "static?"),
             reports=("dtype.census",), live=_SAVED_FILES_ONLY),
        # answers dtype.quantized_census once: the predictions and real loads, beside the loaded model's row
        Step("scenario_table", "all scenarios side by side", f"{_DTYPE}:with_loaded_row", ("quantized", "census?"),
             reports=("dtype.quantized_census",), live=_SAVED_FILES_ONLY),
        Step("islands", "fp32 islands", f"{_DTYPE}:fp32_island_probe", ("prepared", "target"),
             reports=("dtype.fp32_islands",)),
    )),
    NotebookSpec("02_dataparallel", "02 · DataParallel detection", "DataParallel", (
        _PREPARE,
        Step("wrap", "Trainer wrap (DataParallel)", f"{_PARALLEL}:trainer_wrap_probe", ("prepared", "target"),
             mutates=True, reports=("parallel.trainer_wrap",)),
        Step("maps", "device maps", f"{_PARALLEL}:device_map_probe", ("prepared", "target"),
             reports=("parallel.device_map",)),
    )),
    NotebookSpec("03_peft_attributes", "03 · PEFT attribute preservation", "Attributes", (
        Step("attribute_chain", "attributes through the wrapping chain", f"{_PEFT}:peft_attribute_probe",
             own_model=True),
        _PREPARE,
        # answers peft.attributes once: the chain, with your set-up's column when it is your own
        Step("attributes", "your set-up's attributes", f"{_PEFT}:with_setup_attributes",
             ("attribute_chain", "prepared?", "target"), reports=("peft.attributes",)),
        Step("layers", "adapter layers (PEFT's status)", f"{_PEFT}:peft_layer_status_probe", ("prepared",),
             reports=("peft.layer_status",)),
    )),
    NotebookSpec("04_forward_checks", "04 · Forward, dtype flow and gradients", "Forward flow", (
        _PREPARE,
        Step("grads", "gradient flow", "workbench.probes.forward.grad_flow:grad_flow_probe", ("prepared", "target"),
             mutates=True, reports=("grad.flow",)),
        Step("buffers", "mixed-precision buffers", "workbench.probes.forward.mixed_precision_buffers:mixed_precision_buffer_probe",
             ("prepared", "target"), mutates=True, reports=("forward.mixed_precision_buffers",),
             live="casts every parameter to the compute dtype as FSDP's mixed precision does: for a run that shards, "
                  "train.fsdp_units replays its units; `workbench diagnose` runs the cast"),
        Step("forward", "forward matrix and dtype flow", "workbench.probes.forward.scenarios:forward_scenarios_probe",
             ("prepared", "target"), mutates=True, reports=("forward.scenarios", "forward.dtype_flow")),
    )),
    NotebookSpec("05_evaluation", "05 · Evaluation across recipes", "Evaluation", (
        Step("recipes", "recipes", "workbench.probes.evaluation.recipes:recipes_for", ("target", "params.recipes")),
        Step("evaluation", "evaluation, one recipe at a time", "workbench.probes.evaluation.evaluate:evaluate_recipes",
             ("recipes", "target"),
             # frees the shared model itself when it must load recipes beside it
             reports=("eval.metrics", "eval.memory", "adapter.base_model", "placement.offload")),
    )),
    NotebookSpec("06_distributed", "06 · Distributed: DDP and FSDP2 under torchrun", "Distributed", (
        Step("dist", "DDP and FSDP2 under torchrun", "workbench.distributed.probes:distributed_probe",
             kwargs={"ranks": "option.distributed",
                     "ddp_find_unused_parameters": "params.ddp_find_unused_parameters"},
             reports=("distributed.ddp", "distributed.fsdp")),
    ), panel=False),
    NotebookSpec("07_data_path", "07 · The data path: what the model is trained on", "Data path", (
        Step("data_path", "the batches as your run builds them", f"{_DATA}.batches:data_path_probe",
             kwargs={"samples": "params.data_samples", "max_length": "params.max_length"}),
        Step("data_stats", "every row: labels, EOS, truncation", f"{_DATA}.stats:data_statistics_probe",
             ("data_path",), reports=("data.labels", "data.eos", "data.truncation")),
        Step("data_template", "chat template and tokenizer", f"{_DATA}.template:template_probe",
             ("data_path", "data_stats"), reports=("data.template",)),
        Step("token_view", "token view", f"{_DATA}.token_view:token_view_probe", ("data_path", "data_stats"),
             live="a view of a few rows, shown in notebook 07"),
        Step("preference_pairs", "preference pairs where the loss reads them (DPO)", f"{_DATA}.pairs:preference_pairs_probe",
             ("target",), {"prepared": "prepared?"}, reports=("data.pairs",)),
    )),
    NotebookSpec("08_training_run", "08 · The training run: what the Trainer left behind", "Training run", (
        Step("run_dir", "the Trainer output_dir", f"{_RUN}.run_facts:run_directory"),
        Step("training_log", "trainer_state.json: loss, gradients, schedule, evaluation",
             f"{_RUN}.log_probe:training_log_probe", ("run_dir", "target"),
             reports=("run.loss", "run.gradients", "run.schedule", "run.eval")),
        Step("run_signals", "preference and RL runs: margins, rewards, completions, KL, entropy",
             f"{_RUN}.trl_signals:run_signals_probe", ("training_log",),
             reports=("run.preference_signal", "run.likelihood_displacement", "run.reward_variance",
                      "run.completion_clipping", "run.policy_drift", "run.reward_trend", "run.reward_model")),
        Step("adapter_progress", "the adapter across checkpoint-N/", f"{_RUN}.adapter_progress:adapter_progress_probe",
             ("run_dir",), {"signals": "run_signals?"}, reports=("run.adapter_progress",)),
        Step("versions", "the run's versions against known regressions", f"{_RUN}.versions:versions_probe",
             ("run_dir",), reports=("run.versions",)),
    ), panel=False, trainer_output_only=True, needs_model=False),
    NotebookSpec("09_training_step", "09 · The training step as configured", "Training step", (
        _PREPARE,
        Step("configuration", "the training configuration", f"{_TRAIN}.configuration:training_configuration_probe",
             ("target", "prepared")),
        Step("loss_accumulation", "the Trainer at b·k × GA 1 against b × GA k",
             f"{_TRAIN}.loss_accumulation:loss_accumulation_probe", ("prepared", "configuration"),
             reports=("train.loss_accumulation",),
             live="runs the real Trainer twice (b·k × GA 1 against b × GA k), two short trainings of their own: "
                  "opt-in, WorkbenchCallback(loss_accumulation=True)"),
        Step("fp16", "fp16: trainable fp16 tensors, activation headroom", f"{_TRAIN}.fp16:fp16_probe",
             ("prepared", "target", "configuration"), mutates=True, reports=("train.fp16",)),
        Step("ddp_checkpointing", "DDP with activation checkpointing",
             f"{_TRAIN}.ddp_checkpointing:ddp_checkpointing_probe", ("prepared", "configuration"),
             reports=("train.ddp_checkpointing",)),
        Step("fsdp_units", "FSDP units, replayed on the meta device", f"{_TRAIN}.fsdp_units:fsdp_units_probe",
             ("prepared", "target", "configuration"), reports=("train.fsdp_units",)),
        Step("rl_rollout", "one generation batch scored by your reward functions (GRPO, RLOO)",
             f"{_TRAIN}.rl_rollout:rl_rollout_probe", ("configuration",), reports=("train.rl_rollout",)),
        Step("reference_model", "the reference model against the policy (DPO, KTO, GRPO, RLOO, …)",
             f"{_TRAIN}.reference_model:reference_model_probe", ("configuration",),
             reports=("train.reference_model",)),
    )),
    NotebookSpec("10_serving", "10 · Train against serve: the adapter where it is served", "Serving", (
        _PREPARE,
        Step("serve_adapter", "what each serving engine makes of the adapter",
             f"{_SERVE}.adapter_rules:serve_adapter_probe", ("target", "params.serve_engines"),
             reports=("serve.adapter",)),
        Step("serve_template", "the chat template each engine will use", f"{_SERVE}.template:serve_template_probe",
             ("target", "params.serve_engines"), reports=("serve.template",)),
        Step("serve_merge", "merge_and_unload() against the unmerged adapter", f"{_SERVE}.merge:serve_merge_probe",
             ("prepared", "target"), mutates=True, reports=("serve.merge",)),
    )),
    NotebookSpec("11_memory_plan", "11 · Will it fit: the training step's memory, planned", "Memory plan", (
        Step("memory_plan", "one training step on fake tensors at full size", "workbench.plan.probe:memory_plan_probe",
             ("target",), reports=("plan.memory",),
             live="the callback's run is already running: its memory is measured, not planned (workbench plan)"),
    ), training_args_only=True),
)


def _c(id: str, nb: str, question: str, detail: str, **verdicts: str) -> Check:
    return Check(id, nb, question, verdicts, detail)


CHECKS: tuple[Check, ...] = (
    _c("adapter.weights", "00_saved_files",
       "Is the adapter file itself trained: not empty (tensors of shape [0], what ZeRO-3 saves ungathered), not a "
       "no-op (every lora_B zero), free of NaN/inf, no component left untrained; the update norm ‖B·A‖·scaling per "
       "module?",
       "the adapter file alone (`safetensors.safe_open`, never `torch.load`): no tensors or tensors of shape `[0]` "
       "(ZeRO-3 saved without gathering); every `lora_B` exactly zero (LoRA's init: never trained); NaN/inf per "
       "tensor; modules whose `lora_B` is still exactly zero counted per component (a whole component, e.g. a VLM's "
       "vision tower trained on text-only batches, or ≥ 25 % of the modules: warn); per module `‖B·A‖_F · scaling` "
       "(lora_alpha / r, √r with rsLoRA, `alpha_pattern`) computed from two r×r products, as a table and a bar plot "
       "coloured by component, modules that never moved named",
       **{"pass": "trained and finite (the table and plot of update norms); a few modules that never moved named",
          "warn": "a whole component, or a quarter of the adapted modules or more, never moved (lora_B zero)",
          "fail": "empty, no-op or non-finite",
          "skip": "no adapter"}),
    _c("adapter.targets", "00_saved_files",
       "What does target_modules (list, regex or all-linear) match on the base, by PEFT's own rule on a meta "
       "skeleton: per component, modules the adapter names that the base lacks, unintended reach, modules_to_save?",
       "`target_modules` (list, regex, `all-linear` expanded by PEFT's own `_maybe_include_all_linear_layers`) "
       "matched by PEFT's `check_target_module_exists` (with `exclude_modules`, `layers_to_transform`, "
       "`modules_to_save`) on every module of a meta skeleton of the base: matches per component (vision / language "
       "/ projector / head), their types, each list entry (or a regex's `(a|b)` alternative) alone — one that "
       "matches nothing while others do is dropped by PEFT without a word (Phi-3's fused `qkv_proj` / "
       "`gate_up_proj`, LLaMA-Factory #4020) —, saved LoRA tensors naming modules the base lacks or not fitting "
       "their shapes, modules PEFT cannot wrap, `modules_to_save` found or not; fixes are built from the base's "
       "own adaptable leaf names per component and its component paths",
       **{"info": "the matches per component",
          "warn": "entries that match nothing (no matched module plays their role), modules_to_save naming a "
                  "module the base lacks, or a reach into the vision tower, a convolution, the head or an "
                  "nn.MultiheadAttention's own layers",
          "fail": "the adapter cannot apply (matches nothing, its weights name missing modules, shapes differ)",
          "error": "the base's skeleton cannot be built",
          "skip": "no adapter"}),
    _c("tokenizer.vocab", "00_saved_files",
       "Does every token id fit the embeddings: len(tokenizer) and its largest added/special id against "
       "config.vocab_size, the embedding rows in the headers and the rows the adapter saves?",
       "the tokenizer (the adapter folder's when it carries one, else the base's) loaded by `AutoTokenizer`: "
       "`len(tokenizer)`, the largest id of any added or special token, `config.vocab_size` (text config for a VLM), "
       "the rows of the input and output embeddings in the base's headers (the modules `get_input_embeddings` / "
       "`get_output_embeddings` name on the skeleton), the rows an adapter saves (`modules_to_save`), "
       "`trainable_token_indices`",
       **{"pass": "every id fits",
          "info": "the adapter saves resized embeddings (resize the base first)",
          "fail": "an id past the rows, or tokens added but the resized embeddings not saved",
          "error": "the tokenizer does not load",
          "skip": "no tokenizer files"}),
    _c("tokenizer.special_tokens", "00_saved_files",
       "Are pad, EOS and BOS right for training and generation: a pad token distinct from EOS, the chat template's "
       "end-of-turn token in generation's eos_token_id, BOS added once?",
       "a two-turn conversation rendered with the checkpoint's own chat template: the first special token after the "
       "assistant's text (the end of turn) against `generation_config.json`'s `eos_token_id` (else config.json's); "
       "the first ids of the rendered text encoded by `tokenizer(text)` against "
       "`apply_chat_template(tokenize=True)` for a doubled BOS (template BOS + the tokenizer's: the official "
       "Llama-3 / Gemma 3 layout, transformers #37686) — a trap only for code that renders then encodes, since "
       "`apply_chat_template(tokenize=True)`, trl's path for conversational rows, adds no second BOS; notebook 07's "
       "`data.template` counts the batched rows that start with BOS twice; pad missing or equal to EOS",
       **{"pass": "consistent",
          "warn": "no pad token, pad = EOS, or render-then-encode doubles BOS (the real batches: data.template)",
          "fail": "end of turn not an EOS for generation",
          "error": "the tokenizer does not load",
          "skip": "no tokenizer files"}),
    _c("config.tied_embeddings", "00_saved_files",
       "Does tie_word_embeddings agree with the saved head and embeddings, and with what the adapter trains?",
       "`tie_word_embeddings` (top level, else the text config) against the saved head and embeddings (shape and "
       "first + last 4 KiB) and against the adapter (`modules_to_save` or LoRA on `lm_head` / `embed_tokens`, "
       "`trainable_token_indices`, unless `ensure_weight_tying`)",
       **{"pass": "consistent, with the tie from_pretrained makes (a head config.json declares untied and saves apart "
                  "stays apart though T5/mT5's config class forces the tie)",
          "warn": "identical tensors declared untied",
          "fail": "tied while the adapter or checkpoint trains them apart, or untied with no head saved"}),
    _c("config.quantization", "00_saved_files",
       "Does quantization_config in config.json agree with the dtypes in the weights, and is the adapter's base "
       "pre-quantized (a merge into it rounds the update)?",
       "`quantization_config` against the weights: dtypes per header, and tensors only quantization writes "
       "(`.absmax`, `.quant_map`, `.quant_state.*`, `.SCB`, `.qweight`, `.scales`, fp8 weights with scales)",
       **{"pass": "declaration and weights agree",
          "warn": "an adapter on a pre-quantized base",
          "fail": "a 16-bit model declaring 4-bit, or quantized weights with no declaration"}),
    _c("config.generation", "00_saved_files",
       "Does generation_config.json pass the strict validation save_pretrained runs at every checkpoint save?",
       "`generation_config.json` through `GenerationConfig.validate(strict=True)`, what `save_pretrained` runs when "
       "the Trainer saves a checkpoint (and the lenient validation, for errors that break loading)",
       **{"pass": "valid",
          "warn": "refused by the strict validation (raises at save once modified)",
          "fail": "invalid even to the lenient validation",
          "skip": "no generation_config.json"}),
    _c("checkpoint.integrity", "01_dtype_distribution",
       "Are the checkpoint's files present and whole: shards listed in the index present and holding what it says, "
       "headers that parse, data that matches its header?",
       "files present, shards listed in the index present and holding what the index says, headers parse, data "
       "matches headers (truncation, overlapping offsets), stray or pickle files",
       **{"pass": "complete and consistent",
          "warn": "loads, with oddities (stray files, mixed .bin)",
          "fail": "damaged: missing shard, truncated file, lying header"}),
    _c("dtype.census", "01_dtype_distribution",
       "Which dtypes do the parameters and buffers have, per component found from the model's structure (vision / "
       "projector / language / encoder / decoder / head), as the set-up loads them, beside the header census? Tied "
       "tensors are counted once.",
       "dtype counts of parameters **and** buffers per component (vision / projector / language / encoder / decoder "
       "/ head / other), from the model's structure; the header census beside it; a tied tensor (`lm_head.weight` "
       "**is** `model.embed_tokens.weight`) counted once, under the name `named_parameters()` keeps, and shown as "
       "`tied (counted once): lm_head.weight = model.embed_tokens.weight` — in the header census too, where a "
       "checkpoint that saved both keys is noted as \"saved twice\"",
       **{"pass": "the census (always; it is evidence, not a verdict)"}),
    _c("dtype.quantized_census", "01_dtype_distribution",
       "What does the census look like under 4-bit and 8-bit: predicted on the meta device by transformers' own "
       "bitsandbytes quantizer, verified by a real load where the checkpoint is small?",
       "the census under 4-bit and 8-bit, predicted on the meta device with transformers' own bitsandbytes quantizer "
       "on a skeleton tied as from_pretrained ties it (`tie_weights()`: T5's `shared` / `encoder.embed_tokens` / "
       "`decoder.embed_tokens` / `lm_head` are one tensor); every tensor the quantizer leaves alone takes the dtype "
       "transformers' loader gives it (the class's `_get_dtype_plan`: `_keep_in_fp32_modules` in fp16 loads only, "
       "`_keep_in_fp32_modules_strict` in fp16 and bf16; else the dtype the class builds it in), and the whole is "
       "verified by a real load when the checkpoint is below `real_quant_max_bytes`; a \"tied (counted once)\" column shows the tied names of each scenario",
       **{"pass": "prediction (and, where run, the real load) agree",
          "warn": "prediction and real load disagree"}),
    _c("dtype.fp32_islands", "01_dtype_distribution",
       "Which floating tensors differ from the compute dtype, frozen modules and buffers first?",
       "floating tensors whose dtype differs from the compute dtype, frozen modules and buffers first, a tied tensor "
       "once. Intentional (info): rotary frequencies — the non-persistent buffers of a rotary module (one with "
       "transformers' `rope_type`, or a `*RotaryEmbedding` class), whatever their name (Gemma 3's "
       "`sliding_attention_inv_freq`); `_keep_in_fp32_modules`; PEFT's fp32 adapter weights; in a k-bit model whose "
       "non-quantized parameters are **all** fp32, the upcast of peft's `prepare_model_for_kbit_training` (the "
       "finding names the peft release: it casts every non-quantized fp16/bf16 parameter to fp32, and bitsandbytes' "
       "k-bit layers return their input's dtype, so activations stay fp32 and meet no bf16 weight); and *contained* "
       "tensors, of a module that returns its input's dtype when called on a tiny compute-dtype input (Gemma 3's "
       "RMSNorm `output.type_as(x)`, `nn.LayerNorm`, a Linear4bit's fp32 bias) or, in one traced eval forward of "
       "the diagnosis batch, of a module that hands back the compute dtype (a positions table judged by the module "
       "that consumes it); a buffer in a tower the batch never reaches is contained when a traced module of the "
       "same class is, else the class's own choice when the class builds it in that dtype (rebuilt on meta). "
       "Suspicious (warn): the rest — e.g. "
       "fp32 Llama/Qwen2/Mistral norms (`weight * x.to(input_dtype)` is fp32) before a bf16 head, and a k-bit model "
       "that mixes fp32 with non-quantized half-precision parameters (older trl's `peft_module_casting_to_bf16`: the "
       "demo's `qlora_trl_legacy` set-up), named in the detail",
       **{"pass": "none",
          "info": "only intentional or contained ones (rotary buffers, _keep_in_fp32_modules, PEFT's fp32 adapters, "
          "the all-fp32 state of prepare_model_for_kbit_training, tensors whose module hands back the compute dtype "
          "in a traced forward, tables the class itself builds in fp32 in a tower the batch does not reach)",
          "warn": "islands that can promote activations"}),
    _c("parallel.trainer_wrap", "02_dataparallel",
       "Will the installed transformers.Trainer wrap the model in nn.DataParallel with N GPUs; effective n_gpu, "
       "train batch and steps per epoch; does a forward survive a replica thread?",
       "what the **installed** `transformers.Trainer` does with the model when the process sees N GPUs: "
       "`is_model_parallel`, effective `n_gpu`, whether `_wrap_model` returns `nn.DataParallel`, train batch and "
       "steps per epoch (136 → 68 on 2 GPUs); a forward in a replica thread started under autocast (where it crashes, "
       "the main thread's under autocast beside it, the contrast); the verdict of "
       "every other release line; the fixes with their trade-offs. Without `--gpus`, one GPU is judged and what 2 GPUs in "
       "one process would do is observed too: a crash there is a `warn` naming that launch",
       **{"pass": "no wrap, batch as configured",
          "warn": "wrapped but the replica forward survives, or the batch is multiplied without a wrap; or, GPUs not "
                  "stated, 2 GPUs in one process would wrap it and the replica forward crashes",
          "fail": "wrapped on the GPUs you stated (--gpus N) and the replica forward crashes"}),
    _c("parallel.device_map", "02_dataparallel",
       "What does device_map give (or would give on N GPUs with --max-memory): devices spanned, cpu/disk entries?",
       "the loaded `hf_device_map` (GPUs spanned, cpu/disk entries) and what `device_map=\"auto\"`/`\"balanced\"` would "
       "give on N GPUs with `--max-memory`, predicted on the meta device by transformers' own `_get_device_map`",
       **{"pass": "spans the GPUs, nothing offloaded",
          "info": "the whole model lands on one GPU",
          "warn": "offload, or bitsandbytes refusing cpu entries"}),
    _c("peft.attributes", "03_peft_attributes",
       "Which attributes the Trainer and accelerate read survive each wrapping step (raw → k-bit → PEFT → Trainer → "
       "your set-up)?",
       "every attribute the Trainer and accelerate read (`hf_device_map`, `is_loaded_in_4bit/8bit`, "
       "`quantization_method`, `is_parallelizable`, `model_parallel`, `_hf_peft_config_loaded`, gradient "
       "checkpointing, dtype, device, trainable counts …) after each step: raw model → "
       "`prepare_model_for_kbit_training` → `get_peft_model` / `PeftModel.from_pretrained` → `Trainer` → your "
       "set-up; own, `↪ forwarded` through `__getattr__`, or lost",
       **{"info": "the table; nothing the Trainer reads is lost",
          "fail": "a Trainer-read attribute changes or is lost"}),
    _c("peft.layer_status", "03_peft_attributes",
       "What does PEFT's own get_layer_status / get_model_status say per adapter layer, and do LoRA A/B dtypes match "
       "the base layer's compute dtype?",
       "PEFT's own `get_model_status` / `get_layer_status` per adapter layer (enabled, active, merged, "
       "requires_grad, devices), plus LoRA A/B dtype against the base layer's compute dtype",
       **{"pass": "regular",
          "info": "A/B dtype differs (PEFT casts around it)",
          "warn": "irregular or disabled layers",
          "skip": "no adapter"}),
    _c("grad.flow", "04_forward_checks",
       "After one training step, which trainable tensors have a gradient that is None or zero, per component?",
       "one training step (forward with labels under autocast, backward): trainable tensors whose gradient is None "
       "or zero, per component, LoRA A/B apart, names normalized across `module.` / `base_model.model.`; the cause "
       "named from a trace of the forward, op by op (which trainable tensors each value depends on, through floating "
       "values or only through integer choices, and where autograd was cut: inside `torch.utils.checkpoint`, in "
       "transformers' own code, or in other code, with its file:line) and, for a zero gradient, whether the loss "
       "moves at all when the tensor is shifted by 1 % (values restored bit for bit). `lora_A` exactly zero while "
       "its `lora_B` is still zero is normal and not flagged",
       **{"pass": "every trainable tensor gets a gradient (lora_A zero while lora_B is zero is normal)",
          "info": "the rest get none by this batch's or the model's own design, each cause named: not read by this "
                  "batch (global attention, image newline, an unpicked expert, a vision LoRA on a text-only batch), "
                  "read only into a top-k/argmax choice (router and indexer biases), computed without grad by the "
                  "library (sinusoidal tables), or a loss that does not move with them (a zero-initialized gate); or "
                  "some are offloaded by a cpu/disk device map (their gradient lands on accelerate's temporary copy: "
                  "named, not judged)",
          "fail": "trainable tensors get none, or 4-bit layers were handed over packed for CPU inference; the cause "
                  "named: reentrant checkpointing (also of a tower whose input needs no grad, trl #835), code that "
                  "detaches them (its file:line), a backward that drops a gradient the loss depends on, all-zero tensors "
                  "that hold each other's gradient at zero (two zero factors of one product, lora_A and lora_B both "
                  "zero: none moves the loss alone, none can move first; past 16 zero gradients, told from a dropped "
                  "gradient by one step with the all-zero ones shifted together); or the step "
                  "raises in the model's own transformers code on any batch, a known incompatibility of the stack "
                  "(the raising file:line read from the traceback, the versions, the condition; the same step "
                  "without autocast run once to check the fix); zero gradients whose shift would copy more than "
                  "half the free memory stay unexplained, and it says why",
          "error": "the step itself crashed",
          "skip": "nothing trainable, or every trainable tensor offloaded (cpu/disk device map)"}),
    _c("forward.mixed_precision_buffers", "04_forward_checks",
       "With FSDP-style mixed precision (parameters cast, buffers not), does a buffer promote activations?",
       "FSDP `MixedPrecisionPolicy` simulated: floating parameters cast to the compute dtype, buffers left alone, "
       "forward traced; buffers (frozen modules first) that promote activations — the Gemma-4 `std_bias` case",
       **{"pass": "no buffer off the compute dtype",
          "info": "buffers off the compute dtype that promote nothing",
          "warn": "the forward with every parameter cast breaks in a transformers module of its own (its class and "
                  "source named), not in a buffer",
          "fail": "a buffer promotes activations (named)"}),
    _c("forward.scenarios", "04_forward_checks",
       "Which forward passes of the scenario matrix (eval/train × autocast × replica thread × adapters) pass?",
       "eval/train × no autocast / autocast / a replica thread started under autocast × adapters on/off, on image + "
       "text for VLMs: pass/fail, exception, output dtype and shape, NaN/inf, as a coloured grid; only distinct "
       "forwards run (eval without autocast is the forward that accepted the batch; a replica thread runs without "
       "autocast, as torch is asked in such a thread, and autocast does not cast to fp32: those cells take their "
       "mode's no-autocast result, said in the cell)",
       **{"pass": "every scenario passes",
          "fail": "a scenario fails (with its error)"}),
    _c("forward.dtype_flow", "04_forward_checks",
       "In the first failing scenario, which module's input dtype disagrees with its weight, and which module "
       "produced that input?",
       "the first failing cell traced module by module: the module whose input dtype disagrees with its weight, and "
       "the module that produced that activation (\"`norm` (float32) outputs float32 → `lm_head` (bfloat16) raises\"), "
       "with the fix for that cause",
       **{"pass": "nothing failed",
          "warn": "a failure that is not a dtype mismatch",
          "fail": "the producing and the raising module named"}),
    _c("eval.metrics", "05_evaluation",
       "Per recipe: the metrics on the evaluation set, the best recipe and its gain over the base.",
       "every recipe (and the original base as a reference row) on the evaluation set: greedy answers parsed (`[x1, "
       "y1, x2, y2]` or Qwen2-VL's `(x1,y1),(x2,y2)`), the grounding table (Mean IoU, Det rate, IoU>0.5, IoU>0.7) plus "
       "exact match and teacher-forced loss / token accuracy from a metric registry; best recipe and its gain over "
       "the base; per-sample failures (parse errors, exceptions, unreadable dataset rows) kept and shown; a recipe "
       "whose head cannot answer an image and a question (a classifier, a bare encoder, a text-only LM: "
       "`workbench.model.heads`) is loaded and measured but not scored, its reason named",
       **{"pass": "every recipe evaluated",
          "warn": "a recipe could not load, or every sample raised",
          "error": "no recipe could, or the dataset has no usable row",
          "skip": "no dataset, or no recipe's head can be scored by these metrics (the reason and the class "
                  "named)"}),
    _c("eval.memory", "05_evaluation",
       "Is memory freed between recipes: peak per recipe, and what is still held after freeing?",
       "each recipe loaded alone, freed before the next (gc; `empty_cache` + `synchronize` on CUDA); peak memory per "
       "recipe (CUDA max allocated, or RSS on CPU) and memory still held after freeing",
       **{"pass": "freed",
          "warn": "memory held grows from one recipe to the next"}),
    _c("adapter.base_model", "05_evaluation",
       "Was the adapter loaded onto the base it was trained on (adapter_config.json against the loaded base, LoRA "
       "shapes, sampled weights)?",
       "the base an adapter records (`base_model_name_or_path`, `revision`) against the base actually loaded; every "
       "`lora_A`/`lora_B` against its base module's shape (meta skeleton); which components differ between the "
       "recorded and the loaded base (sampled bytes of every tensor); the lineage chain base ⇢ stage 1 → stage-2 "
       "adapter drawn as a graph",
       **{"pass": "the recorded base",
          "info": "another path with identical weights (a copy)",
          "warn": "the recorded base is a hub id not in the offline cache",
          "fail": "another base, naming both",
          "error": "the recorded base cannot be found",
          "skip": "no adapter"}),
    _c("placement.offload", "05_evaluation",
       "Which modules landed on cpu / disk / meta, and what does that break (flash-attention)?",
       "`hf_device_map` after loading (before the adapter goes on): modules on cpu / disk / meta, with the bytes "
       "that did not fit; whether the attention implementation can run there",
       **{"pass": "nothing offloaded",
          "warn": "modules offloaded (named, with bytes)",
          "fail": "flash-attention with a module off CUDA"}),
    _c("distributed.ddp", "06_distributed",
       "Under torchrun and DDP: name prefixes, gradient sync, unused parameters, the Trainer's "
       "find_unused_parameters against reentrant checkpointing.",
       "under `torchrun --nproc_per_node N` (gloo on CPU, nccl with a GPU per rank), your set-up on every rank, "
       "wrapped in DDP: names gain `module.` (name-based selections counted on the bare model and on the wrapper — "
       "\"Base parameters enabled: 0\"); gradients present and equal on every rank after all-reduce (each "
       "rank its own batch); trainable tensors off the forward path; the installed Trainer's "
       "`find_unused_parameters` against reentrant checkpointing (\"Expected to mark a variable ready only once\"), "
       "the fixes tried; the DataLoader start method",
       **{"pass": "gradients equal on every rank",
          "warn": "unused tensors, or your name pattern loses matches",
          "fail": "the Trainer's wrapping raises, or gradients differ",
          "error": "a rank crashed or timed out",
          "skip": "not asked, or would not fit"}),
    _c("distributed.fsdp", "06_distributed",
       "Under FSDP2 with MixedPrecisionPolicy: does a buffer left in fp32 promote activations?",
       "FSDP2 `fully_shard` on the `_no_split_modules` blocks and the root with "
       "`MixedPrecisionPolicy(param_dtype=<compute dtype>)`, one step under the dtype tracer: the buffer off the "
       "compute dtype that promotes activations (module, buffer, dtype); `_keep_in_fp32_modules` parameters; rotary "
       "`inv_freq` intentional",
       **{"pass": "no promotion",
          "info": "the step runs; parameters kept in fp32 on purpose are cast by the policy, or buffers stay off "
                  "the compute dtype without promoting anything",
          "warn": "fails, not on a dtype",
          "fail": "the buffer named",
          "error": "a rank crashed or timed out",
          "skip": "not asked, or fully_shard refuses a quantized model"}),
    _c("data.labels", "07_data_path",
       "In the batches your run builds, which rows supervise nothing (every label -100: loss 0 or NaN), which "
       "supervise no token of their answer, which have a blank answer, which supervise the prompt when the run means "
       "answer-only loss?",
       "every row of the batches your run builds (your Trainer's collator, or trl's preparation and collator), "
       "padding removed: rows whose labels are all -100 (nothing supervised: loss 0, or NaN for a batch of them — "
       "trl #1191, unsloth #1128), rows where no token of the answer (after the last assistant header, or the "
       "completion) is supervised, blank answers (the answer's supervised tokens only end-of-turn / EOS and "
       "whitespace: an empty completion or assistant message teaches the model to answer with EOS alone — unsloth "
       "#2515, OpenRLHF #985), prompt tokens supervised when the run means completion-only / assistant-only "
       "loss, rows trl drops for having nothing to supervise; each category with its share and the rows named. The "
       "prompt's -100 under answer-only loss and padding's -100 are by design; rows whose answer max_length cut away "
       "entirely are counted and left to `data.truncation`",
       **{"pass": "every answer supervised, none blank, prompts masked",
          "info": "whole-sequence loss: prompts supervised by design; or answers lost to max_length (data.truncation's)",
          "warn": "prompts supervised under answer-only loss, or < 1 % of rows dropped by trl as unsupervised or with a "
                  "blank answer",
          "fail": "rows with nothing supervised (batched, or ≥ 1 % dropped by trl), answers unsupervised, or ≥ 1 % of "
                  "rows with a blank answer (rows named)",
          "skip": "no --data"}),
    _c("data.eos", "07_data_path",
       "Is the end-of-turn / EOS token a supervised label in every row that reaches a batch whole?",
       "share of the rows that reach a batch whole (cut rows are `data.truncation`'s) whose EOS — the tokenizer's, "
       "and the template's end-of-turn token found by rendering a probe conversation — is a supervised label; at 0 % "
       "with pad = EOS the cause is named with both ids (a collator that masks padding by id masks every EOS: "
       "endless generation, trl #3091, #1623)",
       **{"pass": "in every uncut row",
          "warn": "missing or masked in some rows (named)",
          "fail": "in none: the model never learns to stop (pad = EOS masked as padding, named by id)",
          "skip": "no --data, or no uncut supervised row"}),
    _c("data.truncation", "07_data_path",
       "Which rows does max_length cut, and of those, whose answer is cut or lost entirely? The length distribution "
       "against max_length.",
       "each row's length before truncation against `max_length` (your Trainer's `args.max_length`, else "
       "`max_length` in `--params`, else trl's default 1024) with trl's `truncation_mode` slice: rows cut, answers "
       "cut (their end and EOS never seen), answers lost entirely (and rows trl then drops), the length distribution "
       "plotted with `max_length` marked",
       **{"pass": "no row cut",
          "warn": "rows cut, answers (nearly all) intact",
          "fail": "answers lost, or cut in ≥ 1 % of rows (named)",
          "skip": "no --data"}),
    _c("data.template", "07_data_path",
       "Does a batched row start with BOS twice (template BOS + tokenizer BOS), does render-then-encode differ from "
       "apply_chat_template(tokenize=True), does the raw text hold special tokens?",
       "batched rows that start with BOS twice (a template that renders `{{ bos_token }}` + a tokenizer that adds "
       "BOS: transformers #37686 — the case of rows stored already rendered); on the first 64 conversational rows, "
       "`apply_chat_template(tokenize=False)` then `tokenizer(text)` against `apply_chat_template(tokenize=True)`, "
       "the first differing position shown; special-token strings written into the rows' own text (messages, prompt, "
       "completion as written, before trl appends the EOS text). A tokenizer without BOS cannot double it",
       **{"pass": "template, tokenizer and text agree (no BOS at all cannot double)",
          "warn": "render-then-encode differs, or special tokens in the text (rows named)",
          "fail": "batched rows start with BOS twice",
          "skip": "no --data"}),
    _c("data.pairs", "07_data_path",
       "In a preference run (trl's DPOTrainer), which pairs have chosen == rejected where the loss reads them — "
       "identical rows, or rows that differ only past max_length?",
       "the trainer's own tokenized `train_dataset` (`prompt_ids`, `chosen_ids`, `rejected_ids`) through its own "
       "collator (`DataCollatorForPreference`: chosen rows, then rejected rows, truncated to `max_length` by "
       "`truncation_mode`, `completion_mask` marking what survives; trl 1.16 dpo_trainer.py:147-200), at most 2,000 "
       "pairs: a pair whose surviving completion tokens are equal has margin 0 at every step and trains nothing; "
       "≥ 1 % of the pairs read: `fail` (data.labels' threshold), fewer: `warn`, rows named",
       **{"pass": "every pair differs where the loss reads it",
          "warn": "under 1 % of the pairs identical (rows named)",
          "fail": "1 % of the pairs or more identical (rows named; those max_length cut away said)",
          "skip": "no preference trainer (the callback's live DPOTrainer, or one your set-up returns)"}),
    _c("run.loss", "08_training_run",
       "What does the logged training loss say: a NaN hidden as 0.0, labels all masked, a logged NaN, a first loss "
       "inflated by gradient accumulation, a flat loss?",
       "the longest `trainer_state.json` of the output directory (the root's or a `checkpoint-N/`'s) read into "
       "columns: `loss == 0.0` with `grad_norm` nan/inf is a NaN loss that `logging_nan_inf_filter` (on by default) "
       "logged as the window's mean of earlier losses, 0.0 once the weights are NaN (reproduced with transformers "
       "5.23; the first checkpoint after it is read for NaN/inf tensors when under 256 MiB); `loss == 0.0` with "
       "`grad_norm == 0.0` is a batch whose labels are all -100; `train_loss` averaging those 0.0 windows in; the "
       "first logged loss against ln(classes) of a fresh head (the vocabulary, or `num_labels` of a classifier): "
       "≥ 1.8× and near an integer k is the gradient-accumulation signature (transformers #34263, #35663 in "
       "4.48.0, #47688 for sequence/token classification in 5.x), `fail` when the recorded `gradient_accumulation_steps` "
       "is k; the last fifth's median within 2 % of the first fifth's (≥ 10 logged losses): flat",
       **{"pass": "finite, supervised, falling",
          "warn": "first loss k× ln(classes) (accumulation not recorded), a flat loss, or a few all-masked steps",
          "fail": "a NaN hidden as 0.0 or logged, every step all-masked, or the inflation with k = the recorded "
                  "gradient_accumulation_steps",
          "skip": "no loss logged, or not a Trainer output directory"}),
    _c("run.gradients", "08_training_run",
       "What does the logged grad_norm say: steps the fp16 GradScaler skipped, no gradient reaching anything "
       "trainable, spikes?",
       "on the logged steps with a non-zero finite loss: `grad_norm` inf/nan with a finite loss (a step whose "
       "gradient overflowed; under fp16 the GradScaler skipped it), counted, with the learning rate at the next "
       "logged step: held (the scheduler saw the skip) or moved on (accelerate reports no skip for a fused optimizer, "
       "transformers' default `adamw_torch_fused` with torch ≥ 2.8: accelerate #4242, the schedule runs ahead of "
       "the updates) — up to 5 within the first 5 % of the run are the scaler finding its scale; `grad_norm == 0.0` while the "
       "loss is not 0.0 (no trainable tensor on the loss's graph: reentrant checkpointing without input grads, trl "
       "#835); spikes above 10× the run's median after its first tenth",
       **{"pass": "finite and non-zero",
          "info": "a few overflow skips at the start, or spikes (steps named)",
          "warn": "overflow skips later or in number, or grad_norm 0.0 at some steps",
          "fail": "grad_norm 0.0 at every step with a non-zero loss",
          "skip": "no grad_norm logged, no step with a non-zero loss, or not a Trainer output directory"}),
    _c("run.schedule", "08_training_run",
       "Does the learning rate do what the scheduler should: leave 0, leave its warmup, decay; did max_steps end "
       "the run before one epoch?",
       "the logged `learning_rate`: 0 at every step; rising at every logged step to the end of a finished run "
       "(`warmup_steps` ≥ `max_steps`); constant after its peak to `max_steps` while the recorded `lr_scheduler_type` "
       "decays (model card or `--allow-pickle`): a scheduler other than the recorded one ran "
       "(`Trainer(optimizers=(optimizer, scheduler))`; `reduce_lr_on_plateau` and `greedy` do not count as "
       "decaying); `epoch` < 1 when `global_step` reached `max_steps`; a run that stopped "
       "before `max_steps`",
       **{"pass": "warms up, peaks and follows its scheduler",
          "info": "max_steps ended the run before one epoch, the run stopped early, or it stopped during warmup",
          "warn": "never left warmup, or never decays although its scheduler should",
          "fail": "learning rate 0 at every step",
          "skip": "no learning rate logged, or not a Trainer output directory"}),
    _c("run.eval", "08_training_run",
       "What do the evaluations say: eval loss below train (leakage, a mismatched eval collator), evaluation only at "
       "the end or never, eval rising while train falls; which checkpoint to keep?",
       "each `eval_loss` against the smaller of the training losses logged at and just after its step (a falling "
       "curve alone never makes eval look lower): under 75 % of it and ≥ 0.25 nat below at most evaluations is "
       "`warn`; the last 4 evaluations rising while the training loss falls; the checkpoint to keep: "
       "`best_model_checkpoint` when recorded, else the lowest `eval_loss` among steps with a `checkpoint-N/` folder",
       **{"pass": "the checkpoint to keep named",
          "info": "no evaluation, or one at the end: nothing ranks the checkpoints",
          "warn": "eval below train at most evaluations, or eval rising while train falls",
          "skip": "not a Trainer output directory"}),
    _c("run.preference_signal", "08_training_run",
       "Does a preference run (trl's DPO, KTO, ORPO, CPO) see a difference between chosen and rejected: margins that "
       "leave 0?",
       "the trainer recognised from the run's files (`training_args.bin`'s class read from its pickle opcodes, never "
       "unpickled; the model card's trl tags; the keys logged — trl 1.16 sources in "
       "`workbench/probes/run/trl_trainers.yaml`); `rewards/margins` (β·(log π − log π_ref) of chosen minus "
       "rejected) exactly 0 at every logged step after the first (≥ 3 steps), the cause told apart: `beta=0` (trl "
       "#1627); `logps/chosen` == `logps/rejected` — identical pairs, or pairs that differ only past `max_length`; "
       "else the policy never left the reference (no update landed) — the sigmoid loss sits at ln 2",
       **{"pass": "margins leave 0 toward the chosen answers",
          "fail": "margins exactly 0 at every step: no preference signal (identical or truncated-away pairs, beta 0)",
          "skip": "not a preference run, no margins logged, or under 3 logged steps"}),
    _c("run.likelihood_displacement", "08_training_run",
       "In a DPO run, did the chosen answers lose likelihood against the reference while the margin grew?",
       "`rewards/chosen` / β in nats (the chosen completions' log-probability against the reference) at the end of "
       "the run, with the margin: under −2 nats while the margin grows is likelihood displacement (Razin et al. "
       "2024, arXiv:2410.08847; Pal et al. 2024, arXiv:2402.13228) — common and usually harmless, so `info`; `warn` "
       "only when the chosen answers lost more than the margin gained and the evaluation pairs' "
       "`eval_rewards/accuracies` fell 0.05 below its best",
       **{"pass": "the chosen answers keep their likelihood (above −2 nats against the reference)",
          "info": "the chosen answers lost likelihood while the margin grew (named, with the fix)",
          "warn": "the chosen answers lost more than the margin gained and held-out accuracy fell",
          "skip": "not a DPO run (ORPO and CPO have no reference, KTO no pairs), or under 5 logged steps"}),
    _c("run.reward_variance", "08_training_run",
       "In an online RL run (trl's GRPO, RLOO), did the completions of a prompt get different rewards, so that "
       "advantages and a policy gradient exist?",
       "`frac_reward_zero_std` (the share of prompt groups whose completions all got the same reward: zero "
       "advantages, no gradient) and each reward function's `rewards/<name>/std`: 1.0 at every logged step, or "
       "every function constant, is a run that cannot learn (a GRPO loss near 0 is normal, this is not); nine "
       "groups in ten alike over the last fifth: `warn`; half on average: `info`, with the share a 0/1 reward of "
       "the logged mean gives by chance over `num_generations` (DAPO arXiv:2503.14476; trl #3708)",
       **{"pass": "the rewards vary within the groups",
          "info": "half of the groups or more alike on average (expected with a 0/1 reward and few generations)",
          "warn": "nine groups in ten alike at the end of the run",
          "fail": "every group alike at every step, or every reward function constant: no policy gradient",
          "skip": "not an online RL run, or frac_reward_zero_std not logged"}),
    _c("run.completion_clipping", "08_training_run",
       "In an online RL run, did the completions end (EOS) before `max_completion_length`, or did the rewards judge "
       "cut-off text?",
       "`completions/clipped_ratio` (completions that reached the length without an EOS token), "
       "`completions/mean_length` and the recorded `max_completion_length` and `mask_truncated_completions`: 1.0 at "
       "every step or ≥ 0.9 over the last fifth: `fail`; ≥ 0.2 over the last fifth not masked out of the loss: "
       "`warn`; ≥ 0.05 or masked: `info` (DAPO arXiv:2503.14476, overlong filtering)",
       **{"pass": "nearly every completion ends before the limit",
          "info": "a few percent cut, or cut completions masked out of the loss",
          "warn": "a fifth or more of the completions cut at the end, not masked",
          "fail": "every (or nine in ten) completion cut off",
          "skip": "not an online RL run, or completions/clipped_ratio not logged"}),
    _c("run.policy_drift", "08_training_run",
       "In an online RL run, does the policy stay near its reference (KL) and keep exploring (entropy)?",
       "`kl` (logged when `beta` > 0): exactly 0 at every step while the rewards vary (the reference is the policy, "
       "or no update lands), or past 10× its first fifth and above 1 nat per token at the end (runaway); `entropy` "
       "in the last fifth under a tenth of the first fifth's: collapse (Cui et al. 2025, arXiv:2505.22617) — `warn`, "
       "`info` while the reward still improves",
       **{"pass": "KL small and moving, entropy kept",
          "info": "entropy collapsed while the reward still improves",
          "warn": "KL exactly 0 with varying rewards, KL runaway, or entropy collapsed with the reward stalled",
          "skip": "not an online RL run, or neither kl nor entropy logged"}),
    _c("run.reward_trend", "08_training_run",
       "In an online RL run, does the reward rise — and not only with the completions' length?",
       "the logged `reward` (≥ 10 steps): its last fifth's median more than twice the first fifth's spread (and 10 "
       "%) below the first fifth's is a reward falling over the run; rising while `completions/mean_length` grew ≥ "
       "1.5× with a correlation ≥ 0.8 is named as possible length hacking (Singhal et al. 2023, arXiv:2310.03716) — "
       "`info`, since a task that needs longer answers looks the same in a log",
       **{"pass": "the reward holds or rises",
          "info": "the reward rises with the completions' length",
          "warn": "the reward falls over the run",
          "skip": "not an online RL run, or under 10 logged rewards"}),
    _c("run.reward_model", "08_training_run",
       "Does a reward model (trl's RewardTrainer) tell chosen from rejected on its pairs, and on held-out pairs?",
       "`accuracy` on the training batches (last fifth) and `eval_accuracy` at the last evaluation: both ≤ 0.55 is "
       "chance; training ≥ 0.9 with evaluation 0.2 below it: the training pairs learned, not the preference",
       **{"pass": "the pairs are separated",
          "warn": "training pairs separated, held-out pairs not",
          "fail": "at chance on its pairs",
          "skip": "not a reward-model run"}),
    _c("run.adapter_progress", "08_training_run",
       "How did the adapter move across checkpoint-N/: update norm ‖B·A‖·scaling per component, modules that never "
       "moved, an adapter that stopped moving, non-finite values from a checkpoint on?",
       "each `checkpoint-N/` adapter file alone (headers and tensors, never the base): per checkpoint the update "
       "norm ‖B·A‖·scaling per component (`adapter.weights`' code), modules and components that never moved in any "
       "checkpoint (reentrant checkpointing without input grads: trl #835, unsloth #2142), an adapter that stopped "
       "moving, NaN/inf from checkpoint K on; the update norm per component plotted against step",
       **{"pass": "every component moves, finite",
          "warn": "modules or components that never moved, or an adapter that stopped moving",
          "fail": "non-finite values from a checkpoint on, or nothing ever moved",
          "skip": "no adapter in the checkpoints, or not a Trainer output directory"}),
    _c("run.versions", "08_training_run",
       "Do the run's recorded versions (model card, config.json, the adapter's PEFT version) fall in a known "
       "regression whose condition this run meets?",
       "the versions the run recorded (the model card's \"Framework versions\", `transformers_version` in "
       "config.json, the adapter's PEFT version) against a table of known regressions with citations (`python -m "
       "workbench regressions`), each row's condition (head kind, trainer class, gradient accumulation > 1, fp16, "
       "…) checked against this run — never a version match alone; rows carry exemptions read from the model's "
       "contract (e.g. `accepts_loss_kwargs = False`)",
       **{"pass": "no known regression applies",
          "info": "versions not recorded, or a regression whose condition the files cannot tell (the missing facts "
                  "named)",
          "warn": "a regression that misleads the log or costs memory applies, or one likely applies (the head "
                  "inferred from a trl trainer)",
          "fail": "a regression that makes training or its result wrong applies to this run (cited, with its fix)",
          "skip": "not a Trainer output directory"}),
    _c("train.loss_accumulation", "09_training_step",
       "Does gradient accumulation change the loss the Trainer optimises: equal, inflated ×k, or not token-weighted?",
       "the real Trainer (the class your set-up returned, else `transformers.Trainer`) runs one step twice with "
       "`learning_rate=0` on your model class — a copy of your model when ≤ 5M parameter elements and not offloaded "
       "(its adapter, else every parameter, made trainable on the copy when nothing is: an adapter loaded for "
       "inference, a frozen model), else a tiny twin (the same class from your config, shrunk; a VLM on text rows) — on the same rows: A = batch b·k × GA 1, B = batch b × GA k (k = your "
       "`gradient_accumulation_steps`, 4 when it is 1); the logged `loss` and `grad_norm` of B over A. ≈ k: forward "
       "takes `**kwargs` (the Trainer passes `num_items_in_batch` and skips its division by GA) but never hands them "
       "to its loss (transformers #47688: sequence/token-classification heads); neither 1 nor k: micro-batch means "
       "averaged (`accepts_loss_kwargs = False`, #37766). Says whether forward passes `**kwargs` to its loss. The "
       "configuration: your Trainer, `--training-args FILE`, the run's record, else the Trainer's defaults",
       **{"pass": "equal within 1e-4",
          "info": "inflated or not token-weighted, but the configuration (yours, or the defaults) does not "
                  "accumulate (GA 1)",
          "warn": "not token-weighted under your GA > 1",
          "fail": "inflated ×k with your gradient_accumulation_steps = k > 1",
          "skip": "a model without a label loss (a bare encoder), or one that reads no token ids (speech)"}),
    _c("train.fp16", "09_training_step",
       "Under fp16=True, is a trainable parameter stored in fp16 (GradScaler raises \"Attempting to unscale FP16 "
       "gradients\"), and how much headroom below 65504 do the activations keep?",
       "(a) trainable parameters stored in fp16 under `fp16=True` (a PEFT `modules_to_save` copy keeps the base "
       "dtype, peft #341); (b) one fp32 forward with hooks recording max |output| per module, log2(65504 / amax) in "
       "two views — AMP (what autocast makes fp16) and half weights (every tensor, the residual stream included) — "
       "the lowest-headroom tensors named, and the families vLLM refuses to run in fp16. Judged only when the "
       "configuration uses fp16. The forward that accepted the batch is that fp32 forward where every tensor is "
       "fp32; where fp16 is not configured and no tensor is fp16, it gives the information in the model's own "
       "dtype (bf16 keeps fp32's range), without a forward of its own",
       **{"pass": "no trainable fp16 tensor, headroom ≥ 4 bits",
          "info": "the configuration does not use fp16: the headroom as a figure, read from the forward that "
                  "accepted the batch (in the training callback, for a run that does not use fp16, not read)",
          "warn": "under 4 bits of headroom, or a model type vLLM refuses to run in fp16 (its list kept as data)",
          "fail": "a trainable fp16 parameter under fp16=True, or an activation that overflows fp16",
          "error": "the fp32 forward did not run (no batch this model accepts, or the fp32 copy of the weights it "
                   "needs would take more than half the free memory: both numbers given)",
          "skip": "no configuration to read"}),
    _c("train.ddp_checkpointing", "09_training_step",
       "Under DDP with activation checkpointing, does the run land in the cell that raises \"Expected to mark a "
       "variable ready only once\" (reentrant × find_unused_parameters=True × no static_graph)?",
       "the effective `use_reentrant`: the checkpoint function installed on the model (PEFT's "
       "`prepare_model_for_kbit_training` passes `{}`, so torch's default True applies), or what the Trainer's own "
       "`activation_checkpointing_enable(kwargs or None)` installs (None: transformers' `use_reentrant=False`), asked "
       "of a tiny twin; trl's forcing is in your trl trainer's args; the effective `find_unused_parameters` and "
       "`static_graph` from your Trainer's accelerator, else `Trainer._build_accelerator_args` on the prepared model "
       "(explicit `ddp_find_unused_parameters`, else True for anything that is not a `PreTrainedModel`, a "
       "`PeftModel` included). Notebook 06 with `--distributed 2` runs the cell on 2 gloo ranks",
       **{"pass": "no checkpointing, non-reentrant, static_graph, or find_unused_parameters=False",
          "info": "that cell, in the training callback for a run of one process: DDP wraps nothing, nothing raises",
          "warn": "that cell in a diagnosis, where the process count is not known: it raises under DDP (≥ 2 "
                  "processes), not in one",
          "fail": "reentrant checkpointing with find_unused_parameters=True and no static_graph, in a run the "
                  "callback sees launched on ≥ 2 processes (three fixes, safest first)",
          "skip": "no configuration to read"}),
    _c("train.fsdp_units", "09_training_step",
       "Will FSDP refuse a unit of the wrapped model (\"Must flatten tensors with uniform dtype\" / \"… uniform "
       "requires_grad\")?",
       "torch's auto-wrap walk replayed on a meta-device copy of the prepared model for the configured policy "
       "(transformer layer classes from the configuration or `_no_split_modules`, PEFT's `fsdp_auto_wrap_policy` "
       "where the Trainer applies it — FSDP1 only —, size-based; accelerate's FSDP2 grouping and fp32 upcast, built "
       "by accelerate's own `set_auto_wrap_policy`); per unit, as torch checks it: FSDP1 — one dtype, a floating "
       "first tensor, uniform `requires_grad` when "
       "`use_orig_params=False`; FSDP2 — one dtype among trainable parameters; QLoRA — `bnb_4bit_quant_storage` "
       "equal to the compute dtype",
       **{"pass": "every unit uniform (units listed)",
          "info": "the configuration does not use FSDP: the units it would make (in the training callback, for a run "
                  "that does not shard, none replayed)",
          "warn": "4-bit weights FSDP2 leaves unsharded (bnb_4bit_quant_storage differs from the compute dtype)",
          "fail": "a unit FSDP refuses, named with its tensors and torch's message (the FSDP1 messages checked "
                  "against real FSDP1 on one gloo rank)",
          "skip": "no configuration to read"}),
    _c("train.rl_rollout", "09_training_step",
       "Before a GRPO or RLOO run's first step: do your reward functions score the first generation batch "
       "differently, and do its completions end before max_completion_length?",
       "the trainer's own dataloader builds the first generation batch and its own `_generate_and_score_completions` "
       "generates, calls every reward function and computes the advantages (trl 1.16 grpo_trainer.py:2324, "
       "rloo_trainer.py:1458); what it appends to the trainer's metrics is read (`rewards/<name>/mean` and `/std`, "
       "`frac_reward_zero_std`, `completions/clipped_ratio`) and the metrics, the completions table and the token "
       "count are put back. A sample before any update: `warn`, not `fail` — the run autopsy judges the run",
       **{"pass": "the rewards vary and the completions end",
          "info": "half of the batch's prompt groups or more got one reward",
          "warn": "every reward function returned one value for every completion, or every completion ran to "
                  "max_completion_length",
          "skip": "not a GRPO or RLOO trainer (the callback's live trainer, or the one your set-up returns), or a "
                  "set-up's trainer whose accelerator state an earlier check reset (the callback runs it)"}),
    _c("train.reference_model", "09_training_step",
       "Does a trl trainer's reference model match its policy: dtype, device, the same model?",
       "the trainer's `ref_model` against its policy (a PEFT policy's base): trl keeps none for a PEFT policy, "
       "`precompute_ref_log_probs` or GRPO's `beta` 0, and otherwise builds it from the policy's path in the policy's "
       "dtype (trl 1.16 dpo_trainer.py:908-927, grpo_trainer.py:984-1003); a `ref_model` you pass in another dtype, on "
       "another device, or of another model type or size is a `warn` naming both sides (the memory from the "
       "parameters)",
       **{"pass": "the reference matches the policy",
          "info": "no separate reference (adapters disabled, precomputed log-probabilities, beta 0)",
          "warn": "another dtype, device or model than the policy",
          "skip": "no trl trainer with a reference (the callback's live trainer, or the one your set-up returns)"}),
    _c("serve.adapter", "10_serving",
       "Will each serving engine load this adapter, and compute the update PEFT trained?",
       "per engine — vLLM, llama.cpp (GGUF), TGI/LoRAX, SGLang — from `adapter_config.json` and the adapter's tensors "
       "(never the base): ERROR (will not load), FLAG (loads with a server flag, named: `--max-lora-rank 32`), SILENT "
       "(loads and computes another update: the factor, s·B·A's max relative difference against PEFT's, and the "
       "compensation, e.g. rsLoRA r=64 under llama.cpp's α/r: `--lora-scaled adapter.gguf:8`) or OK. The rules are "
       "data (`workbench/probes/serve/engine_rules.yaml`), each citing the engine's source file and issue; "
       "[docs/serving.md](serving.md) is generated from them. Judged over the engines you serve on (`serve_engines` "
       "in --params or `--serve`; none named: every engine, and what holds only for an engine you may not use is a `warn`)",
       **{"pass": "every engine served on loads it and computes PEFT's update",
          "warn": "an engine refuses it, or needs a named flag; or, with no engine named (--serve), one would "
                  "silently compute another update (the condition named)",
          "fail": "an engine you serve on (--serve, serve_engines) loads it and silently computes another update "
                  "(the factor and the fix named)",
          "skip": "no adapter"}),
    _c("serve.template", "10_serving",
       "Will the engine prompt with the chat template training used?",
       "`tokenizer_config.json`'s `chat_template` against `chat_template.jinja` when both exist and differ "
       "(llama.cpp's converter, gguf-py `SpecialVocab`, takes the first; transformers the second), a template only "
       "the adapter's tokenizer carries, tokens added in training beyond the base's vocabulary (vLLM #28382)",
       **{"pass": "one template, the one training used",
          "warn": "a template or added tokens an engine may not use; or, with no engine named (--serve), llama.cpp "
                  "would prompt with another template",
          "fail": "an engine you serve on (--serve, serve_engines) will prompt with another template",
          "skip": "no chat template"}),
    _c("serve.merge", "10_serving",
       "Does merge_and_unload() give the model the adapter trained?",
       "PEFT's own merge (`merge_adapter(safe_merge=True)`) on the prepared model against the unmerged forward on "
       "the same batch: max logit difference and top-1 agreement; on a 4-bit base, the requantization of merging "
       "into 4-bit weights (transformers #31293, peft #2321) with the fix (dequantize, then merge); a tied head "
       "after merging. The model is restored exactly (its Parameter objects and merged flags); no extra load",
       **{"pass": "every logit within the dtype's rounding (a top-1 token that changes there is a near-tie the rounding "
                  "alone turns, counted in the evidence)",
          "warn": "beyond rounding, top-1 agreement ≥ 90 %; or a 4-bit base's requantization, whatever the agreement "
                  "(it applies if you merge into the 4-bit base, which you did not say you do)",
          "fail": "beyond rounding with top-1 agreement below 90 %, on a base that is not 4-bit or through a tied head",
          "skip": "no adapter"}),
    _c("plan.memory", "11_memory_plan",
       "Will one training step of this model under --training-args fit the GPU: the peak by category and phase?",
       "`workbench plan` on the diagnosed checkpoint (its config.json; no weight read) with the run's "
       "--training-args and set-up (`qlora`: the 4-bit base): two training steps of the model's own code, PEFT's own "
       "wrapping, the optimizer the Trainer picks and the loss under autocast on fake tensors at full size "
       "(torch's MemTracker), plus the lines fake tensors cannot see as cited data; judged against the GPU the "
       "parameters name (`plan_gpu`, `plan_memory`), with the largest batch and sequence and each toggle's saving",
       **{"pass": "fits the named GPU",
          "info": "no GPU named: the planned peak and its breakdown",
          "fail": "does not fit the named GPU (the toggles that make it fit named)",
          "skip": "no --training-args, or a model the planner cannot step (its batch is no token ids with labels: "
                  "speech, a bare encoder; an operator whose output shape depends on values, as DeBERTa-v2's)"}),
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


CHECK_IDS = frozenset(c.id for c in CHECKS)

# The sweep's comparison notebook (`workbench sweep`): numbered after the report notebooks, but run once per sweep
# over its members' reports, never on one checkpoint; it answers no check. `find_notebooks` leaves it out.
SWEEP_NOTEBOOK = "12_sweep"
CHECKS_BY_ID: Mapping[str, Check] = {c.id: c for c in CHECKS}


def markdown_table() -> str:
    """The README's catalog table."""
    lines = ["| id | notebook | what it answers | verdicts |", "|---|---|---|---|"]
    for c in CHECKS:
        verdicts = " · ".join(f"`{v}` {meaning}" for v, meaning in c.verdicts.items())
        lines.append(f"| `{c.id}` | {c.notebook[:2]} | {c.question} | {verdicts} |")
    return "\n".join(lines)
