"""`tokenizer.vocab` and `tokenizer.special_tokens`: the tokenizer files against the embeddings and the chat template.

tokenizer.vocab: len(tokenizer), the largest id of any added or special token, config.vocab_size, the rows of the
input and output embeddings in the base's safetensors headers and the rows an adapter saves for them
(modules_to_save, trainable_token_indices). An id at or past the embedding rows surfaces in training as a CUDA
"device-side assert" / "index out of range" (transformers #24698); tokens added in training with the embeddings
resized but not saved with the adapter leave the adapter unloadable on the base (peft #1457, #2898).

tokenizer.special_tokens: no pad token; pad = EOS (the usual collator masks the EOS like padding and the model never
learns to stop: trl #3091, #1623); generation's eos_token_id without the chat template's end-of-turn token
(generation runs to max_new_tokens: llama-cookbook #640); a template that writes BOS while the tokenizer adds it
again (the official Llama-3 and Gemma 3 layout): rendering then encoding doubles BOS (transformers #37686), while
apply_chat_template(tokenize=True), trl's path for conversational rows, does not. Only code that renders then
encodes is exposed, so this is a warn here; notebook 07's data.template counts the doubled rows in the real batches.
Checked by rendering a short conversation with the checkpoint's own template and encoding it both ways.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from workbench.display.nodes import facts_table
from workbench.display.result import ProbeResult
from workbench.findings import Finding
from workbench.probes.saved.files import SavedFiles

VOCAB = "tokenizer.vocab"
SPECIAL = "tokenizer.special_tokens"
MARKER = "Paris is the capital."
CONVERSATION = [{"role": "user", "content": "What is the capital of France?"},
                {"role": "assistant", "content": MARKER}]


def _tokenizer(files: SavedFiles, result):
    """The loaded tokenizer, or None with the result's `skipped` (no files) or `error` (it does not load) set."""
    if files.tokenizer_dir is None:
        folders = " or ".join(str(f) for f in (files.adapter_dir, files.model_dir) if f)
        result.skipped = f"No tokenizer files (tokenizer.json, tokenizer_config.json) in {folders}."
        return None
    tok = files.tokenizer
    if tok is None:
        result.error = files.tokenizer_error
    return tok


