"""The vectorize-loops pass: which lane loops become `T.vector` loops, per target ISA.

The decision comes from the target's ISA object (kiln.target.isa): any CPU with vector
registers gets the straight-line loops, recorded with its register width; a CPU without
them keeps every loop `vectorized`. The decided module prints, parses back and verifies.
"""

from __future__ import annotations

import pytest

from kiln.errors import IRError
from kiln.ir import IRBuilder, IRModule, assert_structural_equal
from kiln.ir.attrs import ATTR_VECTOR_BITS
from kiln.ir.printer import print_module
from kiln.ir.tensor import For, Intrin
from kiln.ir.verify import verify
from kiln.ir.visitor import iter_stmts
from kiln.script import from_source
from kiln.target import Target
from kiln.transform.pipeline import get_pipeline
from kiln.transform.registry import get_pass
from kiln.transform.vectorize_loops import VectorizeLoops


def _module() -> IRModule:
    """A register tile (straight-line lanes), a lane loop calling exp (no vector form)
    and one carrying a value between iterations (not independent)."""
    ib = IRBuilder()
    with ib.prim_func("kernels"):
        x = ib.arg("X", (4, 8), "float32")
        y = ib.arg("Y", (4, 8), "float32")
        z = ib.arg("Z", (9,), "float32")
        with ib.for_range(4, name="r") as r, \
                ib.for_range(8, name="v", kind="vectorized") as v:
            ib.store(y, [r, v], Intrin("fma", (x[r, v], x[0, v], y[r, v])))
        with ib.for_range(8, name="e", kind="vectorized") as e:
            ib.store(y, [0, e], Intrin("exp", (x[1, e],)))
        with ib.for_range(8, name="c", kind="vectorized") as c:
            ib.store(z, [c + 1], z[c] * 2.0)
    return ib.get()


def _kinds(mod: IRModule) -> dict[str, str]:
    return {s.var.name: s.kind for s in iter_stmts(mod["kernels"].body)
            if isinstance(s, For) and s.var.name != "r"}


@pytest.mark.parametrize(("target", "bits"), [
    ("llvm -mtriple=x86_64-linux-gnu -mcpu=haswell", 256),                 # AVX2
    ("llvm -mtriple=x86_64-linux-gnu -mcpu=skylake-avx512", 512),          # AVX-512
    ("c -mtriple=x86_64-linux-gnu -mcpu=skylake-avx512 -mattr=-avx512f", 256),
    ("llvm -mtriple=aarch64-linux-gnu -mcpu=neoverse-n1", 128),            # NEON
    ("ext_dev", 128),                                                      # generic
    ("c -mtriple=thumbv7em-none-eabihf -mcpu=cortex-m4", 0),               # no vectors
])
def test_decisions_follow_the_target_isa(target: str, bits: int) -> None:
    with Target(target):
        mod = VectorizeLoops()(_module())
    if bits == 0:
        assert _kinds(mod) == {"v": "vectorized", "e": "vectorized", "c": "vectorized"}
        assert ATTR_VECTOR_BITS not in mod.attrs
        return
    assert _kinds(mod) == {"v": "vector", "e": "vectorized", "c": "vectorized"}
    assert mod.attrs[ATTR_VECTOR_BITS] == bits


def test_the_decision_prints_parses_back_and_verifies() -> None:
    mod = VectorizeLoops(vector_bits=256)(_module())
    text = print_module(mod)
    assert "for v in T.vector(8):" in str(text)
    assert "for e in T.vectorized(8):" in str(text)
    assert '"kiln.vector_bits": 256' in str(text)
    parsed = from_source(str(text))
    verify(parsed)
    assert_structural_equal(parsed, mod, map_free_vars=True)


def test_the_verifier_rejects_a_vector_loop_that_is_not_straight_line() -> None:
    text = str(print_module(_module())).replace("T.vectorized(8):\n            Y[0, e]",
                                                "T.vector(8):\n            Y[0, e]")
    assert "T.vector(8)" in text
    with pytest.raises(IRError, match="vector loop 'e' is not straight-line vector code: "
                                      "'exp' has no vector form"):
        verify(from_source(text))


def test_the_pass_is_registered_and_ends_the_default_tensor_pipeline() -> None:
    assert isinstance(get_pass("vectorize-loops", vector_bits=128), VectorizeLoops)
    pipeline = get_pipeline("default", "tensor")
    assert [p.name for p in pipeline.passes][-1] == "vectorize-loops"


