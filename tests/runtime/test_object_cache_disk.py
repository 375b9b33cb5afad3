"""The object cache on disk (kiln.runtime.object_cache): a new process finds the objects
an earlier one compiled, from another working directory too (each child runs in its
own), a damaged file is compiled again, and KILN_CACHE=0 keeps nothing on disk."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kiln.runtime.object_cache import object_key
from support.processes import run_python

# Compiles one C file through compile_native as an export does; prints what ran the
# compiler (native.run's "compiling ..." lines) and where the object's key lives.
CHILD = r"""
import sys
from pathlib import Path
from kiln.artifact import Artifact
from kiln.runtime import native

ran = []
run_all = native._run_all
native._run_all = lambda jobs: (ran.extend(w for _c, w in jobs), run_all(jobs))[1]
source = b"int kiln_disk_cache_probe(int x) { return 3 * x + 1; }\n"
native.compile_native([Artifact("host", "native", "probe.c", source, {})], Path(sys.argv[1]),
                      prefix="kiln_")
print("compiled" if any(w.startswith("compiling") for w in ran) else "reused")
"""


def _child(tmp_path: Path, cache: Path, tag: str, **env: str) -> str:
    out = tmp_path / tag
    out.mkdir()
    proc = run_python(CHILD, str(out), env={"KILN_CACHE_DIR": str(cache), **env}, cwd=out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip()


def test_a_new_process_reuses_the_object_and_ignores_a_damaged_one(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    assert _child(tmp_path, cache, "first") == "compiled"
    files = [p for p in (cache / "objects").rglob("*") if p.is_file()]
    assert len(files) == 1
    assert _child(tmp_path, cache, "second") == "reused"
    data = bytearray(files[0].read_bytes())
    data[-1] ^= 0xFF  # the object's last byte: its SHA-256 no longer matches
    files[0].write_bytes(bytes(data))
    assert _child(tmp_path, cache, "damaged") == "compiled"
    assert _child(tmp_path, cache, "rewritten") == "reused"


def test_kiln_cache_off_keeps_nothing_on_disk(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    assert _child(tmp_path, cache, "off1", KILN_CACHE="0") == "compiled"
    assert _child(tmp_path, cache, "off2", KILN_CACHE="0") == "compiled"
    assert not (cache / "objects").exists()


@pytest.mark.parametrize(("flag", "same"), [("-O2", True), ("-g", False), ("--coverage", False)])
def test_the_working_directory_keys_only_compiles_that_record_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flag: str, same: bool) -> None:
    """Debug and coverage data hold the compiler's working directory, other objects do
    not: only their keys change with it."""
    command = ["cc", "-c", flag, "-o", "/a/p.c.o", "/a/p.c"]
    keys = []
    for where in ("one", "two"):
        (tmp_path / where).mkdir()
        monkeypatch.chdir(tmp_path / where)
        keys.append(object_key(command, b"int x;\n", "/a/p.c", "/a/p.c.o"))
    assert (keys[0] == keys[1]) is same, os.getcwd()