# --- tokenizer.vocab ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(repr=False)
class VocabResult(ProbeResult):
    tokenizer_dir: str | None
    skipped: str | None = None
    error: str | None = None
    tokenizer_len: int | None = None
    max_special_id: int | None = None  # the largest id of any added or special token
    max_special_token: str | None = None
    config_vocab_size: int | None = None
    input_rows: int | None = None  # rows of the base's input embeddings (headers)
    output_rows: int | None = None
    input_tensor: str | None = None
    output_tensor: str | None = None
    adapter_rows: dict[str, int] = dataclasses.field(default_factory=dict)  # saved tensor -> rows
    trainable_token_indices: Any = None
    tokenizer_in_adapter: bool = False

    def findings(self) -> list[Finding]:
        evidence = {k: v for k, v in dataclasses.asdict(self).items() if k not in ("skipped", "error")}
        if self.skipped:
            return [Finding(VOCAB, "skip", "No tokenizer to compare with the embeddings", self.skipped, evidence)]
        if self.error:
            return [Finding(VOCAB, "error", "The tokenizer could not load", self.error, evidence,
                            "Re-save the tokenizer with `tokenizer.save_pretrained(folder)` from the training run.")]
        rows = self.adapter_embedding_rows or self.input_rows
        where = ("the embeddings the adapter saves" if self.adapter_embedding_rows else
                 f"the base's input embeddings ({self.input_tensor})")
        top = max(x for x in (self.max_special_id, (self.tokenizer_len or 0) - 1, self.max_trainable_index)
                  if x is not None)
        if rows is not None and top >= rows:
            if self.tokenizer_in_adapter and not self.adapter_embedding_rows:
                return [Finding(VOCAB, "fail", f"Tokens added in training but the resized embeddings were not "
                                f"saved: tokenizer {self.tokenizer_len} tokens, base embeddings {rows} rows",
                                f"The adapter's tokenizer has {self.tokenizer_len} tokens (largest added/special id "
                                f"{self.max_special_id} = {self.max_special_token!r}) but the adapter saves no "
                                f"embedding rows, and {where} has {rows}: the new tokens have no trained embedding, "
                                "and the base cannot even look them up (peft #1457, #2898).", evidence,
                                "Save the resized embeddings with the adapter: `LoraConfig(..., modules_to_save="
                                "['embed_tokens', 'lm_head'])` (or `trainable_token_indices=[new ids]`), and "
                                "before loading `base.resize_token_embeddings(len(tokenizer))`.")]
            return [Finding(VOCAB, "fail", f"Token id {top} is past the embedding rows ({rows})",
                            f"The tokenizer ({self.tokenizer_len} tokens, largest added/special id "
                            f"{self.max_special_id} = {self.max_special_token!r}) produces ids that {where} "
                            f"({rows} rows) cannot look up: training stops with a CUDA \"device-side assert\" / "
                            "\"index out of range\" at the first batch holding one (transformers #24698).", evidence,
                            "`model.resize_token_embeddings(len(tokenizer))` after adding tokens, and save the "
                            "resized embeddings (`modules_to_save=['embed_tokens', 'lm_head']` for an adapter).")]
        if self.adapter_rows and self.input_rows and self.adapter_embedding_rows \
                and self.adapter_embedding_rows != self.input_rows:
            return [Finding(VOCAB, "info", f"The adapter saves {self.adapter_embedding_rows} embedding rows; the "
                            f"base has {self.input_rows}",
                            "Resized in training: the base must be resized the same way before the adapter loads.",
                            evidence, f"`base.resize_token_embeddings({self.adapter_embedding_rows})` before "
                            "`PeftModel.from_pretrained(base, adapter)`.")]
        return [Finding(VOCAB, "pass", f"Every token id fits the embeddings: tokenizer {self.tokenizer_len}, "
                        f"embedding rows {rows}",
                        f"Largest added/special id {self.max_special_id} ({self.max_special_token!r}); "
                        f"config.vocab_size {self.config_vocab_size}; input/output embedding rows "
                        f"{self.input_rows}/{self.output_rows}.", evidence)]

    @property
    def max_trainable_index(self) -> int | None:
        """The largest row trainable_token_indices trains (a list, or {module: list})."""
        value = self.trainable_token_indices
        ids = [i for v in value.values() for i in v] if isinstance(value, dict) else list(value or [])
        return max(ids) if ids else None

    @property
    def adapter_embedding_rows(self) -> int | None:
        rows = [r for name, r in self.adapter_rows.items() if "embed" in name or "wte" in name]
        return max(rows) if rows else None

    def details(self):
        return facts_table([
            ("tokenizer folder", self.tokenizer_dir), ("len(tokenizer)", self.tokenizer_len),
            ("largest added/special id", f"{self.max_special_id} {self.max_special_token!r}"),
            ("config vocab_size", self.config_vocab_size), (f"input embeddings {self.input_tensor}", self.input_rows),
            (f"output embeddings {self.output_tensor}", self.output_rows),
            ("adapter's embedding rows", self.adapter_rows or None),
            ("trainable_token_indices", self.trainable_token_indices)])


def special_ids(tok) -> tuple[int | None, str | None]:
    ids: dict[int, str] = {}
    for idx, added in (getattr(tok, "added_tokens_decoder", None) or {}).items():
        ids[int(idx)] = str(added)
    for token, idx in zip(tok.all_special_tokens, tok.all_special_ids):
        if idx is not None:
            ids[int(idx)] = token
    if not ids:
        return None, None
    top = max(ids)
    return top, ids[top]


def tokenizer_vocab_probe(files: SavedFiles) -> VocabResult:
    """len(tokenizer) and its largest special id against the embedding rows of the base and the adapter."""
    result = VocabResult(str(files.tokenizer_dir) if files.tokenizer_dir else None)
    tok = _tokenizer(files, result)
    if tok is None:
        return result
    result.tokenizer_in_adapter = files.adapter_dir is not None and files.tokenizer_dir == files.adapter_dir
    result.tokenizer_len = len(tok)
    result.max_special_id, result.max_special_token = special_ids(tok)
    result.config_vocab_size = files.text_config().get("vocab_size")
    for kind in ("input", "output"):
        module = files.embedding_modules.get(kind)
        entry = files.tensor(f"{module}.weight") if module else None
        if entry is not None:
            setattr(result, f"{kind}_rows", entry[1].shape[0])
            setattr(result, f"{kind}_tensor", entry[1].name)
    embed_names = [m.rsplit(".", 1)[-1] for m in files.embedding_modules.values() if m]
    for t in files.adapter_tensors:
        if ".lora_" in t.name or not t.shape:
            continue
        if any(f".{n}." in t.name or t.name.endswith(f".{n}.weight") for n in embed_names):
            if "token_adapter" in t.name or "trainable_tokens" in t.name:
                continue
            result.adapter_rows[t.name] = t.shape[0]
    result.trainable_token_indices = (files.adapter_config or {}).get("trainable_token_indices")
    return result


