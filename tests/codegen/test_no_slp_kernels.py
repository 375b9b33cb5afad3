"""Kernels whose vectors are all explicit carry `kiln.no_slp` (the blocked and NCHWc
convolution families), lowered as LLVM's `noimplicitfloat` on the kernel, its outlined
loop bodies and their trampolines: LLVM's SLP vectorizer then leaves the register
tile's scalar input addresses alone (left on, it regrouped them into vectors of i64
whose multiplies and extracts sat on the critical path of the sums; docs/codegen-llvm.md,
"Kernels LLVM must not regroup"). The other kernels keep SLP.

The models are 3x3 convolutions of 64 channels at 56x56, the layer whose NCHW16c tile
regrouped on Zen 4, compiled for an AVX-512 CPU named by `-mcpu` (no host feature
needed): one layer alone (NCHW, `conv2d_blocked`: a region needs two) and a chain of
three (NCHW16c, `conv2d_nchwc`, with its layout transforms), on the direct kernels (the
target's `winograd` false: the rule would take these layers to Winograd). On other
architectures the attribute is not lowered (wasm32's instruction selection failed on
vector types under `noimplicitfloat`).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from llvm_helpers import compiled

import kiln
from kiln.frontend import from_onnx
from kiln.ir.attrs import ATTR_NO_SLP
from support.graphs import GraphBuilder
from support.reference import onnxruntime_outputs

TARGET = "llvm -mtriple=x86_64-linux-gnu -mcpu=znver4 -winograd=false"
CHANNELS, SIZE = 64, 56


def chain(layers: int) -> object:
    gb = GraphBuilder(seed=3)
    x = gb.input("x", [1, CHANNELS, SIZE, SIZE])
    for _ in range(layers):
        x = gb.op("Relu", gb.conv(x, CHANNELS, CHANNELS, 3))
    gb.output(x, [1, CHANNELS, SIZE, SIZE])
    return gb.model()


MODELS = {"conv2d_blocked": chain(1), "conv2d_nchwc": chain(3)}


@pytest.fixture(scope="module", params=sorted(MODELS))
def built(request: pytest.FixtureRequest) -> tuple[str, kiln.driver.Executable, str]:
    family = request.param
    ex = kiln.compile(from_onnx(MODELS[family]), TARGET)
    return family, ex, str(compiled(ex.ir, TARGET).module)


def _functions(ll: str) -> dict[str, tuple[str, str]]:
    """Each defined function's name -> (attribute text, body) of LLVM module text."""
    groups = {m.group(1): m.group(2) for m in re.finditer(
        r"^attributes (#\d+) = \{(.*)\}$", ll, re.M)}
    out = {}
    for m in re.finditer(r"^define [^@]*@\"?([\w.$]+)\"?\(.*?\)(.*?)\{\n(.*?)^\}$", ll,
                         re.M | re.S):
        attrs = " ".join(groups.get(ref, ref) for ref in re.findall(r"#\d+", m.group(2)))
        out[m.group(1)] = (attrs + m.group(2), m.group(3))
    return out


def _conv_kernel(name: str) -> bool:
    return "conv2d_blocked" in name or "conv2d_nchwc" in name


def test_conv_kernels_carry_the_attribute(built: tuple[str, kiln.driver.Executable, str]
                                          ) -> None:
    family, ex, _ = built
    kinds = {f.attrs.get("kiln.conv_kernel"): bool(f.attrs.get(ATTR_NO_SLP))
             for f in ex.ir.prim_funcs().values() if f.attrs.get("kiln.conv_kernel")}
    assert kinds == {family: True}


def test_explicit_kernels_are_noimplicitfloat_and_others_are_not(
        built: tuple[str, kiln.driver.Executable, str]) -> None:
    family, _, ll = built
    funcs = _functions(ll)
    conv = {n: a for n, (a, _) in funcs.items() if _conv_kernel(n)}
    # the kernel itself and its parallel loop's trampoline (the body is inlined there)
    assert any(n.endswith(".run") for n in conv), sorted(funcs)
    assert conv and all("noimplicitfloat" in a for a in conv.values()), conv
    others = {n: a for n, (a, _) in funcs.items() if not _conv_kernel(n)}
    if family == "conv2d_nchwc":
        assert any("layout_transform" in n for n in others), sorted(others)
    assert all("noimplicitfloat" not in a for a in others.values()), others


