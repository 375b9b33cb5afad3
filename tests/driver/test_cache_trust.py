"""The compile cache's trust model (docs/security.md): an entry is bound to its key, its
JSON is schema-checked, and any filesystem error degrades to no cache with a warning."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_cache_store import ROWS, weights_module

import kiln
from kiln.driver import CACHE_STATS, cache


@pytest.fixture(autouse=True)
def _fresh() -> None:
    CACHE_STATS.reset()
    cache._WARNED.clear()  # each test sees its warnings, even if an earlier one had them


def _compile(seed: int) -> Any:
    return kiln.compile(weights_module(seed)[0], "c")


def _runs_model(ex: Any, seed: int) -> None:
    x = np.ones((ROWS, ROWS), np.float32)
    np.testing.assert_array_equal(ex["main"](x), x + weights_module(seed)[1])


def test_swapped_entries_are_misses_with_a_warning_never_the_other_model() -> None:
    a, b = _compile(0), _compile(1)
    pa, pb = cache.entry_path(a.cache_key), cache.entry_path(b.cache_key)
    tmp = pa.with_suffix(".swap")
    pa.rename(tmp)
    pb.rename(pa)
    tmp.rename(pb)
    with pytest.warns(cache.CacheWarning, match="renamed or swapped"):
        again = _compile(0)
    assert not again.cache_hit
    _runs_model(again, 0)
    assert _compile(0).cache_hit  # rebuilt under its own key


def test_an_entry_renamed_to_another_key_is_a_miss() -> None:
    a = _compile(0)
    key_b = kiln.compile(weights_module(1)[0], "c", system_lib_prefix="b_").cache_key
    assert key_b is not None
    cache.entry_path(a.cache_key).replace(cache.entry_path(key_b))
    with pytest.warns(cache.CacheWarning, match=f"is the entry of key {a.cache_key}"):
        ex = kiln.compile(weights_module(1)[0], "c", system_lib_prefix="b_")
    assert not ex.cache_hit and CACHE_STATS.errors == 1


@pytest.mark.parametrize("edit, what", [
    (lambda e: e["artifacts"][0].update(object="../../../etc/passwd"), "object name"),
    (lambda e: e["artifacts"][0].update(size=-1), "size"),
    (lambda e: e.update(key=1), "key"),
    (lambda e: e.pop("key"), "key"),
    (lambda e: e.update(artifacts={"a": 1}), "artifacts"),
])
def test_an_entry_outside_the_schema_is_a_damaged_miss(edit: Any, what: str) -> None:
    ex = _compile(0)
    path = cache.entry_path(ex.cache_key)
    entry = json.loads(path.read_bytes())
    edit(entry)
    entry["checksum"] = cache._entry_checksum(entry)  # resealed: only the schema can tell
    path.write_text(json.dumps(entry))
    with pytest.raises(kiln.KilnError, match=what):
        cache._parse_entry(path.read_bytes(), str(ex.cache_key))
    again = _compile(0)
    assert not again.cache_hit and CACHE_STATS.errors == 1
    _runs_model(again, 0)


def test_cache_path_below_a_regular_file_compiles_without_it(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("KILN_CACHE_DIR", str(blocker / "below"))
    with pytest.warns(cache.CacheWarning, match="Not a directory"):
        ex = _compile(0)
    assert not ex.cache_hit
    _runs_model(ex, 0)
    assert cache.list_entries() == [] and cache.info()["entries"] == 0


def test_a_file_where_a_directory_should_be(_private_cache: Path) -> None:
    _compile(0)
    entries = _private_cache / cache.LAYOUT / "entries"
    for p in entries.iterdir():
        p.unlink()
    entries.rmdir()
    entries.write_text("in the way")
    with pytest.warns(cache.CacheWarning, match="not a directory"):
        ex = _compile(0)
    assert not ex.cache_hit
    _runs_model(ex, 0)


def test_a_read_only_cache_never_fails_a_build(monkeypatch: pytest.MonkeyPatch) -> None:
    def read_only(path: Path, parts: Any, size: int = 0) -> None:
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(cache, "_write_atomic", read_only)
    with pytest.warns(cache.CacheWarning, match="Read-only file system"):
        ex = _compile(0)
    assert not ex.cache_hit and CACHE_STATS.stores == 0
    _runs_model(ex, 0)


def test_permission_denied_on_lookup_is_a_miss_that_keeps_the_entry(
        monkeypatch: pytest.MonkeyPatch) -> None:
    key = _compile(0).cache_key
    path = cache.entry_path(key)

    def denied(p: Path) -> bytes:
        raise PermissionError(errno.EACCES, "Permission denied", str(p))

    monkeypatch.setattr(cache, "_read_checked", denied)
    with pytest.warns(cache.CacheWarning, match="Permission denied"):
        assert cache.lookup(str(key)) is None
    assert path.exists()  # not ours to delete: we could not even read it


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0,
                    reason="root ignores directory permissions")
def test_an_unwritable_cache_directory(_private_cache: Path) -> None:
    _compile(0)
    objects = _private_cache / cache.LAYOUT / "objects"
    objects.chmod(0o500)
    try:
        with pytest.warns(cache.CacheWarning, match="Permission denied"):
            ex = _compile(1)
        _runs_model(ex, 1)
    finally:
        objects.chmod(0o700)
