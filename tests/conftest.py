"""Shared test fixtures: the optional real data sets beside the project."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"


@pytest.fixture
def shared_data():
    """`shared_data(name)` -> Path of ../shared/data/name; skips the test when it is absent."""

    def get(name: str) -> Path:
        path = SHARED_DATA / name
        if not path.exists():
            pytest.skip(f"{path} not present (real data sets live beside the project, in ../shared/data)")
        return path

    return get
