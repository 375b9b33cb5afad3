"""Winograd convolution (kiln.ops.winograd, kiln.kernels.conv.winograd): the
transforms compute a 3x3 correlation, the weight transform round-trips, and a
one-Conv ONNX model tuned to the Winograd family (kiln.tuning.apply.Forced) computes
onnxruntime's result with the fused bias, residual add and ReLU: F(2x2), F(4x4) and F(6x6),
pads 0 and 1, odd and partial-tile sizes, channel counts no multiple of a vector, on
this host, its AVX2 path and the C backend, on 1 and 2 threads. The rule takes it by
default (not with the target's `winograd` false), keeps it inside NCHW{b}c regions
(`conv2d_winograd_nchwc`), and its aarch64 build matches under qemu. A large enough
image runs in bands of tile rows (NCHW and NCHW{b}c), the last band shorter.

Winograd's sums are rounded differently from a direct convolution's (the transforms
scale terms up to 8x and cancel them): the bound asserted is 2e-5 of the output's
largest magnitude for F(4x4) and 5e-6 for F(2x2) (measured on ResNet-50's shapes:
docs/tuning.md), inside kiln.distributed.tune's check (ATOL = 1e-5 x max|out|
plus RTOL = 1e-4 of each value).
"""

from __future__ import annotations

import re
import subprocess
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest

import kiln
from kiln.distributed.tune import discover
from kiln.ir.tensor import For
from kiln.ir.visitor import iter_stmts
from kiln.kernels.conv.winograd import (
    MIN_PARALLEL_IMAGES,
    bf16_takes_winograd,
    rule_tile_size,
    weight_transform,
)
from kiln.kernels.tiles import tile_lanes
from kiln.ops.conv_geometry import conv_shape
from kiln.ops.winograd import matrices, weight_untransform
from kiln.target.isa import isa_for
from kiln.tuning.apply import Forced, using
from support.graphs import GraphBuilder, value_info
from support.reference import onnxruntime_outputs
from support.targets import native_target
from support.toolchains import needs

#: Largest error against onnxruntime, relative to the output's largest magnitude.
BOUND = {2: 5e-6, 4: 2e-5, 6: 4e-5}


@pytest.mark.parametrize("m", [2, 4, 6])
def test_transforms_compute_a_3x3_correlation(m: int) -> None:
    """`A^T [(G g G^T) * (B^T d B)] A` is the correlation of `d` with `g` (float64)."""
    bt, gm, at = matrices(m)
    rng = np.random.default_rng(m)
    d, g = rng.standard_normal((m + 2, m + 2)), rng.standard_normal((3, 3))
    y = at @ ((gm @ g @ gm.T) * (bt @ d @ bt.T)) @ at.T
    direct = np.array([[(d[i:i + 3, j:j + 3] * g).sum() for j in range(m)]
                       for i in range(m)])
    np.testing.assert_allclose(y, direct, rtol=1e-12, atol=1e-12)
    w = rng.standard_normal((5, 3, 3, 3)).astype(np.float32)
    u = weight_transform(w, m)
    assert u.shape == ((m + 2) ** 2, 5, 3) and u.dtype == np.float32
    np.testing.assert_allclose(weight_untransform(u), w, rtol=1e-5, atol=1e-6)


def _model(c: int, co: int, h: int, w: int, pad: int) -> tuple[onnx.ModelProto, tuple[int, ...]]:
    """Conv 3x3 (bias) + residual Add + Relu."""
    b = GraphBuilder(7)
    y = b.op("Conv", "x", b.weight(co, c, 3, 3),
             b.const(b.rng.normal(0, 0.1, co).astype(np.float32), "b"),
             kernel_shape=[3, 3], pads=[pad] * 4)
    y = b.op("Relu", b.op("Add", y, "r"))
    out = (1, co, h + 2 * pad - 2, w + 2 * pad - 2)
    return b.model([value_info("x", [1, c, h, w]), value_info("r", list(out))],
                   [value_info(y, list(out))], 17, "wino"), out


