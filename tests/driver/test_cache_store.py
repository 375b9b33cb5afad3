"""The compile cache's storage: shared weights, hash and permission checks, size cap, CLI."""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import kiln
from kiln.artifact.capped import parse_size
from kiln.cli.main import main as kiln_main
from kiln.driver import CACHE_STATS, cache, direct_write
from kiln.ir import IRBuilder, IRModule
from kiln.ir import graph as g

ROWS = 64


def weights_module(seed: int = 0) -> tuple[IRModule, np.ndarray]:
    """main(x) = x + table (a 64x64 float32 constant: 16 KiB of weights)."""
    table = np.random.default_rng(seed).standard_normal((ROWS, ROWS)).astype(np.float32)
    ib = IRBuilder()
    with ib.function("main"):
        x = ib.param("x", (ROWS, ROWS), "float32")
        ib.ret(ib.emit(kiln.ops.call("add", x, g.Constant(table, "table")), "y"))
    return ib.get(), table


@pytest.fixture(autouse=True)
def _stats() -> Iterator[None]:
    CACHE_STATS.reset()
    yield


def objects() -> dict[str, Path]:
    root = cache.cache_dir() / cache.LAYOUT / "objects"
    return {p.name: p for p in root.rglob("*") if p.is_file()}


def weights_objects() -> list[Path]:
    """Objects named by chunk hashes: the weights (docs/compile.md): "c" and 64 hex
    digits (a plain SHA-256 name has 64 and may start with "c" too)."""
    return [p for name, p in objects().items() if name.startswith("c") and len(name) == 65]


def test_weights_are_stored_once_and_the_hit_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache, "DIRECT_WRITE_BYTES", 1)  # the objects past the page cache
    mod, table = weights_module()
    kiln.compile(mod, "c")
    kiln.compile(mod, "c", system_lib_prefix="other_")  # a second entry, same weights
    assert CACHE_STATS.stores == 2 and len(cache.list_entries()) == 2
    (stored,) = weights_objects()
    assert stored.read_bytes() == table.tobytes()
    ex = kiln.compile(weights_module()[0], "c")
    assert ex.cache_hit
    x = np.ones((ROWS, ROWS), np.float32)
    np.testing.assert_array_equal(ex["main"](x), x + table)


