"""kiln's source digest (the caches' key of kiln itself), remembered by its files' stats."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

import kiln
from kiln.driver import cache, source_digest


def _tree(root: Path) -> None:
    for rel, text in [("__init__.py", ""), ("a.py", "a = 1\n"), ("a/x.py", "x = 2\n"),
                      ("a/b/y.c", "int y;\n"), ("ab.h", "#define AB\n"),
                      ("__pycache__/a.cpython-311.py", "not a source\n"),
                      ("data.json", "{}\n")]:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _age(root: Path, seconds: float) -> None:
    past = time.time() - seconds
    for path in root.rglob("*"):
        os.utime(path, (past, past))


def _plain_digest(root: Path) -> str:
    """The digest as it was computed before it was remembered: every file read."""
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.suffix in (".py", ".c", ".h")
                       and "__pycache__" not in p.parts):
        h.update(str(path.relative_to(root)).encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()


def test_the_files_and_digest_are_those_of_a_full_walk(tmp_path: Path) -> None:
    _tree(tmp_path)
    files = source_digest.source_files(tmp_path)
    assert files == ["__init__.py", "a/b/y.c", "a/x.py", "a.py", "ab.h"]  # Path order
    assert source_digest.content_digest(tmp_path, files) == _plain_digest(tmp_path)
    root = Path(kiln.__file__).resolve().parent
    assert cache.kiln_source_fingerprint.__wrapped__() == _plain_digest(root)


def test_a_changed_size_or_time_is_another_key(tmp_path: Path) -> None:
    _tree(tmp_path)
    files = source_digest.source_files(tmp_path)
    key, newest = source_digest.stat_key(tmp_path, files)
    assert not source_digest.settled(newest)  # just written
    _age(tmp_path, 10)
    aged, newest = source_digest.stat_key(tmp_path, files)
    assert aged != key and source_digest.settled(newest)
    (tmp_path / "a.py").write_text("a = 10\n")
    assert source_digest.stat_key(tmp_path, files)[0] not in (key, aged)


def test_the_digest_is_remembered_once_the_files_settled(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "src"
    _tree(src)
    monkeypatch.setattr(kiln, "__file__", str(src / "__init__.py"))
    memos = cache.cache_dir() / cache.LAYOUT / "sources"
    digest = cache.kiln_source_fingerprint.__wrapped__()
    assert digest == _plain_digest(src) and not memos.exists()  # files too fresh
    _age(src, 10)
    assert cache.kiln_source_fingerprint.__wrapped__() == digest
    (memo,) = memos.iterdir()
    assert memo.read_text() == digest
    memo.write_text("0" * 64)  # what a process finds there is what it takes
    assert cache.kiln_source_fingerprint.__wrapped__() == "0" * 64
    memo.write_text("not a digest")
    assert cache.kiln_source_fingerprint.__wrapped__() == digest
    (src / "a.py").write_text("a = 3\n")  # a new key: read again
    assert cache.kiln_source_fingerprint.__wrapped__() == _plain_digest(src) != digest


def test_no_memo_without_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "src"
    _tree(src)
    _age(src, 10)
    monkeypatch.setattr(kiln, "__file__", str(src / "__init__.py"))
    monkeypatch.setenv("KILN_CACHE", "0")
    assert cache.kiln_source_fingerprint.__wrapped__() == _plain_digest(src)
    assert not (cache.cache_dir() / cache.LAYOUT).exists()
