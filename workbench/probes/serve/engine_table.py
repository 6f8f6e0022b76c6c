"""The engine table of docs/serving.md, generated from engine_rules.yaml: `python -m workbench.probes.serve.engine_table`
writes it; a test keeps the file equal to the generated text."""

from __future__ import annotations

import sys
from pathlib import Path

from workbench.probes.serve.engine_rules import RULES_FILE, engine_rules

DOC = Path(__file__).resolve().parents[3] / "docs" / "serving.md"


def _cell(rule: dict | None) -> str:
    if rule is None:
        return "—"
    text = rule["outcome"]
    if rule.get("flag"):
        text += f" `{rule['flag']}` (default {rule.get('default')})"
    if rule.get("scale") and rule["outcome"] in ("SILENT", "OK") and rule["scale"] != "base":
        text += f" ({rule['scale'].replace('_', ' ')})"
    if not rule.get("confirmed", False):
        text += " *(unconfirmed)*"
    return text


def engine_table_markdown() -> str:
    rules = engine_rules()
    engines = list(rules.engines)
    lines = ["# Serving engines and adapter features (`serve.adapter`)", "",
             f"Generated from `workbench/probes/serve/{RULES_FILE.name}` by "
             "`python -m workbench.probes.serve.engine_table`; do not edit by hand.", "",
             "ERROR: will not load. SILENT: loads and computes another update. FLAG: loads with the named server "
             "flag. OK: loads and computes PEFT's update. *(unconfirmed)*: not read in the engine's source; never "
             "decides a verdict.", "",
             "| adapter feature | " + " | ".join(rules.engines[e]["name"] for e in engines) + " |",
             "|---|" + "---|" * len(engines)]
    for entry in rules.features.values():
        lines.append(f"| {entry['label']} | " + " | ".join(_cell((entry.get('rules') or {}).get(e)) for e in engines)
                     + " |")
    lines += ["", "LoRA scale each engine computes (PEFT: lora_alpha / r, or / √r with `use_rslora`; per module with "
              "`rank_pattern` / `alpha_pattern`):", ""]
    lines += [f"- **{spec['name']}**: plain {spec['base_scale']['plain'].replace('_', ' ')}, rsLoRA "
              f"{spec['base_scale']['rslora'].replace('_', ' ')} (read at {spec['snapshot']})"
              for spec in rules.engines.values()]
    lines += ["", "## Sources", ""]
    for key, entry in rules.features.items():
        for engine, rule in (entry.get("rules") or {}).items():
            issue = f"; {rule['issue']}" if rule.get("issue") else ""
            lines.append(f"- `{key}` × {rules.engines[engine]['name']} ({rule.get('versions', '')}): "
                         f"{rule['source']}{issue}")
    return "\n".join(lines) + "\n"


def main() -> int:
    DOC.write_text(engine_table_markdown())
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
