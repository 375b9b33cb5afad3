"""ProfileKernelCalls: timers around every kernel call, valid IR the interpreter and the
DSL handle, sites recorded in order; only native codegens with host.c accept profile=True."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import kiln
from kiln.errors import CompileError, IRError
from kiln.ir import assert_structural_equal
from kiln.ir import tensor as t
from kiln.ir.evaluate import evaluate
from kiln.ir.profiling import profile_sites
from kiln.ir.verify import verify
from kiln.ir.visitor import iter_nodes, iter_stmts
from kiln.script import from_source, print_module
from kiln.transform.profile import ProfileKernelCalls

CNN = Path(__file__).resolve().parents[2] / "models" / "tiny_cnn.onnx"


@pytest.fixture(scope="module")
def lowered() -> kiln.IRModule:
    return kiln.compile(str(CNN), "llvm").ir


def test_every_call_and_the_whole_body_get_a_site(lowered: kiln.IRModule) -> None:
    timed = ProfileKernelCalls()(lowered)
    verify(timed)
    callees = [s.func for s in iter_stmts(lowered["main"].body) if isinstance(s, t.CallFunc)]
    assert profile_sites(timed) == (*(("main", c) for c in callees), ("main", None))
    starts = [n for n in iter_nodes(timed["main"].body)
              if isinstance(n, t.Intrin) and n.name == t.PROFILE_START]
    stops = [n for n in iter_nodes(timed["main"].body)
             if isinstance(n, t.Intrin) and n.name == t.PROFILE_STOP]
    assert sorted(int(n.args[0].value) for n in starts) == list(range(len(callees) + 1))
    assert sorted(int(n.args[0].value) for n in stops) == list(range(len(callees) + 1))
    # Kernels themselves are untouched.
    assert all(timed[name] is lowered[name] for name in lowered.functions if name != "main")


def test_interpreter_and_dsl_accept_the_timers(lowered: kiln.IRModule) -> None:
    timed = ProfileKernelCalls()(lowered)
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)
    got, want = np.zeros((1, 10), np.float32), np.ones((1, 10), np.float32)
    evaluate(timed, "main", x, got)
    evaluate(lowered, "main", x, want)
    np.testing.assert_array_equal(got, want)
    assert_structural_equal(from_source(print_module(timed)), timed)


def test_timer_arguments_must_be_int64() -> None:
    with pytest.raises(IRError, match="profile_start' takes int64"):
        verify(t.PrimFunc((), t.Evaluate(t.Intrin(t.PROFILE_START, (t.const(0, "int32"),)))))


def test_profile_needs_a_codegen_with_host_c() -> None:
    with pytest.raises(CompileError, match="profile=True needs a native library"):
        kiln.compile(str(CNN), "llvmjit", profile=True)


def test_the_pass_by_name_in_a_tensor_pipeline() -> None:
    """`profile-kernel-calls` at the end of a tensor pipeline builds the library that
    profile=True builds (the same sites, a loaded library that counts its calls), and
    profile=True on top of it does not time twice."""
    pipeline = "simplify,interchange-reductions,parallelize,profile-kernel-calls"
    named = kiln.compile(str(CNN), "llvm", tensor_pipeline=pipeline)
    flagged = kiln.compile(str(CNN), "llvm", profile=True)
    both = kiln.compile(str(CNN), "llvm", tensor_pipeline=pipeline, profile=True)
    assert named.metadata["profile"] == flagged.metadata["profile"] == both.metadata["profile"]
    assert len(named.metadata["profile"]["sites"]) > 1
    lib = named.jit()
    x = np.zeros((1, 3, 16, 16), np.float32)
    lib["main"](x)
    lib["main"](x)
    assert [r.calls for r in lib.profile()] == [2] * len(named.metadata["profile"]["sites"])
