"""serve.template on planted folders, and docs/serving.md equal to the table generated from the rules."""

from __future__ import annotations

import json
from pathlib import Path

from tests.probes.serve.conftest import target_for
from workbench.probes.serve.engine_table import DOC, engine_table_markdown
from workbench.probes.serve.template import serve_template_probe

TRAINED = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>{% endfor %}"
STALE = "{% for m in messages %}{{ m.content }}\n{% endfor %}"


def folder(path: Path, config_template: str | None = None, jinja: str | None = None, vocab: int = 64,
           added: dict[str, int] | None = None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": vocab}))
    config = {"tokenizer_class": "PreTrainedTokenizerFast"}
    if config_template:
        config["chat_template"] = config_template
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    if jinja:
        (path / "chat_template.jinja").write_text(jinja)
    if added:
        (path / "added_tokens.json").write_text(json.dumps(added))
    return path


def test_stale_template_beside_the_jinja_file_fails_for_gguf(tmp_path):
    base = folder(tmp_path / "base", config_template=STALE, jinja=TRAINED)
    found = serve_template_probe(target_for(base, None), engines="llama.cpp").findings()[0]
    assert found.verdict == "fail" and "llama.cpp" in found.title and "gguf-py/gguf/vocab.py" in found.detail
    assert serve_template_probe(target_for(base, None), engines="vllm").findings()[0].verdict == "warn"
    unstated = serve_template_probe(target_for(base, None)).findings()[0]  # no engine named: a conditional warn
    assert unstated.verdict == "warn" and unstated.title.startswith("If served on llama.cpp") \
        and "--serve" in unstated.fix


def test_one_template_in_both_places_passes(tmp_path):
    base = folder(tmp_path / "base", config_template=TRAINED, jinja=TRAINED + "\n")
    assert serve_template_probe(target_for(base, None)).findings()[0].verdict == "pass"


def test_template_only_in_the_adapter_folder_warns(tmp_path):
    base = folder(tmp_path / "base")
    adapter = folder(tmp_path / "adapter", jinja=TRAINED)
    found = serve_template_probe(target_for(base, adapter)).findings()[0]
    assert found.verdict == "warn" and "--chat-template" in found.fix
    twin = folder(tmp_path / "base2", jinja=TRAINED)
    assert serve_template_probe(target_for(twin, adapter)).findings()[0].verdict == "pass"


def test_tokens_added_in_training_warn(tmp_path):
    base = folder(tmp_path / "base", jinja=TRAINED, vocab=64)
    adapter = folder(tmp_path / "adapter", jinja=TRAINED, added={"<tool>": 64, "</tool>": 65})
    found = serve_template_probe(target_for(base, adapter)).findings()[0]
    assert found.verdict == "warn" and "<tool>" in found.title
    inside = folder(tmp_path / "adapter2", jinja=TRAINED, added={"<pad>": 10})  # within the base's vocab
    assert serve_template_probe(target_for(base, inside)).findings()[0].verdict == "pass"


def test_serving_doc_is_the_generated_table():
    assert DOC.read_text() == engine_table_markdown(), "run `python -m workbench.probes.serve.engine_table`"


def test_no_chat_template_anywhere_is_a_skip_naming_the_folders(tmp_path):
    base = folder(tmp_path / "base")
    adapter = folder(tmp_path / "adapter")
    found = serve_template_probe(target_for(base, adapter)).findings()[0]
    assert found.verdict == "skip" and found.title == "No chat template: nothing to compare", found
    assert f"Neither {adapter} nor {base} holds a chat template" in found.detail
    assert {k: v["used_by_transformers"] for k, v in found.evidence["folders"].items()} == {
        "adapter": None, "model": None}
    # tokens added in training are judged without a template too; a template in the base alone is compared
    added = folder(tmp_path / "added", added={"<tool>": 64})
    assert serve_template_probe(target_for(base, added)).findings()[0].verdict == "warn"
    templated = folder(tmp_path / "templated", jinja=TRAINED)
    assert serve_template_probe(target_for(templated, adapter)).findings()[0].verdict == "pass"
