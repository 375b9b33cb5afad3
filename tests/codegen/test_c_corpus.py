"""Every tensor-level function of the IR corpus, through the C backend, matches the interpreter.

All corpus modules are compiled into one library (one symbol prefix per case,
compiled in parallel) straight from `codegen_c`, without the driver: this is the
backend's own check. The driver-level check for every target is
tests/e2e/test_corpus_backends.py.
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from c_helpers import CLibrary, build_many, have_cc

from kiln.codegen.c import emit_kernels
from kiln.codegen.constants import ConstantPool
from kiln.codegen.host import host_source
from kiln.codegen.naming import library_metadata
from kiln.errors import CallError, CompileError, IRError
from kiln.ir import IRModule
from kiln.transform.outline import OutlineParallelLoops

corpus = pytest.importorskip("corpus", reason="the IR corpus (tests/corpus) is not available")
CORPUS = getattr(corpus, "CORPUS", None) or {}
from corpus._case import assert_outputs_match, run_interpreter  # noqa: E402

# One worker runs the module, so the libraries (the `libraries` fixture, ~12 s) are built
# once, not once per xdist worker.
pytestmark = [pytest.mark.skipif(not have_cc(), reason="needs a C compiler"),
              pytest.mark.xdist_group("c_corpus")]


def _prefix(case_name: str) -> str:
    return f"c{sorted(CORPUS).index(case_name)}_"


def _functions() -> list[Any]:
    return [pytest.param(case_name, fname, id=f"{case_name}.{fname}")
            for case_name, case in sorted(CORPUS.items())
            for fname in case.module().prim_funcs()]


def _unsupported(mod: IRModule) -> str | None:
    """Why the C backend rejects `mod` by design (symbolic shapes: kernels whose shape
    variables are not parameters, packed entries of symbolic functions), else None."""
    try:
        emit_kernels(OutlineParallelLoops()(mod), prefix="probe_",
                     pool=ConstantPool.from_module(mod))
        host_source(mod, prefix="probe_", metadata=library_metadata(mod, "probe_"))
    except CompileError as exc:
        if "symbolic shape" in str(exc):
            return str(exc)
        raise
    return None


@pytest.fixture(scope="module")
def libraries(tmp_path_factory: pytest.TempPathFactory) -> dict[str, CLibrary | str]:
    """A library per case prefix, or the reason the case is out of the backend's scope."""
    mods: dict[str, IRModule] = {}
    skipped: dict[str, CLibrary | str] = {}
    for name, case in sorted(CORPUS.items()):
        mod = IRModule(case.module().prim_funcs())
        reason = _unsupported(mod)
        if reason is None:
            mods[_prefix(name)] = mod
        else:
            skipped[_prefix(name)] = reason
    # host.c is tested at -O2 elsewhere; -O0 here halves the compile time.
    built = build_many(mods, Path(tmp_path_factory.mktemp("c_corpus")), host_opt="-O0")
    return {**skipped, **built}


@pytest.mark.parametrize(("case_name", "func_name"), _functions())
def test_corpus_function_matches_interpreter(libraries: dict[str, CLibrary | str],
                                             case_name: str, func_name: str) -> None:
    case = CORPUS[case_name]
    lib = libraries[_prefix(case_name)]
    if isinstance(lib, str):
        pytest.skip(f"out of the C backend's scope: {lib}")
    seed = zlib.crc32(f"c/{case_name}/{func_name}".encode())
    args = case.args(func_name, np.random.default_rng(seed))
    try:
        expected = run_interpreter(case, func_name, args)
    except (CallError, IRError) as exc:  # a corpus problem, reported by the corpus's own tests
        pytest.skip(f"the interpreter rejects this corpus case: {exc}")
    actual = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    lib.run(func_name, *actual)
    assert_outputs_match(case, expected, actual, f"{case_name}.{func_name} (C backend)")
