"""What the ranks of one torchrun launch wrote, read by section: the one thing the parent-side verdicts
(`ddp_verdict`, `fsdp_verdict`) and the probe's result share. A leaf: it imports nothing of the workbench.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(repr=False)
class RankResults:
    ranks: int
    backend: str
    checks: tuple[str, ...]
    results: dict[int, dict[str, Any]]  # rank -> its result file
    launch: dict[str, Any]  # RankRun.as_evidence()

    def section(self, name: str, rank: int = 0) -> dict[str, Any] | None:
        return (self.results.get(rank) or {}).get("sections", {}).get(name)

    def complete(self, name: str) -> bool:
        return all(self.section(name, r) is not None for r in range(self.ranks))

    def trials(self, rank: int = 0) -> list[dict[str, Any]]:
        return (self.section("ddp", rank) or {}).get("trials", [])

    def trial(self, role: str) -> list[dict[str, Any]]:
        """The first trial with this role, one entry per rank."""
        first = next((t for t in self.trials(0) if t["role"] == role), None)
        return self.trial_named(first["label"]) if first else []

    def trial_named(self, label: str) -> list[dict[str, Any]]:
        return [next((t for t in self.trials(r) if t["label"] == label), {}) for r in range(self.ranks)]

    def prefix_rows(self) -> list[dict[str, Any]]:
        return ((self.section("ddp") or {}).get("names") or {}).get("selections", [])

    def launch_summary(self) -> dict[str, Any]:
        """The launch without torchrun's output: what each finding's evidence carries."""
        return {k: v for k, v in self.launch.items() if k != "output_tail"}
