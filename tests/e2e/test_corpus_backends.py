"""Every function of the IR corpus, compiled for llvm, c and llvmjit, matches the interpreter.

Corpus modules are compiled once per target (merged into a few bundles, see
BUNDLE_SIZE); every function then runs on fresh random inputs, and its results (every buffer
argument after the call for a PrimFunc, the returned value(s) for a graph
function) are compared with `kiln.ir.evaluate` on copies of the same inputs.
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np
import pytest

import kiln
from kiln.driver import Executable
from kiln.errors import CallError
from kiln.ir import IRModule
from kiln.ir import graph as g
from kiln.ir.types import TensorType, TupleType

corpus = pytest.importorskip("corpus",
                             reason="the IR corpus (tests/corpus) is not written yet")
CORPUS = getattr(corpus, "CORPUS", None)
if not CORPUS:
    pytest.skip("tests/corpus defines no CORPUS yet", allow_module_level=True)

assert_outputs_match = corpus.assert_outputs_match
run_interpreter = corpus.run_interpreter

TARGETS = ["llvm", "c", "llvmjit"]


def unsupported(mod: IRModule) -> str | None:
    """Why the native backends cannot compile `mod` at all (documented limits), or None."""
    for name, fn in mod.items():
        if isinstance(fn, g.Function):
            for p in fn.params:
                if isinstance(p.type, TupleType):
                    return f"graph function '{name}' has a tuple parameter '{p.name}'"
            types = [p.type for p in fn.params]
        else:
            types = [TensorType(b.shape, b.dtype) for b in fn.buffer_params]
        for ty in types:
            if isinstance(ty, TensorType) and not all(isinstance(d, int) for d in ty.shape):
                return f"function '{name}' has a symbolic shape {ty}"
    return None


def _cases() -> list[Any]:
    params = []
    for case_name, case in sorted(CORPUS.items()):
        marks: list[Any] = []
        reason = unsupported(case.module())
        if reason is not None:
            marks.append(pytest.mark.skip(reason=f"native backends need static, flat "
                                                 f"signatures: {reason}"))
        for func_name, fn in case.module().items():
            level = "graph" if isinstance(fn, g.Function) else "tensor"
            for target in TARGETS:
                params.append(pytest.param(case_name, func_name, target, marks=marks,
                                           id=f"{case_name}.{func_name}[{level}]-{target}"))
    return params


# Compiling and linking each corpus module separately for three targets costs
# ~180 toolchain runs; cases whose function names do not collide are merged
# into a few bundles compiled once per target instead. If a bundle fails to
# compile, its cases fall back to compiling alone, so one bad case cannot hide
# the others.
BUNDLE_SIZE = 16


def _make_bundles() -> dict[str, int]:
    bundles: list[tuple[set[str], list[str]]] = []
    owner: dict[str, int] = {}
    for case_name, case in sorted(CORPUS.items()):
        mod = case.module()
        if unsupported(mod) is not None:
            continue
        names = set(mod.functions)
        for index, (taken, members) in enumerate(bundles):
            if len(members) < BUNDLE_SIZE and not taken & names:
                taken.update(names)
                members.append(case_name)
                owner[case_name] = index
                break
        else:
            bundles.append((set(names), [case_name]))
            owner[case_name] = len(bundles) - 1
    return owner


BUNDLE_OF = _make_bundles()
_COMPILED: dict[tuple[object, str], Executable | Exception] = {}


def _compile(key: tuple[object, str], build: Any) -> Executable | Exception:
    if key not in _COMPILED:
        try:
            _COMPILED[key] = kiln.compile(build(), key[1])
        except Exception as exc:
            _COMPILED[key] = exc
    return _COMPILED[key]


def _bundle_module(index: int) -> IRModule:
    functions: dict[str, Any] = {}
    for case_name, owner in BUNDLE_OF.items():
        if owner == index:
            functions.update(CORPUS[case_name].module().functions)
    return IRModule(functions)


def _executable(case_name: str, target: str) -> Executable:
    if case_name in BUNDLE_OF:
        index = BUNDLE_OF[case_name]
        bundled = _compile((index, target), lambda: _bundle_module(index))
        if isinstance(bundled, Executable):
            return bundled
    result = _compile((case_name, target), lambda: CORPUS[case_name].module())
    if isinstance(result, Exception):
        raise result
    return result


def _copy(args: list[Any]) -> list[Any]:
    return [a.copy() if isinstance(a, np.ndarray) else a for a in args]


@pytest.mark.parametrize(("case_name", "func_name", "target"), _cases())
def test_compiled_function_matches_interpreter(case_name: str, func_name: str,
                                               target: str) -> None:
    case = CORPUS[case_name]
    ex = _executable(case_name, target)
    seed = zlib.crc32(f"{case_name}/{func_name}".encode()) ^ 0x5EED
    args = case.args(func_name, np.random.default_rng(seed))
    try:
        expected = run_interpreter(case, func_name, args)
    except CallError as exc:  # e.g. a division by zero: the inputs are not valid for it
        pytest.skip(f"the interpreter rejects random inputs for this function: {exc}")
    signature = ex.metadata["functions"][func_name]
    if isinstance(case.module()[func_name], g.Function):
        actual = ex[func_name](*_copy(args))
    elif signature["kind"] == "graph":
        # A PrimFunc already in lowered-graph form (kiln.graph): the runtime takes its
        # inputs and returns its trailing output buffers.
        n_in = len(signature["params"])
        got = ex[func_name](*_copy(args[:n_in]))
        actual = [*expected[:n_in], *(got if isinstance(got, tuple) else (got,))]
    else:
        actual = _copy(args)
        ex[func_name](*actual)
    assert_outputs_match(case, expected, actual, f"{case_name}.{func_name} on {target}")
