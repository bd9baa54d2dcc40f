"""Shared fixtures: the fixture repositories, discovered once per session."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
ROOT = Path(__file__).parent.parent
TRAPS = FIXTURES / "traps"
SAMPLE = ROOT / "examples" / "sample-repo"

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")


def expected(name: str) -> list[dict]:
    with (FIXTURES / f"{name}.expected.csv").open() as fh:
        return list(csv.DictReader(fh))


@pytest.fixture(scope="session")
def traps():
    from miner.discover import discover

    return discover(TRAPS)


@pytest.fixture(scope="session")
def sample():
    from miner.discover import discover

    return discover(SAMPLE)


@pytest.fixture(scope="session")
def traps_extractor(traps):
    from miner.extract import Extractor

    return Extractor(traps)


def kernel(disc, name: str, spec: str | None = None):
    found = [
        k
        for k in disc.kernels
        if k.kdef.name == name and (spec is None or k.kdef.specialization == spec)
    ]
    assert found, f"kernel {name} not found"
    return found[0]
