"""`serve.template`: the chat template a serving engine will use against the one training used.

- a folder holding both `chat_template.jinja` and a `chat_template` in tokenizer_config.json that differ:
  transformers reads the .jinja file first (tokenization_utils_base.py: "independent chat template file(s) ... take
  priority"), llama.cpp's converter reads tokenizer_config.json's first (gguf-py/gguf/vocab.py
  SpecialVocab._try_load_from_tokenizer_json: `tokenizer_config.get('chat_template', chat_template_alt)`), so a
  merged model converted to GGUF is prompted with the stale template;
- a template only the adapter's folder carries: a LoRA GGUF holds no tokenizer (convert_lora_to_gguf.py
  `set_vocab: pass`), so llama.cpp uses the base's template; TGI loads the adapter's tokenizer
  (models/__init__.py `model.tokenizers.add_tokenizer`);
- tokens the adapter's tokenizer adds beyond the base's vocabulary (added in training).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from workbench.display.result import ProbeResult
from workbench.findings import Finding
from workbench.model.lora import read_json
from workbench.probes.serve.engine_rules import ENGINES_NOT_STATED, engine_rules, name_your_engines

CHECK = "serve.template"


def folder_templates(folder: Path | None) -> dict[str, str | None]:
    """The folder's templates by source: tokenizer_config.json's `chat_template` (a string; a list of named templates
    gives its default) and chat_template.jinja."""
    if folder is None:
        return {"tokenizer_config.json": None, "chat_template.jinja": None}
    config = read_json(folder / "tokenizer_config.json") or {}
    in_config = config.get("chat_template")
    if isinstance(in_config, list):
        in_config = next((t.get("template") for t in in_config if isinstance(t, dict) and t.get("name") == "default"),
                         None)
    jinja = folder / "chat_template.jinja"
    return {"tokenizer_config.json": in_config if isinstance(in_config, str) else None,
            "chat_template.jinja": jinja.read_text(encoding="utf-8") if jinja.is_file() else None}


def added_token_ids(folder: Path | None) -> dict[str, int]:
    """Tokens the folder's tokenizer adds (tokenizer.json `added_tokens`, or added_tokens.json)."""
    if folder is None:
        return {}
    tok = read_json(folder / "tokenizer.json")
    if tok and isinstance(tok.get("added_tokens"), list):
        return {t["content"]: int(t["id"]) for t in tok["added_tokens"] if "content" in t and "id" in t}
    return {k: int(v) for k, v in (read_json(folder / "added_tokens.json") or {}).items()}


@dataclasses.dataclass(repr=False)
class ServeTemplateResult(ProbeResult):
    folders: dict[str, dict[str, Any]]
    problems: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    engines: list[str] = dataclasses.field(default_factory=list)
    engines_stated: bool = True  # False: the user named no engine, every engine was judged (a fail becomes a warn)

    def findings(self) -> list[Finding]:
        evidence = {"folders": self.folders, "problems": self.problems, "engines": self.engines}
        if not self.problems and not any(v["used_by_transformers"] for v in self.folders.values()):
            where = " nor ".join(str(v["path"]) for v in self.folders.values())
            return [Finding(CHECK, "skip", "No chat template: nothing to compare",
                            f"Neither {where} holds a chat template (tokenizer_config.json's \"chat_template\", "
                            "chat_template.jinja): no template was trained with, and an engine prompts with its own "
                            "default or raw text.", evidence)]
        if not self.problems:
            return [Finding(CHECK, "pass", "The served chat template is the one training used",
                            "; ".join(f"{k}: {v['used_by_transformers'] or 'no template'}"
                                      for k, v in self.folders.items()), evidence)]
        worst = "fail" if any(p["verdict"] == "fail" for p in self.problems) else "warn"
        title = self.problems[0]["title"] + (f" (+{len(self.problems) - 1} more)" if len(self.problems) > 1 else "")
        detail = " ".join(p["detail"] for p in self.problems)
        fix = " ".join(p["fix"] for p in self.problems)
        if worst == "fail" and not self.engines_stated:  # a verdict about engines the user may not serve on
            return [Finding(CHECK, "warn", f"If served on llama.cpp: {title}",
                            f"{detail} Not a fail: {ENGINES_NOT_STATED}.", evidence, name_your_engines(fix))]
        return [Finding(CHECK, worst, title, detail, evidence, fix)]

    def details(self):
        from workbench.display.nodes import Display, Table

        return Display(Table.from_records([{"folder": k, **{s: ("yes" if v[s] else "-") for s in
                                                            ("tokenizer_config.json", "chat_template.jinja")},
                                            "transformers uses": v["used_by_transformers"] or "-",
                                            "llama.cpp converter uses": v["used_by_gguf"] or "-"}
                                           for k, v in self.folders.items()]))


