"""Fixtures the session tests share."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty compile cache of the test's own (a module that wants one for every test
    says `pytestmark = pytest.mark.usefixtures("own_cache")`)."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("KILN_CACHE_DIR", str(folder))
    monkeypatch.delenv("KILN_CACHE", raising=False)
    return folder
