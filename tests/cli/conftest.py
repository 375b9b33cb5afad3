from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from kiln_cli import MODEL, run_kiln


@pytest.fixture(scope="session")
def built_once(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shipped MLP compiled by `kiln compile` for llvm as mlp.so and mlp.a, once per
    process: each compile is a fresh CLI process (~2 s of CPU), and five modules use it."""
    where = tmp_path_factory.mktemp("built-once")
    for out in ("mlp.so", "mlp.a"):
        done = run_kiln("compile", str(MODEL), "-t", "llvm", "-o", out, cwd=where)
        assert done.returncode == 0, done.stderr
    return where


@pytest.fixture(scope="module")
def built(built_once: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory of this module's holding copies of `built_once`'s mlp.so and mlp.a
    (its tests write their inputs and outputs beside them)."""
    where = tmp_path_factory.mktemp("built")
    for library in built_once.iterdir():
        shutil.copy2(library, where / library.name)
    return where