def _describe(folder: Path | None) -> dict[str, Any]:
    t = folder_templates(folder)
    return {"path": str(folder) if folder else None, **{k: bool(v) for k, v in t.items()},
            "used_by_transformers": "chat_template.jinja" if t["chat_template.jinja"] else
            ("tokenizer_config.json" if t["tokenizer_config.json"] else None),
            "used_by_gguf": "tokenizer_config.json" if t["tokenizer_config.json"] else
            ("chat_template.jinja" if t["chat_template.jinja"] else None), "_t": t}


def serve_template_probe(target, engines: str | list[str] | None = None) -> ServeTemplateResult:
    """The chat template an engine will use against the one training used, and tokens added in training."""
    chosen = engine_rules().resolve(engines)
    adapter = Path(target.adapter_dir) if getattr(target, "adapter_dir", None) else None
    base = Path(target.model_dir)
    folders = {"adapter": _describe(adapter)} if adapter else {}
    folders["model"] = _describe(base)
    problems = []
    for label, info in folders.items():
        t = info["_t"]
        if t["tokenizer_config.json"] and t["chat_template.jinja"] and \
                t["tokenizer_config.json"].strip() != t["chat_template.jinja"].strip():
            gguf = "llama.cpp" in chosen
            problems.append({
                "verdict": "fail" if gguf else "warn",
                "title": f"Two different chat templates in the {label} folder: llama.cpp's converter takes the one "
                         "training did not use",
                "detail": f"{info['path']} holds chat_template.jinja and a different tokenizer_config.json "
                          "[\"chat_template\"]. transformers (training, vLLM, TGI) reads chat_template.jinja first "
                          "(transformers tokenization_utils_base.py); llama.cpp's SpecialVocab reads "
                          "tokenizer_config.json's first (gguf-py/gguf/vocab.py _try_load_from_tokenizer_json), so "
                          "a GGUF converted from this folder is prompted with the other template.",
                "fix": f"Delete the stale \"chat_template\" key from {info['path']}/tokenizer_config.json (or write "
                       "the .jinja text into it) before converting; or pass `--chat-template-file "
                       f"{info['path']}/chat_template.jinja` to llama-server."})
    if adapter and (folders["adapter"]["used_by_transformers"]) and not folders["model"]["used_by_transformers"]:
        problems.append({
            "verdict": "warn",
            "title": "Only the adapter's tokenizer carries a chat template",
            "detail": f"{adapter} has a chat template, the base {base} has none. A LoRA GGUF holds no tokenizer "
                      "(convert_lora_to_gguf.py set_vocab: pass) and an engine serving the adapter on the base uses "
                      "the base's tokenizer unless told otherwise; TGI loads the adapter's tokenizer "
                      "(text-generation-inference models/__init__.py add_tokenizer).",
            "fix": f"Serve with the template given explicitly: vLLM `--chat-template {adapter}/chat_template.jinja`, "
                   f"llama-server `--chat-template-file {adapter}/chat_template.jinja`."})
    if adapter:
        base_vocab = (read_json(base / "config.json") or {})
        vocab = base_vocab.get("vocab_size") or (base_vocab.get("text_config") or {}).get("vocab_size")
        added = added_token_ids(adapter)
        base_added = added_token_ids(base)
        new = {k: v for k, v in added.items() if k not in base_added and (vocab is None or v >= vocab)}
        if new:
            names = ", ".join(sorted(new, key=new.get)[:5])
            problems.append({
                "verdict": "warn",
                "title": f"{len(new)} token(s) added in training are not in the base's vocabulary: {names}",
                "detail": f"The adapter's tokenizer gives ids {min(new.values())}..{max(new.values())} at or above "
                          f"the base's vocab_size {vocab}. An engine that serves the adapter on the base has no "
                          "embedding row for them: vLLM removed the extra-vocabulary LoRA support "
                          "(vllm-project/vllm#28382, as reported there; not read from vLLM's source "
                          "here), llama.cpp's converter stops on a saved embed_tokens.",
                "fix": "Merge the adapter with the resized embeddings (`model.resize_token_embeddings(len(tokenizer))` "
                       "before `PeftModel.from_pretrained`, then `merge_and_unload()`) and serve the merged model "
                       "with the adapter's tokenizer."})
    for info in folders.values():
        info.pop("_t")
    return ServeTemplateResult(folders, problems, chosen, engines_stated=bool(engines))
