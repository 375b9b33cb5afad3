"""The GEMM micro-kernel (kiln.kernels.gemm) against onnxruntime and the interpreter.

One ONNX model holds every edge case as an independent branch (so each backend
compiles once): remainders of the row tile (M), of the panel width (N) and odd K,
a 1-wide output, K = 1, matrix-vector products (M = 1, the wide tile), Gemm's
transB / alpha / beta / bias, leading dims flattened into rows, products of two
activations with broadcast batch dims and a transposed B (packed at run time), and
the epilogues FuseOps attaches (bias, ReLU, Clip, Sigmoid, residual Add). It runs
on llvm and c, in this process and in fresh processes with 1 and 2 threads.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import kernel_checks
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.frontend import from_onnx
from kiln.ir import assert_structural_equal, evaluate
from kiln.ir import graph as g
from kiln.ir.printer import print_func
from kiln.kernels.gemm.families import choose_tile
from kiln.kernels.gemm.knobs import GemmTiling
from kiln.kernels.gemm.micro_kernel import GemmShape
from kiln.kernels.gemm.schedule import prefetches_panels, rows_first
from kiln.ops.gemm import pack_b, unpack_b
from kiln.script import from_source, print_module
from kiln.target import Target
from kiln.target.isa import isa_for
from kiln.transform import get_pass
from support.graphs import GraphBuilder
from support.processes import outputs_in_fresh_process
from support.reference import ort_session

ort = pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(12)
TOL = 1e-5

# a: A's shape; b: B's shape (w: a constant weight, else an input); node: MatMul or Gemm
# (with its attributes); tail: the elementwise ops after it
CASES: list[dict[str, Any]] = [
    # Gemm transB, alpha, beta * bias, ReLU: 7 rows (a full tile of 6 and 1), 19 columns
    dict(a=(7, 5), b=(19, 5), w=True, node="Gemm", attrs=dict(transB=1, alpha=0.5, beta=2.0),
         bias=True, tail=("Relu",)),
    # a matrix-vector product (M = 1), 10 columns (less than one panel), odd K
    dict(a=(1, 33), b=(33, 10), w=True),
    # K = 1, 13 rows (two full tiles of 6 and one row)
    dict(a=(13, 1), b=(1, 3), w=True, tail=("Clip",)),
    # a 1-wide output
    dict(a=(5, 8), b=(8, 1), w=True),
    # leading dims flattened into rows (2 x 3 = 6), a residual add and a sigmoid
    dict(a=(2, 3, 17), b=(17, 40), w=True, tail=("Add", "Sigmoid")),
    # GEMV at a width of several panels with a remainder, Gemm bias + ReLU (an MLP layer)
    dict(a=(1, 64), b=(64, 200), w=True, node="Gemm", bias=True, tail=("Relu",)),
    # large enough to run in parallel: 9 row tiles x 5 panels, K not a multiple of 8
    dict(a=(50, 301), b=(301, 70), w=True, node="Gemm", bias=True),
    # two activations, batch dims broadcast (A [2, 1], B [3]), packed at run time
    dict(a=(2, 1, 7, 8), b=(3, 8, 9), tail=("Clip",)),
    # Gemm transB on an activation B (read transposed while packing)
    dict(a=(6, 12), b=(20, 12), node="Gemm", attrs=dict(transB=1)),
    # attention-like: [1, 4] heads, 65 x 16 @ 16 x 65 (270k multiply-adds: past 5 us on
    # every target, kiln.kernels.parallel_work), in parallel, a residual add
    dict(a=(1, 4, 65, 16), b=(1, 4, 16, 65), tail=("Add",)),
    # a constant B with batch dims (packed at run time like an activation)
    dict(a=(2, 5, 6), b=(2, 6, 4), w=True),
    # bias + GELU with Erf (x read twice: the tail is a DAG; erf is a library call, so
    # the epilogue runs as a second pass over the tile)
    dict(a=(9, 24), b=(24, 20), w=True, node="Gemm", bias=True, tail=("Gelu",)),
    # B's panels (100 x 1008 floats, 403 KB) past 3/4 of a 512 KB L2: panel by panel (the
    # cases above run row tile by row tile, schedule.rows_first), a partial last panel
    dict(a=(13, 100), b=(100, 1000), w=True, tail=("Relu",)),
    # GPT-2's scores: Q @ K^T scaled, then Where(causal mask, s, min); the bool mask is
    # read by the epilogue (the product stays on the kernel)
    dict(a=(1, 2, 9, 8), b=(1, 2, 8, 11), tail=("Div", "Where")),
]


def _out_shape(case: dict[str, Any]) -> list[int]:
    a, b = case["a"], case["b"]
    if case.get("attrs", {}).get("transB"):
        b = (*b[:-2], b[-1], b[-2])
    batch = np.broadcast_shapes(a[:-2], b[:-2])
    return [*batch, a[-2], b[-1]]


def build_model() -> onnx.ModelProto:
    nodes, inputs, outputs, inits = [], [], [], []
    for i, case in enumerate(CASES):
        inputs.append(helper.make_tensor_value_info(f"a{i}", TensorProto.FLOAT, list(case["a"])))
        if case.get("w"):
            w = RNG.standard_normal(case["b"]) / np.sqrt(case["b"][-2])
            inits.append(numpy_helper.from_array(w.astype(np.float32), f"b{i}"))
        else:
            inputs.append(helper.make_tensor_value_info(f"b{i}", TensorProto.FLOAT,
                                                        list(case["b"])))
        oshape = _out_shape(case)
        args = [f"a{i}", f"b{i}"]
        if case.get("bias"):
            inits.append(numpy_helper.from_array(
                RNG.standard_normal(oshape[-1]).astype(np.float32), f"c{i}"))
            args.append(f"c{i}")
        nodes.append(helper.make_node(case.get("node", "MatMul"), args, [f"p{i}"],
                                      **case.get("attrs", {})))
        last = f"p{i}"
        for j, op in enumerate(case.get("tail", ())):
            out = f"t{i}_{j}"
            if op == "Clip":
                inits += [numpy_helper.from_array(np.array(-0.5, np.float32), f"lo{i}"),
                          numpy_helper.from_array(np.array(0.5, np.float32), f"hi{i}")]
                nodes.append(helper.make_node("Clip", [last, f"lo{i}", f"hi{i}"], [out]))
            elif op == "Gelu":
                inits += [numpy_helper.from_array(np.array(v, np.float32), f"{c}{i}")
                          for c, v in (("sq", np.sqrt(2)), ("one", 1.0), ("half", 0.5))]
                erf = helper.make_node("Erf", [f"d{i}"], [f"e{i}"])
                nodes += [helper.make_node("Div", [last, f"sq{i}"], [f"d{i}"]), erf,
                          helper.make_node("Add", [f"e{i}", f"one{i}"], [f"s{i}"]),
                          helper.make_node("Mul", [last, f"s{i}"], [f"g{i}"]),
                          helper.make_node("Mul", [f"g{i}", f"half{i}"], [out])]
            elif op == "Div":
                inits.append(numpy_helper.from_array(np.array(8.0, np.float32), f"dv{i}"))
                nodes.append(helper.make_node("Div", [last, f"dv{i}"], [out]))
            elif op == "Where":
                causal = np.tril(np.ones(oshape[-2:], bool))[None, None]
                inits += [numpy_helper.from_array(causal, f"mask{i}"),
                          numpy_helper.from_array(np.array(-1e30, np.float32), f"neg{i}")]
                nodes.append(helper.make_node("Where", [f"mask{i}", last, f"neg{i}"], [out]))
            elif op == "Add":
                inputs.append(helper.make_tensor_value_info(f"r{i}", TensorProto.FLOAT, oshape))
                nodes.append(helper.make_node("Add", [last, f"r{i}"], [out]))
            else:
                nodes.append(helper.make_node(op, [last], [out]))
            last = out
        outputs.append(helper.make_tensor_value_info(last, TensorProto.FLOAT, oshape))
    return kernel_checks.branches_model("gemms", nodes, inputs, outputs, inits)


CHECKS = kernel_checks.KernelCases(build_model(), CASES, TOL, RNG)
MODEL, FEEDS, assert_close = CHECKS.model, CHECKS.feeds, CHECKS.assert_close
native, reference = CHECKS.native_fixture(), CHECKS.reference_fixture()


def test_every_product_uses_the_gemm_kernel(native: kiln.driver.Executable) -> None:
    kinds = [f.attrs.get("kiln.gemm_kernel") for f in native.ir.functions.values()
             if not f.attrs.get("kiln.graph")]
    used = [k for k in kinds if k is not None]
    assert len(used) == len(CASES)
    assert used.count("matmul_tiled") == 5  # the activations' and the batched constant B
    # the spelled-out GELU is recognized as `gelu` (recognize-composites)
    gelu = [n for n in native.ir.functions if "gelu" in n or "erf" in n]
    assert gelu and all(native.ir[n].attrs.get("kiln.gemm_kernel") for n in gelu)


def test_matches_onnxruntime(native: kiln.driver.Executable,
                             reference: list[np.ndarray]) -> None:
    assert_close(list(native(*FEEDS.values())), reference)


def test_compiled_kernels_round_trip_through_the_dsl(native: kiln.driver.Executable) -> None:
    text = print_module(native.ir, metadata="reference")
    assert_structural_equal(from_source(text, metadata=text.metadata), native.ir)


@pytest.mark.parametrize("threads", [1, 2])
def test_threads_in_a_fresh_process(native: kiln.driver.Executable, tmp_path: Path,
                                    threads: int, reference: list[np.ndarray]) -> None:
    assert_close(outputs_in_fresh_process(native, FEEDS, tmp_path, threads),
                 reference)


def test_the_interpreter_runs_the_kernels(reference: list[np.ndarray]) -> None:
    # the python target evaluates the same kernel IR in the reference interpreter, over
    # the model cut to the small cases' branches (the large ones would keep the
    # interpreter busy for seconds)
    small = [k for k, c in enumerate(CASES) if np.prod(_out_shape(c)) * c["a"][-1] < 5000]
    names = [i.name for i in MODEL.graph.input]
    cut = onnx.utils.Extractor(MODEL).extract_model(
        names, [MODEL.graph.output[k].name for k in small])
    kept = [i.name for i in cut.graph.input]
    ex = kiln.compile(from_onnx(cut), "python")
    got = list(ex(*(FEEDS[n] for n in kept)))
    assert len(small) >= 5
    assert_close(got, [reference[k] for k in small])


def test_the_rewrite_is_visible_in_the_graph_and_round_trips() -> None:
    mod = get_pass("block-matmuls")(from_onnx(MODEL))
    ops = [b.value.op for b in mod["main"].bindings if isinstance(b.value, g.Call)
           and b.value.op.startswith("matmul")]
    assert ops == ["matmul_packed"] * 7 + ["matmul_tiled"] * 4 + ["matmul_packed"] * 2 + [
        "matmul_tiled"]
    text = print_module(mod)
    assert "matmul_packed" in text and "matmul(" not in text
    assert_structural_equal(from_source(text), mod)


def test_packed_b_round_trip() -> None:
    b = RNG.standard_normal((5, 19)).astype(np.float32)
    packed = pack_b(b, 8)
    assert packed.shape == (3, 5, 8)
    assert np.all(packed[2, :, 3:] == 0)
    np.testing.assert_array_equal(packed[1, 4, 2], b[4, 10])
    np.testing.assert_array_equal(unpack_b(packed, 19), b)


@pytest.mark.parametrize(("spec", "m", "tile"), [
    ("llvm -mcpu=znver3", 128, (6, 16)), ("llvm -mcpu=znver5", 128, (8, 32)),
    ("llvm -mtriple=aarch64-linux-gnu -mattr=+neon", 128, (8, 8)), ("llvm", 128, (6, 8)),
    ("llvm -mcpu=znver3", 1, (1, 64)), ("llvm -mcpu=znver3", 2, (2, 32)),
    ("llvm -mcpu=znver3", 5, (5, 16)), ("c", 3, (3, 12)),
])
def test_tile_follows_the_target(spec: str, m: int, tile: tuple[int, int]) -> None:
    t = choose_tile(m, 1000, isa_for(Target(spec)))
    assert (t.mr, t.nr) == tile


@pytest.mark.parametrize(("batch", "m", "k", "n", "l2_kib", "by_rows"), [
    ((8,), 1500, 64, 1500, 512, True),    # Whisper's Q @ K^T: K^T's panels 384 KB
    ((8,), 1500, 1500, 64, 512, True),    # P @ V: V's panels 384 KB, P re-read per panel
    ((), 128, 768, 3072, 512, False),     # BERT's dense layers: 9.4 MB of weights
    ((), 13, 100, 1000, 512, False),      # 403 KB: past 3/4 of a 512 KB L2 ...
    ((), 13, 100, 1000, 1024, True),      # ... within 3/4 of 1 MB (Zen 5)
    ((8,), 1500, 64, 1500, 0, False),     # no L2 known (generic targets)
])
def test_tiles_run_row_by_row_when_b_fits_l2(batch: tuple[int, ...], m: int, k: int, n: int,
                                              l2_kib: int, by_rows: bool) -> None:
    shape = GemmShape(batch, batch, (m,), n, k)
    assert rows_first(shape, GemmTiling(6, 16), l2_kib * 1024) is by_rows


def test_narrow_products_are_not_padded_to_a_wide_tile() -> None:
    znver3 = isa_for(Target("llvm -mcpu=znver3"))
    assert choose_tile(1, 10, znver3).nr == 16
    assert choose_tile(1, 3, znver3).nr == 8


@pytest.mark.parametrize(("spec", "lanes"), [
    ("llvm -mtriple=aarch64-linux-gnu -mattr=+neon", 4), ("llvm -mcpu=znver5", 16)])
def test_other_targets_compile_with_their_panels(spec: str, lanes: int) -> None:
    # NEON (8 x 8 tiles) and AVX-512 (8 x 32): compiled to an object, not run here
    with Target(spec):
        mod = get_pass("block-matmuls")(from_onnx(MODEL))
    panels = [b.value.args[1].type.shape for b in mod["main"].bindings
              if isinstance(b.value, g.Call) and b.value.op == "matmul_packed"]
    assert panels and all(shape[-1] % lanes == 0 for shape in panels)
    assert max(shape[-1] for shape in panels) >= 2 * lanes
    ex = kiln.compile(from_onnx(MODEL), Target(spec))
    assert any(".o" in str(a) for a in ex.artifacts)


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_float32_erf_is_arithmetic_within_5e7(target: str) -> None:
    # GELU's erf in the epilogues above: a rational approximation that vectorizes
    from kiln.ir import IRBuilder
    from kiln.ir.tensor import Intrin
    from kiln.ir.visitor import iter_nodes

    x = np.concatenate([np.linspace(-6, 6, 4001), [0.0, -0.0, 1e-30, -3e-8, 3.9, 4.1, 50,
                                                   np.inf, -np.inf, np.nan]]).astype(np.float32)
    ib = IRBuilder()
    with ib.function("main"):
        ib.ret(ib.emit(kiln.ops.call("erf", ib.param("x", x.shape, "float32")), "e"))
    ex = kiln.compile(ib.get(), Target.from_host() if target == "llvm" else Target(target))
    assert not any(isinstance(n, Intrin) and n.name == "erf" for f in ex.ir.functions.values()
                   if hasattr(f, "body") for n in iter_nodes(f.body))
    got = np.asarray(ex(x)).astype(np.float64)
    want = np.array([math.erf(float(v)) if not np.isnan(v) else np.nan for v in x])
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    assert np.abs(got[ok] - want[ok]).max() < 5e-7
    tiny = ok & (np.abs(x) < 1e-3) & (x != 0)
    assert np.all(np.abs(got[tiny] / want[tiny] - 1) < 1e-6)  # relative near zero


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_products_of_one_weight_share_one_packed_copy(target: str) -> None:
    """Packing is per call: two products by one weight (as an unrolled recurrent op's
    steps read its R) read one packed copy, which the library holds once."""
    b = GraphBuilder()
    b.consts({"w": RNG.standard_normal((40, 40)).astype(np.float32) / 6})
    b.input("x", [1, 40])
    b.node("MatMul", ["x", "w"], ["h"])
    b.node("Tanh", ["h"], ["t"])
    b.node("MatMul", ["t", "w"], ["y"])
    b.output("y", [1, 40])
    model = b.model()
    packed = [c.value.args[1] for c in get_pass("block-matmuls")(from_onnx(model))["main"]
              .bindings if isinstance(c.value, g.Call) and c.value.op == "matmul_packed"]
    assert len(packed) == 2 and packed[0] is packed[1]
    ex = kiln.compile(from_onnx(model), target)
    blob = next(a for a in ex.artifacts if a.file_name == "constants.bin")
    assert len(blob.content) < 2 * packed[0].data.nbytes
    x = RNG.standard_normal((1, 40)).astype(np.float32)
    want = ort_session(model).run(None, {"x": x})[0]
    np.testing.assert_allclose(ex["main"](x), want, rtol=TOL, atol=TOL)


def test_weights_that_differ_in_one_value_keep_their_own_packed_copies() -> None:
    """Sharing compares whole values: a weight equal to another but in one element is
    packed on its own, and each product reads its own."""
    w = RNG.standard_normal((40, 40)).astype(np.float32) / 6
    w2 = w.copy()
    w2[17, 23] += 1.0
    b = GraphBuilder()
    b.consts({"w": w, "w2": w2})
    b.input("x", [1, 40])
    b.node("MatMul", ["x", "w"], ["h"])
    b.node("MatMul", ["h", "w2"], ["y"])
    b.output("y", [1, 40])
    model = b.model()
    packed = [c.value.args[1] for c in get_pass("block-matmuls")(from_onnx(model))["main"]
              .bindings if isinstance(c.value, g.Call) and c.value.op == "matmul_packed"]
    assert len(packed) == 2 and packed[0] is not packed[1]
    assert np.count_nonzero(packed[0].data != packed[1].data) == 1
    x = RNG.standard_normal((1, 40)).astype(np.float32)
    want = ort_session(model).run(None, {"x": x})[0]
    np.testing.assert_allclose(kiln.compile(from_onnx(model), "llvm")["main"](x), want,
                               rtol=TOL, atol=TOL)


def test_next_panel_prefetches_keep_results_and_stay_in_bounds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # a prompt's product over symbolic rows with every packed B prefetched a panel ahead
    # (the rule takes only B past the L2, so panel by panel): the full row tiles
    # prefetch, the rows left (one row, as a decode step's) do not; the values match
    # numpy in the reference interpreter, which reads each prefetched element (an
    # address past the last panel fails there; llvm's and C's prefetch:
    # tests/codegen/test_prefetch_intrinsic.py)
    from kiln.kernels.gemm import families

    monkeypatch.setattr(families, "prefetches_panels", lambda *args: True)
    monkeypatch.setattr(families, "rows_first", lambda *args: False)
    w = RNG.standard_normal((24, 40)).astype(np.float32) / 5
    b = GraphBuilder()
    b.consts({"w": w})
    b.input("x", [1, "seq", 24])
    b.node("MatMul", ["x", "w"], ["y"])
    b.output("y", [1, "seq", 40])
    ex = kiln.compile(from_onnx(b.model()), "python")
    (kernel,) = [f for f in ex.ir.functions.values()
                 if f.attrs.get("kiln.gemm_kernel") == "matmul_packed"]
    assert "T.prefetch(" in print_func(kernel)
    for rows in (1, 9):  # a row; a full tile of 6 or 8 and the rows left
        x = RNG.standard_normal((1, rows, 24)).astype(np.float32)
        out = np.zeros((1, rows, 40), np.float32)
        evaluate(ex.ir, "main", x, out, rows)  # lowered: the output, then the dim scalar
        np.testing.assert_allclose(out, x @ w, rtol=TOL, atol=TOL)


def test_next_panel_prefetch_rule() -> None:
    nr, zen4 = 32, isa_for(Target("llvm -mcpu=znver4"))
    for k, n, prefetched in ((2048, 2048, True),   # a 1.1B Llama's projection: 16 MB
                             (1024, 256, True),    # 1 MB: the L2
                             (100, 1000, False)):  # 400 KB: it stays in cache
        assert prefetches_panels(k, -(-n // nr), nr, zen4) == prefetched, (k, n)
    # a microcontroller has no L2 (nor a cache to fill)
    m4 = isa_for(Target("c -mtriple=thumbv7em-none-eabihf -mcpu=cortex-m4"))
    assert not prefetches_panels(2048, 64, nr, m4)
