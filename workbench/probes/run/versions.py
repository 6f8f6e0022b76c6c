"""`run.versions`: the versions a Trainer run used against a table of known regressions, each row's condition
checked against this run.

The table is data (`regressions.yaml`, one row per regression with its package ranges, condition, symptom, fix and
upstream threads); `print_regressions()` prints it. A row fires only when every package range matches the run's
recorded versions and its condition holds for the run (read by `versions_facts`): a version match alone says
nothing. When the files do not record what a condition needs (gradient checkpointing, FSDP: only the pickled
training arguments hold them), the row says "cannot tell" and names what is missing.

    result = versions_probe(Path("out"))               # out/ holds checkpoint-N/ folders and/or a final save
    result = versions_probe(Path("out"), training_args=args.to_dict())   # when the caller has them
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any, Mapping

from workbench.display.result import ProbeResult
from workbench.findings import Finding, worst_verdict
from workbench.probes.run.versions_facts import RunFacts, read_run_facts

CHECK = "run.versions"
TABLE = Path(__file__).with_name("regressions.yaml")
HEAD_KINDS_OF_TRL = {"causal_lm", "image_text_to_text"}  # what trl's trainers train: a language-model head


@dataclasses.dataclass(frozen=True)
class Regression:
    id: str
    packages: dict[str, str]
    when: dict[str, Any]
    severity: str
    symptom: str
    fix: str
    source: str
    urls: tuple[str, ...]
    unless: tuple[dict[str, Any], ...] = ()  # exemptions: facts that all match, and `because`


@functools.lru_cache(maxsize=1)
def known_regressions() -> tuple[Regression, ...]:
    import yaml

    rows = yaml.safe_load(TABLE.read_text())
    return tuple(Regression(r["id"], dict(r["packages"]), dict(r.get("when") or {}), r["severity"], r["symptom"],
                            r["fix"], r["source"], tuple(r.get("urls") or ()),
                            tuple(dict(u) for u in r.get("unless") or ())) for r in rows)


@dataclasses.dataclass
class RowStatus:
    """How one row stands for this run: holds / likely / cannot_tell / not_met / outside (a version out of range)."""

    row: Regression
    status: str
    reasons: list[str]  # per condition or package: what was read, or what is missing

    @property
    def verdict(self) -> str | None:
        return {"holds": self.row.severity, "likely": "warn", "cannot_tell": "info"}.get(self.status)


def _version_in(version: str, specifier: str) -> bool | None:
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version) in SpecifierSet(specifier, prereleases=True)
    except (InvalidVersion, InvalidSpecifier):
        return None


def _condition(name: str, wanted: Any, facts: RunFacts) -> tuple[bool | str | None, str]:
    """(True / False / "likely" / None for unknown, what was read)."""
    def flag(value, label):
        if value is None:
            return None, f"{label}: not recorded"
        return (bool(value) == bool(wanted)), f"{label}: {value} ({facts.sources.get(name, '')})"

    if name == "gradient_accumulation":
        ga = facts.gradient_accumulation_steps
        return (None, "gradient_accumulation_steps: not recorded") if ga is None else \
            ((ga > 1) == wanted, f"gradient_accumulation_steps {ga} ({facts.sources['gradient_accumulation_steps']})")
    if name == "label_smoothing":
        f = facts.label_smoothing_factor
        return (None, "label_smoothing_factor: not recorded") if f is None else \
            ((f > 0) == wanted, f"label_smoothing_factor {f} ({facts.sources['label_smoothing_factor']})")
    if name == "trainer":
        if facts.trainer is None:
            return None, "trainer: not recorded"
        return facts.trainer.upper() in {w.upper() for w in wanted}, f"trainer {facts.trainer}"
    if name == "trl_trainer":
        if facts.trainer is None:
            return None, "trainer: not recorded"
        return (facts.trainer != "Trainer") == wanted, f"trainer {facts.trainer}"
    if name == "head":
        if facts.head is not None:
            return facts.head in wanted, f"head {facts.head} ({facts.sources['head']})"
        if facts.trainer not in (None, "Trainer") and HEAD_KINDS_OF_TRL & set(wanted):
            return "likely", f"head not recorded; trl's {facts.trainer} trains a language-model head"
        return None, "head kind: not recorded"
    if name == "adapter":
        return facts.adapter == wanted, ("a PEFT adapter (adapter_config.json)" if facts.adapter else "no adapter")
    if name in ("quantization", "attention"):
        value = getattr(facts, name)
        return (None, f"{name}: not recorded") if value is None else \
            (value == wanted, f"{name} {value} ({facts.sources[name]})")
    if name in ("distributed", "fsdp", "gradient_checkpointing", "reentrant_default", "use_cache"):
        return flag(getattr(facts, name), name.replace("_", " "))
    raise ValueError(f"regressions.yaml: unknown condition {name!r}")


EXEMPTION_FACTS = {"architectures": "architecture", "problem_type": "problem_type"}


def _exemption(exemption: dict[str, Any], facts: RunFacts) -> tuple[bool | None, str]:
    """True when the run is the exempted model (every listed fact matches), None when its architecture matches but
    another listed fact is not recorded, False otherwise (an unrecorded architecture exempts nothing)."""
    read = []
    unknown = []
    for key, wanted in exemption.items():
        if key == "because":
            continue
        fact = EXEMPTION_FACTS.get(key)
        if fact is None:
            raise ValueError(f"regressions.yaml: unknown exemption fact {key!r}")
        value = getattr(facts, fact)
        if value is None:
            if key == "architectures":
                return False, ""
            unknown.append(f"{fact}: not recorded (exempt when {', '.join(wanted)})")
        elif value not in wanted:
            return False, ""
        else:
            read.append(f"{fact} {value} ({facts.sources[fact]})")
    if unknown:
        return None, "; ".join(read + unknown)
    return True, f"{'; '.join(read)}: {exemption.get('because', '').strip()}"


def row_status(row: Regression, facts: RunFacts) -> RowStatus:
    reasons: list[str] = []
    unknown_versions = []
    for package, spec in row.packages.items():
        version = facts.versions.get(package)
        inside = _version_in(version, spec) if version else None
        if version is None:
            unknown_versions.append(package)
            reasons.append(f"{package} version not recorded (affected: {spec})")
        elif inside is False:
            return RowStatus(row, "outside", [f"{package} {version} outside {spec}"])
        else:
            reasons.append(f"{package} {version} in {spec}")
    outcomes = []
    for name, wanted in row.when.items():
        outcome, why = _condition(name, wanted, facts)
        if outcome is False:
            return RowStatus(row, "not_met", reasons + [f"condition not met: {why}"])
        outcomes.append(outcome)
        reasons.append(why)
    for exemption in row.unless:
        outcome, why = _exemption(exemption, facts)
        if outcome is True:
            return RowStatus(row, "not_met", reasons + [f"exempt: {why}"])
        if outcome is None:
            outcomes.append(None)
            reasons.append(why)
    if unknown_versions or None in outcomes:
        return RowStatus(row, "cannot_tell", reasons)
    return RowStatus(row, "likely" if "likely" in outcomes else "holds", reasons)


@dataclasses.dataclass(repr=False)
class VersionsResult(ProbeResult):
    run_dir: str
    facts: RunFacts
    rows: list[RowStatus]

    @property
    def applicable(self) -> list[RowStatus]:
        return [r for r in self.rows if r.status in ("holds", "likely", "cannot_tell")]

    def _versions_text(self) -> str:
        return ", ".join(f"{p} {v}" for p, v in self.facts.versions.items()) or "no versions"

    def findings(self) -> list[Finding]:
        facts = self.facts
        evidence = {"run_dir": self.run_dir, "versions": facts.versions, "version_sources":
                    {k.removeprefix("version:"): v for k, v in facts.sources.items() if k.startswith("version:")},
                    "version_conflicts": facts.version_conflicts, "facts": self._facts_table(),
                    "rows": [{"id": r.row.id, "status": r.status, "reasons": r.reasons, "urls": list(r.row.urls)}
                             for r in self.applicable],
                    "table_rows": len(self.rows)}
        if not facts.versions:
            return [Finding(CHECK, "info", "No versions recorded in the run's files",
                            f"Neither a model card with \"Framework versions\", a config.json with transformers_version "
                            f"nor an adapter_config.json with peft_version in {', '.join(facts.folders)}: the known "
                            "regressions cannot be checked.", evidence,
                            "Keep the model card the Trainer writes (`trainer.create_model_card()`, called by "
                            "`push_to_hub`), or record `pip freeze` beside the run.")]
        fired = [r for r in self.applicable if r.status in ("holds", "likely")]
        unknown = [r for r in self.applicable if r.status == "cannot_tell"]
        verdict = worst_verdict([r.verdict for r in self.applicable]) or "pass"
        conflicts = (f" The files disagree: {'; '.join(facts.version_conflicts)}." if facts.version_conflicts else "")
        if fired:
            head = fired[0]
            title = (f"Known regression {'applies' if head.status == 'holds' else 'likely applies'} to this run: "
                     f"{head.row.id}" + (f" (and {len(fired) - 1} more)" if len(fired) > 1 else ""))
            detail = " ".join(self._row_text(r) for r in fired + unknown) + conflicts
            fix = " ".join(f"{r.row.id}: {r.row.fix}" for r in fired)
            return [Finding(CHECK, verdict, title, detail, evidence, fix)]
        if unknown:
            return [Finding(CHECK, "info", f"Cannot tell whether {len(unknown)} known regression(s) apply to "
                            f"{self._versions_text()}: " + ", ".join(r.row.id for r in unknown),
                            " ".join(self._row_text(r) for r in unknown) + conflicts, evidence,
                            "Pass the run's TrainingArguments (`versions_probe(run_dir, training_args=args.to_dict())`"
                            ") or check the missing facts by hand: " + " ".join(f"{r.row.id}: {r.row.fix}"
                                                                               for r in unknown))]
        return [Finding(CHECK, "pass", f"No known regression applies to {self._versions_text()}",
                        f"{len(self.rows)} known regressions checked against the run's versions and conditions: none "
                        f"applies.{conflicts}", evidence)]

    @staticmethod
    def _row_text(r: RowStatus) -> str:
        lead = {"holds": "holds", "likely": "likely holds", "cannot_tell": "cannot tell"}[r.status]
        return (f"[{r.row.id}: {lead}: {'; '.join(r.reasons)}] {r.row.symptom} ({', '.join(r.row.urls)}).")

    def _facts_table(self) -> dict[str, Any]:
        f = self.facts
        return {k: getattr(f, k) for k in ("trainer", "head", "architecture", "problem_type", "adapter",
                                           "gradient_accumulation_steps",
                                           "label_smoothing_factor", "distributed", "fsdp", "gradient_checkpointing",
                                           "reentrant_default", "quantization", "attention", "use_cache",
                                           "train_batch_size", "global_step")}

    def details(self):
        from workbench.display.nodes import Display, Paragraph, Table

        facts = [{"fact": k, "value": "not recorded" if v is None else v,
                  "from": self.facts.sources.get(k, "")} for k, v in self._facts_table().items()]
        versions = [{"package": p, "version": v, "from": self.facts.sources.get(f"version:{p}", "")}
                    for p, v in self.facts.versions.items()]
        rows = [{"regression": r.row.id, "status": r.status.replace("_", " "), "why": "; ".join(r.reasons)}
                for r in sorted(self.rows, key=lambda r: ("holds", "likely", "cannot_tell", "not_met",
                                                          "outside").index(r.status))]
        return Display(Paragraph("Read from: ", ", ".join(self.facts.folders), "."),
                       Table.from_records(versions, ["package", "version", "from"]) if versions else None,
                       Table.from_records(facts, ["fact", "value", "from"]),
                       Table.from_records(rows, ["regression", "status", "why"]))


def versions_probe(run_dir: Path, training_args: Mapping[str, Any] | None = None) -> VersionsResult:
    """The run's recorded versions and facts against every known regression."""
    facts = read_run_facts(Path(run_dir), training_args)
    return VersionsResult(str(run_dir), facts, [row_status(row, facts) for row in known_regressions()])


def regressions_table() -> list[dict[str, str]]:
    def exempt(row: Regression) -> str:
        return "".join(f"; not for {', '.join(u.get('architectures', []))}"
                       + "".join(f" with {k} {'/'.join(v)}" for k, v in u.items() if k not in ("architectures", "because"))
                       for u in row.unless)

    return [{"id": r.id, "packages": ", ".join(f"{p} {s}" for p, s in r.packages.items()),
             "condition": ", ".join(f"{k}={v}" for k, v in r.when.items()) + exempt(r), "severity": r.severity,
             "symptom": r.symptom, "fix": r.fix, "upstream": " ".join(r.urls)} for r in known_regressions()]


def print_regressions() -> int:
    """Print the table of known regressions (`python -m workbench regressions`)."""
    from workbench.display.nodes import Display, Paragraph, Table

    print(Display(Paragraph(f"{len(known_regressions())} known regressions ({TABLE.name}): each fires only when "
                            "its versions match and its condition holds for the run."),
                  Table.from_records(regressions_table())).text())
    return 0
