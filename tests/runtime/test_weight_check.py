"""The weight check in the background (kiln.runtime.weights): a thread started at load
hashes the chunks, a call waits only for the chunks left (hashing them itself), a
damaged chunk never reaches a result, `close()` stops the thread before unmapping,
a forked child finishes what the parent's thread had taken, and exit never waits; the
pages of a constant read only by a gather are handed back once hashed, the results
staying right (kiln.runtime.gathered_pages), from their own file range, which is written
back first, and never advised large pages."""

from __future__ import annotations

import ctypes
import mmap
import os
import signal
from pathlib import Path

import numpy as np
import pytest

import kiln
from kiln.ir import IRBuilder
from kiln.ir import graph as g
from kiln.runtime import gathered_pages, load_module, page_advice
from kiln.runtime.gathered_pages import gathered_ranges
from kiln.runtime.weights import ChunkCheck
from support.processes import run_python

ROWS, COLS = 3072, 1024  # 12 MiB of weights: three 4 MiB chunks
IDX = np.array([0, ROWS // 2, ROWS - 1], dtype=np.int64)
WEIGHT = np.random.default_rng(61).standard_normal((COLS, 16)).astype(np.float32)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    """`main(idx) = (table[idx], table[idx] @ WEIGHT)` with a 12 MiB table, exported once."""
    table = np.random.default_rng(60).standard_normal((ROWS, COLS)).astype(np.float32)
    ib = IRBuilder()
    with ib.function("main"):
        idx = ib.param("idx", (3,), "int64")
        rows = ib.emit(kiln.ops.call("gather", g.Constant(table, "table"), idx, axis=0), "rows")
        ib.ret(g.Tuple((rows, ib.emit(kiln.ops.call("matmul", rows, g.Constant(WEIGHT, "w")),
                                      "y"))))
    folder = tmp_path_factory.mktemp("weight_check")
    so = kiln.compile(ib.get(), "c").export_library(folder / "table.so")
    return Path(so), table


def right(lib: kiln.runtime.Module, table: np.ndarray) -> bool:
    """Whether `main(IDX)` gives the rows (exactly) and their product with WEIGHT."""
    rows, y = lib["main"](IDX)
    return bool(np.array_equal(rows, table[IDX])
                and np.allclose(y, table[IDX] @ WEIGHT, rtol=1e-4, atol=1e-4))


def check_of(lib: kiln.runtime.Module) -> ChunkCheck:
    entry = lib.get_function("main", query_imports=False).c_func  # type: ignore[union-attr]
    assert isinstance(entry.check, ChunkCheck)
    return entry.check


def no_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loads start no background thread: the state of the check is the test's."""
    monkeypatch.setattr(ChunkCheck, "start", lambda self, keep=None: None)


def test_the_background_thread_checks_everything_and_hands_the_table_back(built, monkeypatch):
    so, table = built
    advised: list[tuple[int, int, int]] = []
    written: list[tuple[int, bytes, int]] = []
    real_advise = page_advice.advise
    monkeypatch.setattr(page_advice, "advise", lambda a, n, advice: advised.append(
        (a, n, advice)) or real_advise(a, n, advice))
    monkeypatch.setattr(gathered_pages, "SYNC_FILE_RANGE", lambda fd, off, n, flags: (
        written.append((off, os.pread(fd, n, off), flags)), 0)[1])
    with load_module(so) as lib:
        check = check_of(lib)
        check.join()
        assert check.done or not check._todo  # every chunk hashed, no call made
        assert right(lib, table)  # the table's pages handed back: the rows fault in again
        assert check.done and check.error is None
        gathered = [a.metadata.get("gathered") for a in lib.artifacts
                    if a.file_name == "constants.bin"]
        assert len(gathered) == 1 and len(gathered[0]) == 1  # the table, not the weight
        assert gathered[0][0][1] == table.nbytes
        ((address, length),) = check.pages.ranges  # type: ignore[attr-defined]
        assert ctypes.string_at(address, 64) == table.tobytes()[:64]  # the table's address
    assert written and all(flags == 7 for _, _, flags in written)  # waiting for the writes
    written.sort()  # chunk by chunk, the file's bytes of the table, end to end
    assert b"".join(data for _, data, _ in written) == table.tobytes()
    assert [off for off, _, _ in written] == [
        written[0][0] + sum(len(data) for _, data, _ in written[:i]) for i in range(len(written))]
    first = -(-address // mmap.PAGESIZE) * mmap.PAGESIZE  # the table's whole pages
    last = (address + length) // mmap.PAGESIZE * mmap.PAGESIZE
    huge = [(a, n) for a, n, advice in advised if advice == mmap.MADV_HUGEPAGE]
    assert (first, last - first, mmap.MADV_NOHUGEPAGE) in advised  # no large pages there
    assert huge and all(a + n <= first or a >= last for a, n in huge)


@pytest.mark.parametrize("value", [
    "0,64", [[0]], [[-64, 64]], [[0, 0]], [[64, 1 << 20]], [[0, 128], [64, 64]],
    [[True, 64]], [[0.0, 64]]])
def test_a_malformed_gathered_record_is_refused(value):
    with pytest.raises(kiln.FormatError, match="'gathered' metadata is malformed"):
        gathered_ranges(value, 4096, "lib.so: linked data c/constants.bin")


def test_a_gathered_record_reads_back_sorted():
    assert gathered_ranges([[128, 64], [0, 64]], 4096, "x") == [(0, 64), (128, 64)]


def test_a_call_hashes_the_chunks_left(built, monkeypatch):
    so, table = built
    no_thread(monkeypatch)
    with load_module(so) as lib:
        check = check_of(lib)
        assert not check.done
        assert right(lib, table)
        assert check.done and check.error is None


@pytest.mark.parametrize("chunk, hash_name, words", [
    (0, "lane64", r"checksum \(kiln.lane64/1\)"), (2, "lane64", r"checksum \(kiln.lane64/1\)"),
    (2, "sha256", "SHA-256")])
def test_a_damaged_chunk_never_reaches_a_result(built, tmp_path, monkeypatch, chunk, hash_name,
                                                words):
    monkeypatch.setenv("KILN_WEIGHTS_HASH", hash_name)  # the library's table, or the blob's
    so, table = built
    data = bytearray(so.read_bytes())
    at = bytes(data).find(table[0].tobytes()) + chunk * (4 << 20) + 100
    data[at] ^= 0x10
    bad = tmp_path / "bad.so"
    bad.write_bytes(bytes(data))
    start = chunk * (4 << 20)
    message = rf"{words} mismatch in bytes \[{start}, {start + (4 << 20)}\)"
    with load_module(bad) as lib:
        for _ in range(2):
            with pytest.raises(kiln.FormatError, match=message):
                lib["main"](IDX)


def test_close_stops_the_thread_before_unmapping(built):
    so, _table = built
    for _ in range(3):  # close right after load: the thread is stopped and joined first
        lib = load_module(so)
        check = check_of(lib)
        lib.close()
        assert not check._active and check._ended.is_set()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this host")
def test_a_forked_child_hashes_what_the_parent_thread_had_taken(built, monkeypatch):
    so, table = built
    no_thread(monkeypatch)
    with load_module(so) as lib:
        check = check_of(lib)
        taken = check._take(True)  # as if the thread were hashing this chunk at the fork
        assert taken is not None
        pid = os.fork()
        if pid == 0:  # the child: the chunk goes back on the list, the call finishes
            code = 1
            try:
                signal.alarm(30)  # a hang ends the child, failing the test
                code = 0 if right(lib, table) else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        check._busy.discard(taken)  # give it back here too: the parent finishes the check
        check._todo.append(taken)  # type: ignore[union-attr]
        assert right(lib, table)


def test_exit_does_not_wait_for_the_thread(built):
    so, _table = built
    done = run_python("import sys; from kiln.runtime import load_module; "
                      "lib = load_module(sys.argv[1]); print('loaded')", str(so), timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "loaded"