# (target, m, channels in, out, height, width, pads, threads): every edge case once
CASES = [
    ("llvm", 4, 20, 24, 14, 14, 1, 2),     # 14 = 3 x 4 + 2: partial tiles, 2 threads
    ("llvm", 2, 16, 33, 7, 7, 1, 2),       # F(2x2), 7 = 3 x 2 + 1
    ("llvm-avx2", 6, 17, 9, 9, 11, 0, 1),  # F(6x6), 8-lane panels; unpadded, odd sizes
    ("c", 2, 5, 7, 8, 9, 0, 1),            # the C backend
]


@pytest.mark.parametrize("kind,m,c,co,h,w,pad,threads", CASES)
def test_winograd_computes_onnxruntimes_conv(kind: str, m: int, c: int, co: int, h: int,
                                             w: int, pad: int, threads: int) -> None:
    target = native_target(kind)
    model, out = _model(c, co, h, w, pad)
    (spec,) = discover(model, target)
    offered = [p for p in spec.candidates if p.get("family") == "conv_winograd"]
    # both tile sizes, F(4x4) first (not where its tiles fill under half a vector: 7x7
    # on AVX-512), before every other variant (tuning tries them first)
    f4_tiles = -(-(h + 2 * pad - 2) // 4) * -(-(w + 2 * pad - 2) // 4)
    sizes = [4, 2] if f4_tiles >= tile_lanes(isa_for(target)) // 2 else [2]
    assert [p["tile"][0] for p in offered] == sizes
    assert list(spec.candidates[:len(offered)]) == offered
    # F(6x6) is the rule's on wide layers only (test_the_rule_takes_wide_tiles_on_wide_layers)
    params = next((p for p in offered if p["tile"][0] == m),
                  {**offered[0], "tile": [m, *offered[0]["tile"][1:]]})
    with using(Forced(spec.family, params)) as session:
        ex = kiln.compile(model, target)
    assert session is not None and session.seen == 1
    assert "conv2d_winograd" in ex.ir.script()
    rng = np.random.default_rng(c)
    x = rng.standard_normal((1, c, h, w)).astype(np.float32)
    r = rng.standard_normal(out).astype(np.float32)
    lib = ex.jit()
    lib.set_num_threads(threads)
    try:
        got = np.asarray(lib["main"](x, r))
    finally:
        lib.set_num_threads(None)
    (ref,) = onnxruntime_outputs(model, {"x": x, "r": r})
    err = np.abs(got - ref).max() / np.abs(ref).max()
    assert err < BOUND[m], err


def test_tensor_expression_fallback_recovers_the_weight() -> None:
    """The op's tensor-expression definition (taken when the kernel cannot be built) is
    the convolution on the weight recovered from `u`, run by the IR interpreter."""
    from kiln.ir import IRModule, evaluate
    from kiln.ir import graph as g
    from kiln.ir.types import TensorType
    from kiln.ops import call, get_op
    from kiln.ops.nn import conv_ref
    from kiln.ops.registry import OpDef

    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 2, 5, 4)).astype(np.float32)
    w = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
    u = weight_transform(w, 4)
    args = [g.Var(f"x{k}", TensorType(a.shape, "float32")) for k, a in enumerate((x, u))]
    expr = call("conv2d_winograd", *args, pads=(1, 0, 0, 1))
    func, _ = OpDef.legalize(get_op("conv2d_winograd"), expr)
    got = np.zeros((1, 3, 4, 3), np.float32)
    evaluate(IRModule({"kernel": func}), "kernel", x, u, got)
    np.testing.assert_allclose(got, conv_ref(x, w, pads=(1, 0, 0, 1)), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("u_shape,attrs,message", [
    ((10, 3, 2), {}, "is not (m+2)^2"),
    ((36, 3, 2), {"strides": (2, 2)}, "stride and dilation 1"),
    ((36, 3, 2), {"tile": (2, 8, 16)}, "does not match the weight's tile size 4"),
])
def test_bad_calls_raise_clear_errors(u_shape: tuple[int, ...], attrs: dict[str, object],
                                      message: str) -> None:
    from kiln.errors import IRError
    from kiln.ir import graph as g
    from kiln.ir.types import TensorType
    from kiln.ops import call

    x = g.Var("x", TensorType((1, 2, 6, 6), "float32"))
    u = g.Var("u", TensorType(u_shape, "float32"))
    with pytest.raises(IRError, match=re.escape(message)):
        call("conv2d_winograd", x, u, **attrs)


def _chain(c: int, h: int) -> onnx.ModelProto:
    """Three convolutions: 3x3 stride 1 of `c` channels (Winograd's by the rule), 3x3
    stride 2 and 3x3 stride 1 of 8 channels (not: strided, too few channels)."""
    b = GraphBuilder(11)
    y = b.op("Relu", b.op("Conv", "x", b.weight(c, c, 3, 3), kernel_shape=[3, 3],
                          pads=[1] * 4))
    y = b.op("Conv", y, b.weight(8, c, 3, 3), kernel_shape=[3, 3], pads=[1] * 4,
             strides=[2, 2])
    y = b.op("Conv", y, b.weight(8, 8, 3, 3), kernel_shape=[3, 3], pads=[1] * 4)
    return b.model([value_info("x", [1, c, h, h])], [value_info(y, [1, 8, h // 2, h // 2])],
                   17, "chain")


@pytest.mark.parametrize("kind,h", [("llvm", 16), ("llvm", 8), ("c", 8)])
def test_the_rule_takes_winograd_unless_the_target_opts_out(kind: str, h: int) -> None:
    """By default (and with the target attribute `winograd` true) the rule takes
    eligible layers of 32+ channels over 8x8 outputs or more to Winograd (F(4x4) where
    its tiles fill half a vector, else F(2x2)) and leaves the others direct; with
    `winograd` false, none; both within Winograd's bound of onnxruntime's result."""
    model = _chain(64, h)
    plain = _target(kind, winograd=False)
    opted = _target(kind, winograd=True)
    default = kiln.Target("c") if kind == "c" else kiln.Target.from_host()
    m = 4 if (h // 4) ** 2 >= tile_lanes(isa_for(default)) // 2 else 2
    assert opted.attrs["winograd"] is True and plain.attrs["winograd"] is False
    sites = discover(model, opted)
    assert [s.family for s in discover(model, default)] == [s.family for s in sites]
    # the rule's family and tile per distinct convolution, as tuning records them
    rule = [(s.family, s.default["tile"][0] if s.family == "conv_winograd" else None)
            for s in sites]
    assert rule[0] == ("conv_winograd", m) and len(rule) == 3, rule
    assert all(f != "conv_winograd" for f, _m in rule[1:]), rule
    assert all(s.family != "conv_winograd" for s in discover(model, plain))
    tuned, untuned = kiln.compile(model, opted), kiln.compile(model, plain)
    assert "conv2d_winograd" in tuned.ir.script()
    assert "conv2d_winograd" not in untuned.ir.script()
    x = np.random.default_rng(h).standard_normal((1, 64, h, h)).astype(np.float32)
    (ref,) = onnxruntime_outputs(model, {"x": x})
    scale = np.abs(ref).max()
    got = np.asarray(tuned.jit()["main"](x))
    assert np.abs(got - ref).max() / scale < BOUND[m]
    np.testing.assert_allclose(untuned.jit()["main"](x), ref, rtol=1e-4, atol=1e-5 * scale)


@pytest.mark.parametrize("c,hw,m", [
    (512, 28, 6), (512, 56, 6), (256, 56, 4), (512, 14, 4), (512, 16, 4), (512, 7, 2)])
def test_the_rule_takes_wide_tiles_on_wide_layers(c: int, hw: int, m: int) -> None:
    """F(6x6) on layers of 512 channels where its tiles cover the image with fewer
    products (28x28: 5 x 5 tiles of 64 positions, against F(4x4)'s 7 x 7 of 36), not at
    14x14 (as many) nor on narrower layers; F(4x4) where its tiles fill half a vector."""
    shape = conv_shape((1, c, hw, hw), c, (3, 3), {"pads": (1, 1, 1, 1)})
    assert rule_tile_size(shape, isa_for(kiln.Target("llvm -mcpu=znver5"))) == m


@pytest.mark.parametrize("c", [16, 32, 40, 48])
def test_the_rule_takes_32_channels_of_whole_vector_blocks(c: int) -> None:
    """The rule's floor is 32 channels, and the channels must be whole blocks of the
    target's vector (16 float32 lanes on AVX-512, 8 on AVX2): 40 channels run Winograd
    on AVX2 only, where the layer keeps its NCHW8c region."""
    model = _chain(c, 16)
    for cpu, block in (("znver4", 16), ("znver4 -mattr=-avx512f", 8)):
        target = kiln.Target(f"llvm -mtriple=x86_64-linux-gnu -mcpu={cpu}")
        first = discover(model, target)[0].family
        assert (first == "conv_winograd") == (c >= 32 and c % block == 0), (cpu, first)


@pytest.mark.parametrize("c_in,c_out,hw,taken", [
    (128, 32, 56, False), (64, 64, 56, True), (64, 192, 28, False), (256, 256, 14, False),
    (256, 512, 28, False), (512, 512, 14, True)])
def test_a_bf16_target_takes_winograd_on_large_images_and_wide_layers(
        c_in: int, c_out: int, hw: int, taken: bool) -> None:
    """On a `precision=bf16` AVX-512 target the rule takes a 3x3 layer to float32
    Winograd from the profile's `bf16_winograd_min_outputs` output channels (64) on, and
    only on images of `bf16_winograd_min_positions` (56x56) or layers of
    `bf16_winograd_wide_channels` (512) channels each way: DenseNet's 128 -> 32,
    GoogLeNet's 64 -> 192 at 28x28 and ResNet's 256 at 14x14 run on the bfloat16
    direct kernel, ResNet's 64 at 56x56 and VGG's 512 at 14x14 on Winograd."""
    base = "llvm -mtriple=x86_64-linux-gnu -mcpu=znver5"
    isa = isa_for(kiln.Target(f"{base} -precision=bf16"))
    assert (isa.profile.bf16_winograd_min_outputs, isa.profile.bf16_winograd_min_positions,
            isa.profile.bf16_winograd_wide_channels) == (64, 56 * 56, 512)
    shape = conv_shape((1, c_in, hw, hw), c_out, (3, 3), {"pads": (1, 1, 1, 1)})
    assert bf16_takes_winograd(shape, isa) == taken


@pytest.mark.parametrize("c", [32, 64])
def test_a_bf16_target_keeps_narrow_outputs_direct(c: int) -> None:
    """The rule as `discover` sees it on a chain at 64x64: a 3x3 layer of 64 channels
    on Winograd on a `precision=bf16` target, one of 32 on the bfloat16 direct kernel; a
    float32 target takes both."""
    model = _chain(c, 64)
    base = "llvm -mtriple=x86_64-linux-gnu -mcpu=znver5"
    bf16 = kiln.Target(f"{base} -precision=bf16")
    assert (discover(model, bf16)[0].family == "conv_winograd") == (c >= 64)
    assert discover(model, kiln.Target(base))[0].family == "conv_winograd"


@pytest.mark.parametrize("asked,taken", [(None, False), (True, True), (False, False)])
def test_bare_metal_targets_keep_direct_convolutions_unless_asked(
        asked: bool | None, taken: bool) -> None:
    """A firmware target (a triple without an OS) keeps 4x the weights out of its flash
    and the transforms' workspace out of its RAM: the rule takes Winograd there only
    when the target's `winograd` is true."""
    target = kiln.Target("c -mtriple=thumbv7em-none-eabihf -mcpu=cortex-m4")
    if asked is not None:
        target = target.with_attrs(winograd=asked)
    assert (discover(_chain(64, 16), target)[0].family == "conv_winograd") == taken


def _target(kind: str, winograd: bool) -> kiln.Target:
    base = kiln.Target("c") if kind == "c" else kiln.Target.from_host()
    return base.with_attrs(winograd=winograd)


def _bottleneck(c: int, h: int, w: int) -> onnx.ModelProto:
    """ResNet's bottleneck at `c` channels: 1x1 + ReLU, 3x3 (bias) + ReLU, 1x1, the
    residual Add and ReLU: one blocked region of three convolutions."""
    b = GraphBuilder(13)
    y = b.op("Relu", b.op("Conv", "x", b.weight(c, c, 1, 1), kernel_shape=[1, 1]))
    y = b.op("Relu", b.op("Conv", y, b.weight(c, c, 3, 3),
                          b.const(b.rng.normal(0, 0.1, c).astype(np.float32), "b3"),
                          kernel_shape=[3, 3], pads=[1] * 4))
    y = b.op("Conv", y, b.weight(c, c, 1, 1), kernel_shape=[1, 1])
    y = b.op("Relu", b.op("Add", y, "x"))
    return b.model([value_info("x", [1, c, h, w])], [value_info(y, [1, c, h, w])], 17,
                   "bottleneck")


@pytest.mark.parametrize("kind,h,w,threads", [
    ("llvm-bf16", 14, 11, 2), ("llvm", 8, 8, 1), ("llvm-avx2", 14, 11, 1), ("c", 9, 8, 2)])
def test_winograd_stays_in_a_blocked_region(kind: str, h: int, w: int, threads: int) -> None:
    """In a blocked region the rule's Winograd layer runs on NCHW{b}c activations
    (`conv2d_winograd_nchwc`: no reorder around it), with its fused bias and ReLU, and
    computes onnxruntime's result within Winograd's bound (the `c` target, without a
    region, on the NCHW kernel), its transforms vector code; with the target's
    `winograd` false it runs direct. On a `precision=bf16` target ("llvm-bf16": the
    layer forced to F(6x6), its 3 x 2 tiles few enough) the packed weight is float16:
    the error is the bfloat16 1x1 layers' beside it, not bfloat16's on the transformed
    weight (several times larger)."""
    bound = BOUND[4]
    if kind == "llvm-bf16":
        target = kiln.Target.from_host().with_attrs(precision="bf16")
        if not isa_for(target).has("avx512bf16"):
            pytest.skip("this host has no AVX512-BF16")
    else:
        target = native_target(kind)
    model = _bottleneck(64, h, w)
    if kind == "llvm-bf16":
        spec = next(s for s in discover(model, target) if any(
            p.get("family") == "conv_winograd" for p in s.candidates))
        f4 = next(p for p in spec.candidates if p.get("family") == "conv_winograd")
        with using(Forced(spec.family, {**f4, "tile": [6, *f4["tile"][1:]]})):
            ex = kiln.compile(model, target)
        assert "float16" in ex.ir.script()
        bound = 5e-3
    else:
        ex = kiln.compile(model, target)
    kernels = [k["name"] for k in ex.metadata["graphs"]["main"]["kernels"]]
    if kind == "c":  # the generic CPU of the `c` target keeps NCHW (4 lanes)
        assert [k for k in kernels if "winograd" in k] == ["fused_conv2d_winograd_relu"]
    else:  # one reorder in (x, read by the first convolution and the Add), one out
        assert [k for k in kernels if "winograd" in k] == ["fused_conv2d_winograd_nchwc_relu"]
        assert [k.startswith("layout_transform") for k in kernels].count(True) == 2, kernels
    # both transforms are `unrolled` loops of vector code (the lanes of every statement)
    (kernel,) = [f for n, f in ex.ir.prim_funcs().items() if "winograd" in n]
    kinds = Counter(s.kind for s in iter_stmts(kernel.body) if isinstance(s, For))
    # (float16 panels: the products' lanes loop widening them is LLVM's to vectorize)
    assert kinds["unrolled"] == 4 and kinds["vectorized"] == (kind == "llvm-bf16"), kinds
    direct = kiln.compile(model, target.with_attrs(winograd=False))
    assert "winograd" not in direct.ir.script()
    x = np.random.default_rng(h).standard_normal((1, 64, h, w)).astype(np.float32)
    (ref,) = onnxruntime_outputs(model, {"x": x})
    lib = ex.jit()
    lib.set_num_threads(threads)
    try:
        got = np.asarray(lib["main"](x))
    finally:
        lib.set_num_threads(None)
    assert np.abs(got - ref).max() / np.abs(ref).max() < bound


@needs("aarch64-linux-gnu-gcc", "qemu-aarch64", why="make test installs them")
def test_winograd_built_for_aarch64_matches_under_qemu(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The rule's Winograd layer built for aarch64 (NEON), exported with the cross
    compiler and run by the plain-C deploy program under qemu-aarch64, computes
    onnxruntime's result (on this host) within Winograd's bound."""
    from kiln.runtime.native import include_dir

    monkeypatch.delenv("CC", raising=False)
    shape = (1, 64, 9, 8)
    model = _bottleneck(64, *shape[2:])
    ex = kiln.compile(model, "llvm -mtriple=aarch64-linux-gnu -mattr=+neon")
    assert "conv2d_winograd" in ex.ir.script()
    so = ex.export_library(tmp_path / "wino.so")
    exe = tmp_path / "deploy"
    deploy = Path(__file__).resolve().parents[2] / "examples" / "c_deploy" / "deploy.c"
    subprocess.run(["aarch64-linux-gnu-gcc", f"-I{include_dir()}", str(deploy), "-ldl", "-o",
                    str(exe)], check=True)
    x = np.random.default_rng(5).standard_normal(shape).astype(np.float32)
    (tmp_path / "in.bin").write_bytes(x.tobytes())
    dims = ",".join(map(str, shape))
    proc = subprocess.run(["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu", str(exe), str(so),
                           "kiln_", str(tmp_path / "in.bin"), dims, str(tmp_path / "out.bin"),
                           dims], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    got = np.frombuffer((tmp_path / "out.bin").read_bytes(), np.float32).reshape(shape)
    (ref,) = onnxruntime_outputs(model, {"x": x})
    assert np.abs(got - ref).max() / np.abs(ref).max() < BOUND[4]


def _batched_model(batch: int | str) -> onnx.ModelProto:
    """Conv 3x3 32 > 32 (bias) + residual Add + Relu over `batch` images."""
    b = GraphBuilder(8)
    y = b.op("Conv", "x", b.weight(32, 32, 3, 3),
             b.const(b.rng.normal(0, 0.1, 32).astype(np.float32), "b"),
             kernel_shape=[3, 3], pads=[1] * 4)
    y = b.op("Relu", b.op("Add", y, "r"))
    shape = [batch, 32, 10, 10]
    return b.model([value_info("x", shape), value_info("r", shape)],
                   [value_info(y, shape)], 17, "wino_batch")


@pytest.mark.parametrize("kind,batch", [("llvm", "n"), ("c", 4)])
def test_winograd_runs_the_images_of_a_batch_in_parallel(kind: str, batch: int | str) -> None:
    """From MIN_PARALLEL_IMAGES images each thread takes whole images, on workspaces of
    its own (a symbolic batch chooses at run time): onnxruntime's result either way."""
    model = _batched_model(batch)
    ex = kiln.compile(model, native_target(kind))
    assert "conv2d_winograd" in ex.ir.script()
    lib = ex.jit()
    lib.set_num_threads(2)
    rng = np.random.default_rng(9)
    try:
        for n in ([2, MIN_PARALLEL_IMAGES + 1] if batch == "n" else [batch]):
            x = rng.standard_normal((n, 32, 10, 10)).astype(np.float32)
            r = rng.standard_normal((n, 32, 10, 10)).astype(np.float32)
            got = np.asarray(lib["main"](x, r))
            (ref,) = onnxruntime_outputs(model, {"x": x, "r": r})
            assert np.abs(got - ref).max() / np.abs(ref).max() < BOUND[4]
    finally:
        lib.set_num_threads(None)


def _bands(ex: kiln.Executable) -> int:
    """The band loops of `ex`'s Winograd kernel (kiln.kernels.conv.winograd.band_rows):
    0 where it keeps the image whole."""
    (kernel,) = [f for n, f in ex.ir.prim_funcs().items() if "winograd" in n]
    return sum(1 for s in iter_stmts(kernel.body) if isinstance(s, For)
               and s.var.name == "band" and s.kind == "parallel")


# (target, batch, height, width): 32 > 32 channels, 7 tile rows in bands of 4 (the last
# band 3 rows, or 2 with a partial tile row: 27 = 6 x 4 + 3), a symbolic batch running
# its images one after the other below MIN_PARALLEL_IMAGES, each in bands
@pytest.mark.parametrize("kind,batch,h,w", [
    ("llvm-avx2", 1, 27, 30), ("c", 1, 27, 28), ("llvm", "n", 28, 26)])
def test_one_image_runs_in_bands_of_tile_rows(kind: str, batch: int | str, h: int,
                                              w: int) -> None:
    """An image whose products are parallel work is split into bands of tile rows, run
    in parallel (each thread all four steps of its band): onnxruntime's result on 1 and
    2 threads, with a last band of fewer rows."""
    b = GraphBuilder(8)
    y = b.op("Conv", "x", b.weight(32, 32, 3, 3),
             b.const(b.rng.normal(0, 0.1, 32).astype(np.float32), "b"),
             kernel_shape=[3, 3], pads=[1] * 4)
    y = b.op("Relu", b.op("Add", y, "r"))
    shape = [batch, 32, h, w]
    model = b.model([value_info("x", shape), value_info("r", shape)],
                    [value_info(y, shape)], 17, "wino_bands")
    ex = kiln.compile(model, native_target(kind))
    assert _bands(ex) == 1
    lib = ex.jit()
    rng = np.random.default_rng(h)
    try:
        for n in ([1, 2, MIN_PARALLEL_IMAGES] if batch == "n" else [batch]):
            x = rng.standard_normal((n, 32, h, w)).astype(np.float32)
            r = rng.standard_normal((n, 32, h, w)).astype(np.float32)
            (ref,) = onnxruntime_outputs(model, {"x": x, "r": r})
            for threads in (1, 2):
                lib.set_num_threads(threads)
                got = np.asarray(lib["main"](x, r))
                assert np.abs(got - ref).max() / np.abs(ref).max() < BOUND[4]
    finally:
        lib.set_num_threads(None)


@pytest.mark.parametrize("kind,h,w,bands", [("llvm", 27, 56, 7), ("llvm-avx2", 28, 28, 2)])
def test_blocked_winograd_runs_an_image_in_bands(kind: str, h: int, w: int,
                                                 bands: int) -> None:
    """`conv2d_winograd_nchwc` splits an image into bands of tile rows too (7 rows in
    bands of 4, the last of 3; rows of 14 tiles in bands of one row, ROW_BAND_TILES;
    the last band's window past the image's bottom zero): onnxruntime's result on 1 and
    2 threads."""
    model = _bottleneck(64, h, w)
    ex = kiln.compile(model, native_target(kind))
    (kernel,) = [f for n, f in ex.ir.prim_funcs().items() if "winograd" in n]
    assert [s.extent.value for s in iter_stmts(kernel.body)  # type: ignore[attr-defined]
            if isinstance(s, For) and s.var.name == "band"] == [bands]
    x = np.random.default_rng(h).standard_normal((1, 64, h, w)).astype(np.float32)
    (ref,) = onnxruntime_outputs(model, {"x": x})
    lib = ex.jit()
    try:
        for threads in (1, 2):
            lib.set_num_threads(threads)
            got = np.asarray(lib["main"](x))
            assert np.abs(got - ref).max() / np.abs(ref).max() < BOUND[4]
    finally:
        lib.set_num_threads(None)