def _row_copy(n: int) -> IRModule:
    """A padded row's copy, as a convolution's band fill: `Y[0] = Y[n+1] = 0`,
    `Y[q + 1] = X[q]`, a lane loop of `n` (Whisper's 3000-sample rows)."""
    ib = IRBuilder()
    with ib.prim_func("kernels"):
        x = ib.arg("X", (n,), "float32")
        y = ib.arg("Y", (n + 2,), "float32")
        ib.store(y, [0], 0.0)
        with ib.for_range(n, name="q", kind="vectorized") as q:
            ib.store(y, [q + 1], x[q] * 2.0)
        ib.store(y, [n + 1], 0.0)
    return ib.get()


@pytest.mark.parametrize(("n", "bits", "pieces"), [
    (3000, 512, [(64, 46), 32, 16, 8]),  # 2944 in pieces of 4 x 16 lanes, then 32 + 16 + 8
    (3000, 256, [(32, 93), 16, 8]),      # 2976 in pieces of 4 x 8 lanes, then 16 + 8
    (257, 128, [(16, 16), 1]),           # 256, then one lane: a serial loop
])
def test_a_loop_longer_than_a_vector_runs_vector_pieces(
        n: int, bits: int, pieces: list[object]) -> None:
    """A lane loop above MAX_LANES (256) that is vector code runs as a serial loop over
    pieces of four registers and its rest as register pieces (under `noimplicitfloat`,
    in a `kiln.no_slp` kernel, LLVM vectorizes nothing itself); the copy is exact on
    llvm and c."""
    import numpy as np

    import kiln

    mod = VectorizeLoops(vector_bits=bits)(_row_copy(n))
    loops = [s for s in iter_stmts(mod["kernels"].body) if isinstance(s, For)]
    got: list[object] = []
    for s in loops:
        if s.kind == "serial" and isinstance(s.body, For):
            got.append((int(s.body.extent.value), int(s.extent.value)))
        elif s.kind == "vector" and s not in [o.body for o in loops]:
            got.append(int(s.extent.value))
        elif s.kind == "serial":
            got.append(1)
    assert got == pieces
    assert not any(s.kind == "vectorized" for s in loops)
    verify(from_source(str(print_module(mod))))
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    for target in ("llvm", "c"):
        y = np.full(n + 2, np.nan, np.float32)
        kiln.compile(_row_copy(n), target).jit()["kernels"](x, y)
        np.testing.assert_array_equal(y, np.concatenate([[0], 2 * x, [0]]))


def _strided_rows(step: int) -> IRModule:
    """Under a loop over `i`, a lane loop of 8 storing `Y[i*3*step + v + k*step]` for k
    of 0, 1, 2 (as a Winograd transform stores one tile's positions) from X."""
    ib = IRBuilder()
    with ib.prim_func("kernels"):
        x = ib.arg("X", (4, 8), "float32")
        y = ib.arg("Y", (12 * 8,), "float32")
        with ib.for_range(4, name="i") as i, \
                ib.for_range(8, name="v", kind="vectorized") as v:
            for k in range(3):
                ib.store(y, [i * (3 * step) + v + k * step], x[i, v] * float(k + 1))
    return ib.get()


@pytest.mark.parametrize(("step", "kind"), [(8, "vector"), (1, "vectorized")])
def test_stores_a_constant_apart_from_a_loop_varying_base(step: int, kind: str) -> None:
    """Stores whose indices differ by constants added to one expression of the loop
    variables are independent when that distance is at least the lane count (8 elements
    apart), and stay a scalar loop when it is less (1 apart: iteration `v + 1` of one
    store writes iteration `v`'s element of the next)."""
    import numpy as np

    import kiln

    mod = VectorizeLoops(vector_bits=256)(_strided_rows(step))
    assert _kinds(mod) == {"i": "serial", "v": kind}
    if kind != "vector":
        return
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    for target in ("llvm", "c"):
        y = np.zeros(96, np.float32)
        kiln.compile(_strided_rows(step), target).jit()["kernels"](x, y)
        want = np.stack([x * (k + 1) for k in range(3)], axis=1).reshape(-1)
        np.testing.assert_array_equal(y, want)
