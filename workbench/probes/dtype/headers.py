"""The header-only probe of notebook 01: the checkpoint's integrity and its dtype census, with no weight read.

Light on purpose: neither torch nor transformers is imported when the header map is cached
(`workbench.model.header_map`), so `python -m workbench census` answers a 7B checkpoint in well under a second.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from workbench.display.result import ProbeResult
from workbench.findings import Finding, worst_verdict
from workbench.model.checkpoint import CheckpointInspection, StaticCensus, inspect_checkpoint, static_census
from workbench.model.components import component_overrides
from workbench.model.header_map import header_map


@dataclasses.dataclass(repr=False)
class CheckpointResult(ProbeResult):
    inspections: list[CheckpointInspection]
    censuses: list[StaticCensus]

    def findings(self) -> list[Finding]:
        per_folder = [f for i in self.inspections for f in i.findings()]
        worst = worst_verdict(f.verdict for f in per_folder)
        chosen = next(f for f in per_folder if f.verdict == worst)
        if len(per_folder) > 1:
            chosen.evidence = {"folders": [f.evidence for f in per_folder]}
            if worst == "pass":
                chosen.detail = " | ".join(f.detail for f in per_folder)
        return [chosen]

    def to_frame(self):
        import pandas as pd

        return pd.concat([c.to_frame() for c in self.censuses], ignore_index=True)

    def details(self):
        from workbench.display.nodes import Display, Paragraph, Table

        reads = sum(c.bytes_read for c in self.censuses)
        unmapped = [k for c in self.censuses for k in c.unmapped]
        note = Paragraph(f"Header-only census: {reads:,} bytes read, no weight loaded; keys mapped via "
                         f"{self.censuses[0].key_mapping if self.censuses else '-'}.")
        tied = [Paragraph(c.tied_note()) for c in self.censuses if c.tied]
        unmatched = (Paragraph(f"Keys matched to no module (counted as other): {', '.join(unmapped[:8])}")
                     if unmapped else None)
        return Display(note, *tied, unmatched, Table.from_frame(self.to_frame()))


def checkpoint_probe(target) -> CheckpointResult:
    """Integrity of the model (or base) folder and the adapter folder, and their census from headers alone."""
    folders = [("model" if target.adapter_dir is None else "base", target.model_dir)]
    if target.adapter_dir is not None:
        folders.append(("adapter", target.adapter_dir))
    inspections = [inspect_checkpoint(folder) for _, folder in folders]

    def adapter_key(key: str) -> str:  # PEFT saves adapter keys under base_model.model.<module path>
        return key.removeprefix("base_model.model.")

    saved = {role: [t.name for h in insp.headers for t in h.tensors] for (role, _), insp in zip(folders, inspections)}
    keys = [adapter_key(k) if role == "adapter" else k for role, names in saved.items() for k in names]
    found = header_map(target.model_dir, keys, trust_remote_code=target.trust_remote_code)
    classifier = found.classifier(component_overrides(target))
    censuses = [static_census(insp, classifier.component_of,
                              (lambda k: found.map_key(adapter_key(k))) if role == "adapter" else found.map_key,
                              found.how, source=f"{role}: {Path(folder).name}",
                              tied=found.tied if role != "adapter" else None)
                for (role, folder), insp in zip(folders, inspections)]
    return CheckpointResult(inspections, censuses)