def test_no_index_vectors_in_the_register_tiles(
        built: tuple[str, kiln.driver.Executable, str]) -> None:
    """The tile's input addresses stay scalar: no `<N x i64>` value in a conv kernel, and
    its multiply-adds are whole 512-bit vectors (the explicit tile is intact)."""
    _, _, ll = built
    bodies = {n: body for n, (_, body) in _functions(ll).items() if _conv_kernel(n)}
    for name, body in bodies.items():
        assert not re.search(r"<\d+ x i64>", body), name
    # the loop body, inlined into its trampoline or not
    assert any(re.search(r"@llvm\.fma\.v(16|32|64)f32", b) for b in bodies.values())


def test_other_architectures_keep_slp() -> None:
    target = "llvm -mtriple=aarch64-linux-gnu -mcpu=neoverse-n1 -winograd=false"
    ex = kiln.compile(from_onnx(MODELS["conv2d_nchwc"]), target)
    assert any(f.attrs.get(ATTR_NO_SLP) for f in ex.ir.prim_funcs().values())
    assert "noimplicitfloat" not in str(compiled(ex.ir, target).module)


def test_the_built_library_matches_onnxruntime() -> None:
    x = np.random.default_rng(0).standard_normal((1, CHANNELS, SIZE, SIZE)).astype(np.float32)
    for model in MODELS.values():
        (want,) = onnxruntime_outputs(model, {"x": x})
        lib = kiln.compile(from_onnx(model), "llvm -winograd=false").jit()
        np.testing.assert_allclose(np.asarray(lib["main"](x)), want, rtol=1e-4, atol=1e-4)


def _silu_chain(channels: int, size: int) -> object:
    """Three 3x3 convolutions with a bias and a SiLU (`x * sigmoid(x)`) each, of a channel
    count no multiple of the block (EfficientNet-B0's 24- and 40-channel layers): the last
    block's real lanes go through the epilogue, its padding lanes are stored as zeros."""
    gb = GraphBuilder(seed=5)
    x = gb.input("x", [1, channels, size, size])
    for _ in range(3):
        y = gb.conv(x, channels, channels, 3)
        x = gb.op("Mul", y, gb.op("Sigmoid", y))
    gb.output(x, [1, channels, size, size])
    return gb.model()


@pytest.mark.parametrize("channels", [24, 40])
def test_every_lane_loop_of_a_partial_block_is_a_vector_loop(channels: int) -> None:
    """Under `noimplicitfloat` LLVM vectorizes nothing itself, so every lane loop of a
    `kiln.no_slp` kernel must be one kiln emits as vector code (`T.vector`): a lane loop
    left `vectorized` (the last block's stores once selected zero past the channel count
    and read the bias at a clamped channel, neither of which has a vector form) ran one
    lane at a time. The outputs match onnxruntime's."""
    from kiln.ir.tensor import For
    from kiln.ir.visitor import iter_stmts

    model = _silu_chain(channels, 9)
    ex = kiln.compile(from_onnx(model), TARGET)
    kernels = [f for f in ex.ir.prim_funcs().values() if f.attrs.get(ATTR_NO_SLP)]
    assert kernels and all(f.attrs["kiln.conv_kernel"] == "conv2d_nchwc" for f in kernels)
    scalar = [s.var.name for f in kernels for s in iter_stmts(f.body)
              if isinstance(s, For) and s.kind == "vectorized"]
    assert scalar == []
    x = np.random.default_rng(1).standard_normal((1, channels, 9, 9)).astype(np.float32)
    (want,) = onnxruntime_outputs(model, {"x": x})
    got = kiln.compile(from_onnx(model), "llvm").jit()["main"](x)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4)
