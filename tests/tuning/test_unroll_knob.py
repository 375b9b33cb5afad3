"""The K-unroll knob of the GEMM micro-kernel families and the blocked direct
convolution (`{"tile": ..., "unroll": U}`):
listed by the search space where the static K allows U, built as a loop of K // U steps
around an `unrolled` loop of U (plus the K % U steps left), the sums in the rule's
order, so every unroll's output is bit-identical to the rule's; an illegal U is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

import kiln
from kiln.distributed.tune import KernelSpec, discover
from kiln.errors import IRError, UsageError
from kiln.ir.tensor import For, PrimFunc
from kiln.ir.visitor import post_order_visit
from kiln.kernels.gemm.knobs import PACKED_K_UNROLL, PACKED_K_UNROLL_MIN_K, TUNED_UNROLLS
from kiln.kernels.registry import KERNELS, build_call
from kiln.target.isa import isa_for
from kiln.tuning import Measurement, Record, TuningDatabase, target_key
from kiln.tuning.apply import Forced, using
from support.graphs import GraphBuilder, value_info
from support.reference import onnxruntime_outputs


def _gemm() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A dense layer, K = 10 (U = 4 and 8 leave 2 steps)."""
    b = GraphBuilder(21)
    y = b.proj("x", 10, 24)
    model = b.model([value_info("x", [5, 10])], [value_info(y, [5, 24])], 17, "dense")
    return model, {"x": np.random.default_rng(0).standard_normal((5, 10), np.float32)}


def _gemm_tiled() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A product of two activations (B packed at run time), K = 6."""
    b = GraphBuilder(22)
    y = b.op("MatMul", "x", "w")
    model = b.model([value_info("x", [3, 6]), value_info("w", [6, 20])],
                    [value_info(y, [3, 20])], 17, "activations")
    rng = np.random.default_rng(1)
    return model, {"x": rng.standard_normal((3, 6), np.float32),
                   "w": rng.standard_normal((6, 20), np.float32)}


#: family -> (input channels, output channels, input NCHW, group, stride) of a small
#: convolution its rule takes: a 1x1 over 16x16 (K = 12), a 1x1 in 2 groups of 12
#: channels over 4x16 (K = 12 per group), a strided 1x1 of 12 channels for the blocked
#: direct kernel (its input-channel loop unrolled; the input subsampled first on AVX2).
CONVS: dict[str, tuple[int, int, list[int], int, int]] = {
    "conv_gemm": (12, 8, [1, 12, 16, 16], 1, 1),
    "conv_grouped": (24, 16, [1, 24, 4, 16], 2, 1),
    "conv_direct": (12, 16, [1, 12, 6, 10], 1, 2)}


def _conv(family: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    cin, cout, shape, group, stride = CONVS[family]
    b = GraphBuilder(23)
    y = b.conv("x", cin, cout, 1, stride=stride, group=group)
    out = [1, cout, shape[2] // stride, shape[3] // stride]
    model = b.model([value_info("x", shape)], [value_info(y, out)], 17, family)
    return model, {"x": np.random.default_rng(2).standard_normal(shape, np.float32)}


MODELS = {"gemm": _gemm, "gemm_tiled": _gemm_tiled,
          **{f: (lambda f=f: _conv(f)) for f in CONVS}}


def _spec(family: str, target: kiln.Target) -> tuple[onnx.ModelProto, dict[str, np.ndarray],
                                                     KernelSpec]:
    model, inputs = MODELS[family]()
    (spec,) = [s for s in discover(model, target) if s.family == family]
    return model, inputs, spec


def _unrolled_loops(ex: Any) -> list[int]:
    """The extents of the `unrolled` loops in the kernels of a build."""
    found: list[int] = []
    for f in ex.ir.functions.values():
        if isinstance(f, PrimFunc):
            post_order_visit(f, lambda n: found.append(int(n.extent.value))
                             if isinstance(n, For) and n.kind == "unrolled" else None)
    return found


def _run(ex: Any, inputs: dict[str, np.ndarray]) -> np.ndarray:
    return np.asarray(ex(*inputs.values()))


@pytest.mark.parametrize("family", sorted(MODELS))
def test_every_legal_unroll_gives_the_rules_bits(family: str) -> None:
    """Each family lists the unrolls no larger than K after its other variants; each
    builds an `unrolled` loop of U and computes exactly the rule's output."""
    target = kiln.Target.from_host()
    model, inputs, spec = _spec(family, target)
    k = {"gemm": 10, "gemm_tiled": 6, "conv_gemm": 12, "conv_grouped": 12,
         "conv_direct": 12}[family]
    offered = [c["unroll"] for c in spec.candidates if "unroll" in c]
    assert offered == [u for u in TUNED_UNROLLS if u <= k]
    # after the splits, the K blocking and its segments, before the other tiles
    at = [i for i, c in enumerate(spec.candidates) if "unroll" in c]
    assert at == list(range(at[0], at[0] + len(at)))
    assert all(i < at[0] for i, c in enumerate(spec.candidates)
               if {"split", "kblock", "ksegment"} & set(c))
    assert all(i > at[-1] for i, c in enumerate(spec.candidates) if set(c) == {"tile"})
    assert all(set(c) == {"tile", "unroll"} and c["tile"] == spec.default["tile"]
               for c in spec.candidates if "unroll" in c)
    rule = kiln.compile(model, target)
    assert _unrolled_loops(rule) == []  # the rule's K loop is LLVM's to unroll
    want = _run(rule, inputs)
    for u in offered:
        with using(Forced(spec.family, {**spec.default, "unroll": u})):
            ex = kiln.compile(model, target)
        assert u in _unrolled_loops(ex)
        np.testing.assert_array_equal(_run(ex, inputs), want)


