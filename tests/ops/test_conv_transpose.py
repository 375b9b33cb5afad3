"""ConvTranspose and Col2Im against onnxruntime with NaN and infinities in their inputs.

onnxruntime computes a transposed convolution as a GEMM of the weight and the input
into columns, then col2im: each product of an input pixel and a tap is added where it
lands, or nowhere (docs/onnx.md, *Non-finite values*). An infinite weight therefore
reaches only the outputs that read it, and a product landing in the padding is
dropped. kiln's float32 ConvTranspose is that GEMM and `col2im` (both column layouts,
kiln.frontend.onnx.converters.nn._conv_transpose_as_gemm); the other float types keep the direct
`conv_transpose` loop nest, which adds nothing for a tap without an input element.
Each model here holds every geometry at once (one compile per target); the variants
put NaN or +-inf in the weights, the input or the bias.
"""

from __future__ import annotations

import re
import warnings
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import kiln
from kiln import evaluate
from kiln.frontend import from_onnx
from kiln.frontend.onnx.converters.nn import COL2IM_ROWS_BELOW
from support.graphs import GraphBuilder
from support.reference import onnxruntime_outputs

pytest.importorskip("onnxruntime")

NAN, INF = np.nan, np.inf

# name -> (x shape, w shape, attributes): strides, dilations, pads, output_padding,
# output_shape, auto_pad, groups, 1-D and 3-D. Inputs of fewer pixels than the kernel's
# taps or than COL2IM_ROWS_BELOW (k3p1, output_shape, same_upper, wide_pads and the
# last three) take the GEMM with the pixels as rows (`columns_last`), the others the
# weight as rows.
GEOMETRIES: dict[str, tuple[tuple[int, ...], tuple[int, ...], dict[str, Any]]] = {
    "k4s2p1": ((1, 4, 6, 6), (4, 3, 4, 4), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "k3p1": ((2, 3, 5, 5), (3, 2, 3, 3), {"pads": [1, 1, 1, 1]}),
    "dilated": ((1, 2, 6, 6), (2, 3, 3, 3), {"strides": [3, 2], "dilations": [2, 2],
                                             "pads": [1, 0, 2, 1]}),
    "output_padding": ((1, 2, 5, 7), (2, 3, 3, 3), {"strides": [2, 2], "pads": [1, 0, 1, 1],
                                                    "output_padding": [1, 0]}),
    "output_shape": ((1, 1, 3, 3), (1, 2, 3, 3), {"strides": [3, 2],
                                                  "output_shape": [10, 8]}),
    "same_upper": ((1, 2, 3, 3), (2, 2, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    "group": ((1, 4, 6, 6), (4, 2, 3, 3), {"group": 2, "strides": [2, 2],
                                           "pads": [1, 1, 0, 0]}),
    "depthwise": ((2, 4, 6, 6), (4, 1, 3, 3), {"group": 4, "strides": [2, 2]}),
    "wide_pads": ((1, 2, 3, 3), (2, 2, 3, 3), {"pads": [2, 2, 2, 2]}),
    "1d": ((1, 2, 40), (2, 3, 4), {"strides": [3], "pads": [2, 1]}),
    "3d": ((1, 2, 4, 4, 2), (2, 2, 3, 2, 2), {"strides": [2, 1, 2],
                                              "pads": [1, 0, 0, 1, 1, 0]}),
    "latent_1x1": ((2, 5, 1, 1), (5, 3, 4, 4), {}),
    "few_pixels": ((1, 3, 2, 2), (3, 2, 5, 5), {"strides": [3, 3], "pads": [1, 2, 2, 1]}),
    "few_pixels_group": ((1, 4, 3, 2), (4, 1, 4, 4), {"group": 2, "strides": [2, 2],
                                                      "pads": [1, 1, 1, 1]}),
}
# Col2Im: name -> (input shape, image_shape, block_shape, attributes)
COL2IM: dict[str, tuple[tuple[int, ...], list[int], list[int], dict[str, Any]]] = {
    "strided": ((2, 2 * 6, 18), [7, 6], [3, 2], {"strides": [2, 1], "pads": [1, 0, 0, 2],
                                                 "dilations": [1, 2]}),
    "overlapping": ((1, 3 * 9, 49), [7, 7], [3, 3], {"pads": [1, 1, 1, 1]}),
    "1d": ((1, 2 * 4, 6), [12], [4], {"strides": [2], "pads": [1, 1]}),
    "3d": ((1, 2 * 8, 12), [4, 5, 3], [2, 2, 2], {"strides": [2, 2, 1],
                                                 "pads": [1, 0, 0, 0, 1, 0]}),
}
TARGETS = ("llvm", "c", "interpreter")


def conv_transpose_model(elem: int = TensorProto.FLOAT, constant_weights: bool = False,
                         names: tuple[str, ...] = tuple(GEOMETRIES)
                         ) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """One model of a ConvTranspose per geometry (inputs x_, w_, b_ + its name), and
    finite feeds; with `constant_weights` the weights and biases are initializers, and
    each weight holds inf first, -inf in the middle and NaN last."""
    dtype = helper.tensor_dtype_to_np_dtype(elem)
    rng = np.random.default_rng(0)
    b = GraphBuilder()
    feeds: dict[str, np.ndarray] = {}
    for name in names:
        xs, ws, attrs = GEOMETRIES[name]
        values = {f"x_{name}": rng.uniform(-2, 2, xs),
                  f"w_{name}": rng.uniform(-1, 1, ws),
                  f"b_{name}": rng.uniform(-1, 1, ws[1] * attrs.get("group", 1))}
        if constant_weights:
            w = values[f"w_{name}"].reshape(-1)
            w[[0, w.size // 2, -1]] = [INF, -INF, NAN]
        for key, value in values.items():
            value = value.astype(dtype)
            if constant_weights and not key.startswith("x_"):
                b.const(value, name=key)
            else:
                b.input(key, value.shape, elem)
                feeds[key] = value
        b.node("ConvTranspose", list(values), [f"y_{name}"], **attrs)
        b.output(f"y_{name}", None, elem)
    return b.model(opset=17, check=False), feeds


def col2im_model() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    b = GraphBuilder()
    feeds: dict[str, np.ndarray] = {}
    for name, (shape, image, block, attrs) in COL2IM.items():
        feeds[f"x_{name}"] = rng.uniform(-2, 2, shape).astype(np.float32)
        b.input(f"x_{name}", shape)
        b.const(np.array(image, np.int64), name=f"image_{name}")
        b.const(np.array(block, np.int64), name=f"block_{name}")
        b.node("Col2Im", [f"x_{name}", f"image_{name}", f"block_{name}"], [f"y_{name}"],
               **attrs)
        b.output(f"y_{name}")
    return b.model(opset=18, check=False), feeds


def variants(feeds: dict[str, np.ndarray]) -> dict[str, dict[str, np.ndarray]]:
    """The feeds with NaN or +-inf: one value in every input (a random position, and
    the first and last element for the infinities), or NaN in the biases only."""
    out = {}
    for label, values in (("nan", [NAN]), ("inf", [INF, -INF]), ("mixed", [NAN, INF])):
        rng = np.random.default_rng(len(label))
        changed = {}
        for key, value in feeds.items():
            flat = value.copy().reshape(-1)
            picks = [int(rng.integers(flat.size))] + ([0, flat.size - 1] if label != "nan"
                                                      else [])
            for k, pick in enumerate(picks):
                flat[pick] = values[k % len(values)]
            changed[key] = flat.reshape(value.shape)
        out[label] = changed
    out["bias_nan"] = {k: np.full_like(v, NAN) if k.startswith("b_") else v
                       for k, v in feeds.items()}
    if not any(k.startswith("b_") for k in feeds):
        del out["bias_nan"]
    return out


def same(got: np.ndarray, want: np.ndarray, rtol: float = 1e-4, atol: float = 1e-5
         ) -> np.ndarray:
    """NaN-aware equality: NaN equals NaN, an infinity only itself, finite values
    within tolerance."""
    g, w = np.asarray(got, np.float64), np.asarray(want, np.float64)
    with np.errstate(invalid="ignore"):
        finite = np.isfinite(g) & np.isfinite(w)
        close = np.abs(g - w) <= atol + rtol * np.abs(w)
        return np.where(finite, close, (g == w) | (np.isnan(g) & np.isnan(w)))


def run_kiln(model: onnx.ModelProto, target: str, feeds: list[dict[str, np.ndarray]]
             ) -> list[list[np.ndarray]]:
    mod = from_onnx(model)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        if target == "interpreter":
            runs = [evaluate(mod, "main", *f.values()) for f in feeds]
        else:
            function = kiln.compile(mod, target)["main"]
            runs = [function(*f.values()) for f in feeds]
    return [[np.asarray(v) for v in (r if isinstance(r, (list, tuple)) else [r])]
            for r in runs]


def check(model: onnx.ModelProto, feeds: dict[str, np.ndarray], target: str) -> None:
    cases = {"finite": feeds, **variants(feeds)}
    names = [o.name for o in model.graph.output]
    got = run_kiln(model, target, list(cases.values()))
    problems = []
    for (label, case), outs in zip(cases.items(), got):
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            want = onnxruntime_outputs(model, case)
        for name, g, w in zip(names, outs, want):
            assert g.shape == w.shape, f"{label} {name}: {g.shape} vs {w.shape}"
            ok = same(g, w)
            if not ok.all():
                ix = tuple(int(i) for i in np.argwhere(~ok)[0])
                problems.append(f"{label} {name}: {int((~ok).sum())}/{ok.size} differ, "
                                f"e.g. {list(ix)} kiln {g[ix]} onnxruntime {w[ix]}")
        if label != "finite":  # the variants do put non-finite values in every output
            assert any(not np.isfinite(w).all() for w in want), label
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("target", TARGETS)
def test_conv_transpose_puts_nan_and_inf_where_onnxruntime_does(target: str) -> None:
    model, feeds = conv_transpose_model()
    check(model, feeds, target)


def test_conv_transpose_with_non_finite_constant_weights() -> None:
    """Initializers holding inf, -inf and NaN: folded into the GEMM's constant
    operand (packed at compile time, or transposed), they still reach only the outputs
    that read them."""
    model, feeds = conv_transpose_model(constant_weights=True)
    cases = {"finite": feeds, **variants(feeds)}
    got = run_kiln(model, "llvm", list(cases.values()))
    for (label, case), outs in zip(cases.items(), got):
        with np.errstate(all="ignore"):
            want = onnxruntime_outputs(model, case)
        for g, w in zip(outs, want):
            assert same(g, w).all(), label
        # a non-finite weight reaches the outputs that read it, not every output
        assert sum(int(np.isfinite(w).sum()) for w in want) > 0, label


@pytest.mark.parametrize("target", TARGETS)
def test_col2im_puts_nan_and_inf_where_onnxruntime_does(target: str) -> None:
    model, feeds = col2im_model()
    check(model, feeds, target)


def test_float16_keeps_the_direct_loop_nest_and_its_non_finite_values() -> None:
    """float16 is not a GEMM (kiln's takes float32): the direct `conv_transpose`, which
    accumulates in float32 and adds nothing for a tap without an input element."""
    model, feeds = conv_transpose_model(TensorProto.FLOAT16, names=("k4s2p1", "group",
                                                                    "wide_pads"))
    assert "conv_transpose2d" in from_onnx(model).script()
    cases = {"finite": feeds, **variants(feeds)}
    got = run_kiln(model, "llvm", list(cases.values()))
    for (label, case), outs in zip(cases.items(), got):
        with np.errstate(all="ignore"):
            want = onnxruntime_outputs(model, case)
        for g, w in zip(outs, want):
            assert same(g, w, rtol=2e-2, atol=2e-2).all(), label


def test_float64_direct_loop_nest_equals_its_reference() -> None:
    """float64 (onnxruntime has no double ConvTranspose): the compiled direct loop nest
    against the operators' numpy references, which place non-finite values as
    onnxruntime's algorithm would."""
    model, feeds = conv_transpose_model(TensorProto.DOUBLE)
    cases = [feeds, *variants(feeds).values()]
    for got, want in zip(run_kiln(model, "llvm", cases),
                         run_kiln(model, "interpreter", cases)):
        for g, w in zip(got, want):
            assert same(g, w, rtol=1e-9, atol=1e-12).all()


LAST = {"k3p1", "output_shape", "same_upper", "wide_pads", "latent_1x1", "few_pixels",
        "few_pixels_group"}


@pytest.mark.parametrize("name", GEOMETRIES)
def test_float32_conv_transpose_is_a_gemm_then_col2im(name: str) -> None:
    """Both column layouts are covered above (LAST: the pixels as the GEMM's rows)."""
    model, _ = conv_transpose_model(names=(name,))
    text = from_onnx(model).script()
    assert "conv_transpose" not in text
    assert re.search(r'G\.op\("matmul"', text)
    assert f"columns_last={int(name in LAST)}" in text
    xs, ws, _ = GEOMETRIES[name]
    pixels, taps = int(np.prod(xs[2:])), int(np.prod(ws[2:]))
    assert (name in LAST) == (pixels < max(taps, COL2IM_ROWS_BELOW))