# --- tokenizer.special_tokens ------------------------------------------------------------------------------------
@dataclasses.dataclass(repr=False)
class SpecialTokensResult(ProbeResult):
    tokenizer_dir: str | None
    skipped: str | None = None
    error: str | None = None
    pad: str | None = None
    pad_id: int | None = None
    eos: str | None = None
    eos_id: int | None = None
    bos: str | None = None
    bos_id: int | None = None
    generation_eos: list[int] | None = None
    generation_eos_from: str | None = None
    template: bool = False
    template_error: str | None = None
    end_of_turn: str | None = None
    end_of_turn_id: int | None = None
    rendered: str | None = None
    leading_ids: list[int] = dataclasses.field(default_factory=list)  # tokenizer(rendered text)
    template_leading_ids: list[int] = dataclasses.field(default_factory=list)  # apply_chat_template(tokenize=True)
    doubled_bos: bool = False  # render-then-encode starts with BOS twice
    template_doubles_bos: bool = False  # apply_chat_template(tokenize=True) does too: the template writes it twice
    transformers_version: str | None = None

    def findings(self) -> list[Finding]:
        evidence = {k: v for k, v in dataclasses.asdict(self).items() if k not in ("skipped",)}
        if self.skipped:
            return [Finding(SPECIAL, "skip", "No tokenizer: special tokens not checked", self.skipped, evidence)]
        if self.error:
            return [Finding(SPECIAL, "error", "The tokenizer could not load", self.error, evidence,
                            "Re-save the tokenizer with `tokenizer.save_pretrained(folder)`.")]
        fails, warns = [], []
        if self.end_of_turn_id is not None and self.generation_eos is not None \
                and self.end_of_turn_id not in self.generation_eos:
            fails.append((f"generation stops at {self.generation_eos} but the chat template ends a turn with "
                          f"{self.end_of_turn!r} ({self.end_of_turn_id})",
                          f"{self.generation_eos_from}: eos_token_id {self.generation_eos} lacks the template's "
                          f"end-of-turn token {self.end_of_turn!r} = {self.end_of_turn_id}: generate() runs on to "
                          "max_new_tokens after every answer (llama-cookbook #640).",
                          "Set `generation_config.eos_token_id = "
                          f"{sorted(set(self.generation_eos) | {self.end_of_turn_id})}`"
                          " and save it (`model.generation_config.save_pretrained(folder)`)."))
        if self.pad is None:
            warns.append(("No pad token", "Fine for generation one prompt at a time; batching for training needs "
                          "one, and the usual fix (pad = EOS) has its own trap.",
                          "Add a dedicated pad token: `tokenizer.pad_token = '<|finetune_pad|>'` via "
                          "`tokenizer.add_special_tokens({'pad_token': ...})` and resize the embeddings, or use an "
                          "existing unused reserved token."))
        elif self.eos is not None and self.pad_id == self.eos_id:
            warns.append((f"pad = EOS ({self.eos!r})",
                          "With the usual collator (labels = -100 where input_ids == pad) every EOS is masked like "
                          "padding, and the model never learns to stop (trl #3091, #1623).",
                          "Use a pad token distinct from EOS, e.g. `tokenizer.pad_token = tokenizer.unk_token` or "
                          "a reserved token; or mask by attention_mask, not by the pad id."))
        if self.doubled_bos:
            warns.append(self._doubled_bos())
        if self.template_error:
            warns.append(("The chat template could not render a conversation", self.template_error,
                          "Fix the chat_template in tokenizer_config.json / chat_template.jinja."))
        if fails:
            return [Finding(SPECIAL, "fail", fails[0][0], " ".join(f[1] for f in fails + warns), evidence,
                            " ".join(f[2] for f in fails))]
        if warns:
            return [Finding(SPECIAL, "warn", warns[0][0], " ".join(w[1] for w in warns), evidence,
                            " ".join(w[2] for w in warns))]
        turn = (f"; the template's end of turn {self.end_of_turn!r} stops generation" if self.end_of_turn else
                "; no chat template" if not self.template else "")
        return [Finding(SPECIAL, "pass", f"Special tokens consistent: pad {self.pad!r}, EOS {self.eos!r}",
                        f"pad ≠ EOS{turn}; BOS {'added once' if self.bos else 'not used'}.", evidence)]

    def _doubled_bos(self) -> tuple[str, str, str]:
        """Render-then-encode doubles BOS: a trap for code that encodes rendered text, not for trl's batches."""
        bos = f"{self.bos!r} ({self.bos_id})"
        if not self.template_leading_ids:
            where = "apply_chat_template(tokenize=True) could not be compared (it did not tokenize)."
        elif self.template_doubles_bos:
            where = (f"apply_chat_template(tokenize=True) starts with {self.template_leading_ids[:4]} too: the "
                     "template itself writes BOS twice, so conversational rows tokenized by trl carry both.")
        else:
            where = (f"apply_chat_template(tokenize=True) starts with {self.template_leading_ids[:4]}, one BOS: it "
                     "encodes without adding special tokens, and it is how trl tokenizes conversational rows, so "
                     "those batches are unaffected.")
        return (f"Render-then-encode doubles BOS: the chat template writes {self.bos!r} and the tokenizer adds it "
                "again",
                f"apply_chat_template(messages, tokenize=False) then tokenizer(text) starts with ids "
                f"{self.leading_ids[:4]}: BOS {bos} twice (transformers #37686; transformers "
                f"{self.transformers_version}). {where} Exposed is only code that "
                "renders then encodes: rows stored as rendered `text`, scripts that format prompts as text and call "
                "tokenizer(text), inference included. Notebook 07's data.template counts the batched rows that "
                "really start with BOS twice (run it with --data).",
                f"Where you encode rendered text, pass `tokenizer(text, add_special_tokens=False)`, or tokenize with "
                f"`tokenizer.apply_chat_template(messages, tokenize=True)`; store training data as messages, not as "
                f"text rendered with {self.bos!r}.")

    def details(self):
        return facts_table([
            ("tokenizer folder", self.tokenizer_dir), ("pad", f"{self.pad!r} ({self.pad_id})"),
            ("eos", f"{self.eos!r} ({self.eos_id})"), ("bos", f"{self.bos!r} ({self.bos_id})"),
            ("generation eos_token_id", f"{self.generation_eos} ({self.generation_eos_from})"),
            ("template end of turn", f"{self.end_of_turn!r} ({self.end_of_turn_id})"),
            ("rendered conversation", self.rendered), ("first ids of tokenizer(rendered)", self.leading_ids[:8]),
            ("first ids of apply_chat_template(tokenize=True)", self.template_leading_ids[:8])])


