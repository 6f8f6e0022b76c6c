"""The repository root, for tests that read its files (README, notebooks, parameters)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
