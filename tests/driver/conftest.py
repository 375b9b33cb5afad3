"""The driver tests share the transform tests' IR samples; the compile cache goes to a tmp dir."""

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "transform"))


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory,
                   monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("kiln-cache")
    monkeypatch.setenv("KILN_CACHE_DIR", str(path))
    yield path