def _ids(value) -> list[int] | None:
    if value is None:
        return None
    return [int(v) for v in (value if isinstance(value, (list, tuple)) else [value])]


def end_of_turn(tok, rendered: str) -> tuple[str | None, int | None]:
    """The first special or added token after the assistant's text in the rendered conversation."""
    after = rendered.split(MARKER, 1)[1] if MARKER in rendered else ""
    ids = tok(after, add_special_tokens=False)["input_ids"]
    special = set(tok.all_special_ids) | {int(i) for i in (getattr(tok, "added_tokens_decoder", None) or {})}
    for i in ids:
        if i in special:
            return tok.convert_ids_to_tokens(i), int(i)
    return None, None


def special_tokens_probe(files: SavedFiles) -> SpecialTokensResult:
    """pad, EOS, BOS and the chat template's end-of-turn token against generation's eos_token_id."""
    result = SpecialTokensResult(str(files.tokenizer_dir) if files.tokenizer_dir else None)
    tok = _tokenizer(files, result)
    if tok is None:
        return result
    tok = files.tokenizer
    if tok is None:
        result.error = files.tokenizer_error
        return result
    result.pad, result.pad_id = tok.pad_token, tok.pad_token_id
    result.eos, result.eos_id = tok.eos_token, tok.eos_token_id
    result.bos, result.bos_id = tok.bos_token, tok.bos_token_id
    if files.generation_config is not None and "eos_token_id" in files.generation_config:
        result.generation_eos = _ids(files.generation_config.get("eos_token_id"))
        result.generation_eos_from = "generation_config.json"
    else:
        result.generation_eos = _ids(files.text_config().get("eos_token_id"))
        result.generation_eos_from = "config.json (no generation_config.json eos_token_id)"
    if result.generation_eos is None and result.eos_id is not None:
        result.generation_eos, result.generation_eos_from = [result.eos_id], "the tokenizer's eos (nothing saved)"
    result.template = bool(getattr(tok, "chat_template", None))
    if result.template:
        import transformers

        result.transformers_version = transformers.__version__
        try:
            result.rendered = tok.apply_chat_template(CONVERSATION, tokenize=False)
        except Exception as exc:  # noqa: BLE001 - a template that cannot render is reported, not raised
            result.template_error = f"{type(exc).__name__}: {exc}"
        else:
            result.end_of_turn, result.end_of_turn_id = end_of_turn(tok, result.rendered)
            result.leading_ids = list(tok(result.rendered)["input_ids"][:8])
            try:
                result.template_leading_ids = list(tok.apply_chat_template(
                    CONVERSATION, tokenize=True, return_dict=True)["input_ids"][:8])
            except Exception:  # noqa: BLE001 - rendering worked; the comparison is then left out
                result.template_leading_ids = []
            bos = result.bos_id
            result.doubled_bos = bos is not None and result.leading_ids[:2] == [bos, bos]
            result.template_doubles_bos = bos is not None and result.template_leading_ids[:2] == [bos, bos]
    return result