@pytest.mark.parametrize("family, blocked", [("gemm", {"kblock": True}),
                                             ("conv_direct", {"ksegment": 16})])
def test_an_unroll_within_k_blocks(family: str, blocked: dict[str, Any]) -> None:
    """With the sums blocked along K (the GEMM's `kblock`: K = 300 in two blocks of 150;
    the blocked 1x1 convolution's segments of 16 of 32 channels) each block's loop is
    unrolled (8: 6 steps left in each), bit-identical to the blocking alone."""
    target = kiln.Target.from_host()
    b = GraphBuilder(27)
    if family == "gemm":
        y = b.proj("x", 300, 24)
        shape, out = [3, 300], [3, 24]
    else:
        y = b.conv("x", 32, 8, 1, stride=2)
        shape, out = [1, 32, 4, 6], [1, 8, 2, 3]
    model = b.model([value_info("x", shape)], [value_info(y, out)], 17, "deep")
    (spec,) = [s for s in discover(model, target) if s.family == family]
    assert {**spec.default, **blocked} in spec.candidates
    x = np.random.default_rng(5).standard_normal(shape).astype(np.float32)
    with using(Forced(spec.family, {**spec.default, **blocked})):
        want = np.asarray(kiln.compile(model, target)(x))
    with using(Forced(spec.family, {**spec.default, **blocked, "unroll": 8})):
        ex = kiln.compile(model, target)
    assert 8 in _unrolled_loops(ex)
    np.testing.assert_array_equal(np.asarray(ex(x)), want)


def test_a_database_applies_an_unroll(tmp_path: Path) -> None:
    """A record choosing `{"unroll": 4}` (recorded timings: twice as fast) is applied by
    a tuned compile like any other params: the metadata names it, the kernel holds the
    unrolled loop, the output is the rule's bit for bit."""
    target = kiln.Target.from_host()
    model, inputs, spec = _spec("conv_gemm", target)
    chosen = {**spec.default, "unroll": 4}
    db = TuningDatabase([Record(spec.family, spec.signature, target_key(isa_for(target)),
                                Measurement(spec.default, (100.0,) * 5),
                                [Measurement(chosen, (50.0,) * 5, True, (100.0,) * 5)])])
    path = tmp_path / "unroll.tuning.json"
    db.save(path)
    with pytest.warns(UserWarning, match="not checked in this model"):
        tuned = kiln.compile(model, target, tuning=str(path))
    assert list(tuned.metadata["tuning"]["kernels"].values()) == [chosen]
    assert 4 in _unrolled_loops(tuned)
    np.testing.assert_array_equal(_run(tuned, inputs),
                                  _run(kiln.compile(model, target), inputs))