@pytest.mark.parametrize("directory", ["tmp", "/dev/shm"])
def test_a_direct_write_holds_every_byte(directory: str, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Whole buffers, whole blocks and a tail past them; pieces of any size and item type;
    on a disk and on a tmpfs (which may refuse O_DIRECT: then written buffered)."""
    where = tmp_path if directory == "tmp" else Path(directory)
    if not where.is_dir():
        pytest.skip(f"no {directory}")
    monkeypatch.setattr(direct_write, "BUFFER", 4 * direct_write.ALIGN)
    rng = np.random.default_rng(1)
    parts = [rng.integers(0, 255, n, dtype=np.uint8)
             for n in (3, direct_write.BUFFER * 2 + direct_write.ALIGN - 3, 5, 70001)]
    parts.append(np.arange(1000, dtype=np.float32).reshape(10, 100))
    fd, name = tempfile.mkstemp(dir=where)
    try:
        direct_write.write_direct(fd, parts)
        os.close(fd)
        assert Path(name).read_bytes() == b"".join(p.tobytes() for p in parts)
    finally:
        os.unlink(name)


@pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="no O_DIRECT on this system")
def test_a_refused_direct_write_goes_through_the_page_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import fcntl

    monkeypatch.setattr(direct_write, "BUFFER", 4 * direct_write.ALIGN)
    real, refused = os.write, []

    def write(fd: int, data: Any) -> int:  # a device that takes no direct write
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            refused.append(len(data))
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, data)

    monkeypatch.setattr(os, "write", write)
    data = np.random.default_rng(2).integers(0, 255, 3 * direct_write.BUFFER + 7, np.uint8)
    target = tmp_path / "object"
    with open(target, "wb") as f:
        direct_write.write_direct(f.fileno(), [data])
    assert refused == [direct_write.BUFFER]  # the first one only: the rest went buffered
    assert target.read_bytes() == data.tobytes()


def test_damaged_weights_object_is_a_miss_and_is_rebuilt() -> None:
    mod, table = weights_module()
    kiln.compile(mod, "c")
    (stored,) = weights_objects()
    data = bytearray(stored.read_bytes())
    data[100] ^= 0x10
    stored.write_bytes(bytes(data))
    ex = kiln.compile(weights_module()[0], "c")
    assert not ex.cache_hit and CACHE_STATS.errors == 1
    x = np.zeros((ROWS, ROWS), np.float32)
    np.testing.assert_array_equal(ex["main"](x), table)  # rebuilt from the IR, not the file
    assert kiln.compile(weights_module()[0], "c").cache_hit


def test_entries_writable_by_others_are_refused_not_deleted() -> None:
    ex = kiln.compile(weights_module()[0], "c")
    assert ex.cache_key is not None
    entry = cache.entry_path(ex.cache_key)
    entry.chmod(0o666)
    with pytest.warns(cache.CacheWarning, match="writable by group or others"):
        again = kiln.compile(weights_module()[0], "c")
    assert not again.cache_hit and entry.exists()


def test_objects_writable_by_others_are_refused() -> None:
    kiln.compile(weights_module()[0], "c")
    (stored,) = weights_objects()
    stored.chmod(0o646)
    with pytest.warns(cache.CacheWarning, match="writable by group or others"):
        assert not kiln.compile(weights_module()[0], "c").cache_hit


def test_an_unsafe_cache_directory_is_not_used(_private_cache: Path) -> None:
    _private_cache.chmod(0o777)
    try:
        with pytest.warns(cache.CacheWarning, match=f"directory {_private_cache} is writable"):
            kiln.compile(weights_module()[0], "c")
        assert CACHE_STATS.stores == 0 and not (_private_cache / cache.LAYOUT).exists()
    finally:
        _private_cache.chmod(0o700)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                    reason="giving a file to another user needs root")
def test_entries_owned_by_another_user_are_refused() -> None:
    ex = kiln.compile(weights_module()[0], "c")
    assert ex.cache_key is not None
    os.chown(cache.entry_path(ex.cache_key), 4242, -1)
    with pytest.warns(cache.CacheWarning, match="owned by uid 4242"):
        assert not kiln.compile(weights_module()[0], "c").cache_hit


def test_new_cache_files_are_private() -> None:
    ex = kiln.compile(weights_module()[0], "c")
    assert ex.cache_key is not None
    for path in [cache.entry_path(ex.cache_key), *objects().values()]:
        assert stat.S_IMODE(path.stat().st_mode) & 0o022 == 0
    assert stat.S_IMODE((cache.cache_dir() / cache.LAYOUT).stat().st_mode) == 0o700


@pytest.mark.parametrize(("text", "expected"), [
    ("123", 123), ("500M", 500 << 20), ("2G", 2 << 30), ("1.5g", 3 << 29),
    ("300KiB", 300 << 10), ("1T", 1 << 40), (" 64 mb ", 64 << 20)])
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


def test_parse_size_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match=r"e\.g\. 500M or 2G"):
        parse_size("lots")


def test_size_cap_evicts_the_least_recently_used(monkeypatch: pytest.MonkeyPatch) -> None:
    looked: list[str] = []
    lookup = cache.lookup
    monkeypatch.setattr(cache, "lookup", lambda key: looked.append(key) or lookup(key))
    keys = []
    for seed in range(3):  # one structure, three sets of weights
        ex = kiln.compile(weights_module(seed)[0], "c")
        keys.append(ex.cache_key)
        os.utime(cache.entry_path(str(ex.cache_key)), (1000 + seed, 1000 + seed))
    assert {e.key for e in cache.list_entries()} == set(keys)
    # A structure never stored cannot hit: the first build looked nothing up (its weights
    # hashed beside its codegen), the others hashed theirs first and missed.
    assert looked == keys[1:] and CACHE_STATS.misses == 3
    (mark,) = (cache.cache_dir() / cache.LAYOUT / "structures").iterdir()
    # Use entry 0 again: entry 1 becomes the least recently used.
    assert kiln.compile(weights_module(0)[0], "c").cache_hit
    cap = cache.usage() + 1024  # room for three entries, not four
    monkeypatch.setenv("KILN_CACHE_MAX", str(cap))
    kiln.compile(weights_module(3)[0], "c")  # the store that goes over the cap
    left = {e.key for e in cache.list_entries()}
    assert keys[0] in left and keys[1] not in left
    assert cache.usage() <= cap
    # The evicted entry's weights went with it; its structure's mark stays for the others.
    assert len(weights_objects()) == len(left) and mark.exists()
    os.utime(mark, (1000, 1000))  # not used since long before any entry left
    cache.evict(0)
    assert not mark.exists()


def test_eviction_reads_each_entry_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A store under the cap reads no entry; eviction parses only the entries it has
    not read yet (an entry replaced on disk counts as new), so a store stays cheap in a
    full cache."""
    read: list[str] = []
    listed = cache._listed

    def counting(path: Path) -> dict[str, object]:
        read.append(path.stem)
        return listed(path)

    monkeypatch.setattr(cache, "_listed", counting)
    keys = [str(kiln.compile(weights_module(seed)[0], "c").cache_key) for seed in range(3)]
    assert read == []  # under the cap: no entry parsed
    cache.evict(cache.usage())
    assert sorted(read) == sorted(keys)
    read.clear()
    cache.evict(cache.usage())
    assert read == []  # each entry read once
    entry = cache.entry_path(keys[0])
    replaced = entry.with_name(".replaced")
    replaced.write_bytes(entry.read_bytes())
    os.chmod(replaced, 0o600)
    os.replace(replaced, entry)  # a new inode: read again
    read.clear()
    cache.evict(cache.usage())
    assert read == [keys[0]]


def test_an_entry_larger_than_the_cap_is_not_stored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_CACHE_MAX", "1K")
    kiln.compile(weights_module()[0], "c")
    assert CACHE_STATS.stores == 0 and cache.list_entries() == []


def test_list_info_and_clear(capsys: pytest.CaptureFixture[str]) -> None:
    ex = kiln.compile(weights_module()[0], "c")
    (entry,) = cache.list_entries()
    assert entry.key == ex.cache_key and "c/constants.bin" in entry.artifacts
    assert entry.size >= ROWS * ROWS * 4
    facts = cache.info()
    assert facts["entries"] == 1 and facts["bytes"] == cache.usage() >= entry.size
    assert kiln_main(["cache", "list"]) == 0
    assert ex.cache_key[:16] in capsys.readouterr().out
    assert kiln_main(["cache", "info"]) == 0
    assert "entries:   1" in capsys.readouterr().out
    assert kiln_main(["cache", "clear"]) == 0
    assert "removed" in capsys.readouterr().out
    assert cache.list_entries() == [] and cache.usage() == 0
    assert not kiln.compile(weights_module()[0], "c").cache_hit