def test_the_c_backend_unrolls_alike() -> None:
    """The C backend (`KILN_UNROLL`) computes the rule's bits too, K = 10 by 4."""
    target = kiln.Target("c")
    model, inputs, spec = _spec("gemm", target)
    want = _run(kiln.compile(model, target), inputs)
    with using(Forced(spec.family, {**spec.default, "unroll": 4})):
        ex = kiln.compile(model, target)
    assert 4 in _unrolled_loops(ex)
    np.testing.assert_array_equal(_run(ex, inputs), want)


def test_an_avx512_target_compiles_an_unrolled_kernel() -> None:
    """An AVX-512 CPU's kernel with an unrolled K loop compiles and verifies (it runs
    where the host has AVX-512)."""
    target = kiln.Target("llvm -mtriple=x86_64-linux-gnu -mcpu=znver4")
    model, _, spec = _spec("conv_gemm", target)
    with using(Forced(spec.family, {**spec.default, "unroll": 8})):
        ex = kiln.compile(model, target)
    assert 8 in _unrolled_loops(ex)


@pytest.mark.parametrize("unroll", [16, 3, 0, True, "4"])
def test_an_illegal_unroll_is_refused(unroll: Any) -> None:
    """U larger than K (16 > 10), not a tuned factor, or not an int: a UsageError."""
    target = kiln.Target.from_host()
    model, _, spec = _spec("gemm", target)
    with pytest.raises(UsageError, match="unroll"), \
            using(Forced(spec.family, {**spec.default, "unroll": unroll})):
        kiln.compile(model, target)


@pytest.mark.parametrize("family", ["conv_depthwise", "conv_direct"])
def test_no_unroll_without_a_plain_k_loop(family: str) -> None:
    """The depthwise kernel has no K loop to unroll, and a 3x3 layer's blocked kernel
    is not offered one (its channel loop holds the tap loops; it measured slower): none
    listed, one refused."""
    target = kiln.Target.from_host()
    b = GraphBuilder(26)
    depthwise = family == "conv_depthwise"
    y = b.conv("x", 16, 16, 3, group=16 if depthwise else 1)
    width = 32 if depthwise else 5  # the blocked kernel's rows are short
    model = b.model([value_info("x", [1, 16, 5, width])],
                    [value_info(y, [1, 16, 5, width])], 17, "taps")
    (spec,) = [s for s in discover(model, target) if s.family == family]
    assert not any("unroll" in c for c in spec.candidates)
    with pytest.raises(UsageError, match="unroll"), \
            using(Forced(spec.family, {**spec.default, "unroll": 2})):
        kiln.compile(model, target)


@pytest.mark.parametrize("unroll", ["4", 0, False])
def test_a_malformed_unroll_attribute_is_an_ir_error(unroll: Any) -> None:
    """A call whose `unroll` attribute is no positive int (a hand-written or corrupted
    module) is refused before its kernel is built."""
    family = KERNELS.get("gemm")
    with pytest.raises(IRError, match="'unroll' must be a positive int"):
        build_call(family, [], [], {"unroll": unroll}, None, None,
                   isa_for(kiln.Target.from_host()))


def test_the_rule_unrolls_a_long_packed_k_by_two() -> None:
    """A dense layer of K >= PACKED_K_UNROLL_MIN_K (64) takes the rule's unroll of 2 (K =
    10, the other tests' layer, keeps the plain loop) and computes onnxruntime's output."""
    target = kiln.Target.from_host()
    b = GraphBuilder(29)
    y = b.proj("x", PACKED_K_UNROLL_MIN_K, 24)
    model = b.model([value_info("x", [5, PACKED_K_UNROLL_MIN_K])], [value_info(y, [5, 24])],
                    17, "long")
    x = np.random.default_rng(6).standard_normal((5, PACKED_K_UNROLL_MIN_K), np.float32)
    rule = kiln.compile(model, target)
    assert _unrolled_loops(rule) == [PACKED_K_UNROLL]
    np.testing.assert_allclose(np.asarray(rule(x)), onnxruntime_outputs(model, {"x": x})[0],
                               rtol=1e-5, atol=1e-5)
