"""One or more test cases per registered operator: inputs and attributes.

`CASES` maps op name -> list of OpCase; tests/ops/test_ops.py checks that every
op registered in kiln.ops has at least one case, that type inference matches
the numpy reference, and that the lowered PrimFunc computes the reference.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

Gen = Callable[[np.random.Generator], np.ndarray]


def f32(*shape: int, low: float = -2.0, high: float = 2.0, dtype: str = "float32") -> Gen:
    return lambda rng: rng.uniform(low, high, shape).astype(dtype)


def ints(*shape: int, low: int = -20, high: int = 20, dtype: str = "int32") -> Gen:
    return lambda rng: rng.integers(low, high, shape).astype(dtype)


def nonzero_ints(*shape: int, dtype: str = "int32") -> Gen:
    def gen(rng: np.random.Generator) -> np.ndarray:
        v = rng.integers(1, 9, shape) * rng.choice([-1, 1], shape)
        return v.astype(dtype)
    return gen


def bools(*shape: int) -> Gen:
    return lambda rng: rng.integers(0, 2, shape).astype(bool)


def weight_words(*shape: int) -> Gen:
    """Random int8 weights of `shape` packed as qlinear_conv_dot's int32 words."""
    from kiln.ops.quant_words import weight_words as pack

    return lambda rng: pack(rng.integers(-128, 128, shape).astype(np.int8))


def weight_panels(nr: int, *shape: int) -> Gen:
    """Random int8 weights of `shape` packed in qlinear_conv_dot's panels of `nr` channels
    (its channels-as-lanes tile)."""
    from kiln.ops.quant_words import weight_panels as pack

    return lambda rng: pack(rng.integers(-128, 128, shape).astype(np.int8), nr)


def bf16_exact(*shape: int) -> Gen:
    """float32 values bfloat16 holds exactly (quarters in [-2, 2)): the te compute reads A
    as it is where the reference rounds it, so only such values compare bit for bit."""
    return lambda rng: (rng.integers(-8, 8, shape) / 4).astype(np.float32)


def bf16_exact_words(*shape: int) -> Gen:
    """int32 words of two `bf16_exact` values each (the input of a `words_input` bfloat16
    convolution)."""
    def gen(rng: np.random.Generator) -> np.ndarray:
        bits = bf16_exact(*shape, 2)(rng).view(np.uint32)
        return ((bits[..., 0] >> 16) | (bits[..., 1] & 0xFFFF0000)).view(np.int32)
    return gen


def bf16_panels(nr: int, k: int, n: int) -> Gen:
    """Random float32 weights [k, n] packed as matmul_packed_bf16's panels of `nr`."""
    from kiln.ops.gemm_bf16 import pack_b_bf16

    return lambda rng: pack_b_bf16(rng.uniform(-2, 2, (k, n)).astype(np.float32), nr)


def f16_panels(nr: int, k: int, n: int) -> Gen:
    """Random float32 weights [k, n] packed as matmul_packed_f16's float16 panels of `nr`."""
    from kiln.ops.gemm_f16 import pack_b_f16

    return lambda rng: pack_b_f16(rng.uniform(-2, 2, (k, n)).astype(np.float32), nr)


def bf16_conv_weight(cb: int, block: int, *oihw: int) -> Gen:
    """Random float32 OIHW weights packed as conv2d_nchwc_bf16's words (`cb` output
    channels per tile, NCHW{block}c input)."""
    from kiln.ops.conv_bf16 import pack_conv_bf16

    return lambda rng: pack_conv_bf16(rng.uniform(-2, 2, oihw).astype(np.float32), cb, block)


def bf16_row_taps_weight(cb: int, *oihw: int) -> Gen:
    """Random float32 OIHW weights packed as conv2d_nchwc_bf16's `row_taps` words (an NCHW
    first layer's neighbouring kernel columns paired)."""
    from kiln.ops.conv_bf16 import pack_row_taps

    return lambda rng: pack_row_taps(rng.uniform(-2, 2, oihw).astype(np.float32), cb)


def exp_table(x_scale: float, row: int) -> Gen:
    """qlinear_softmax's float32 exp table for `x_scale` and rows of `row`."""
    from kiln.ops.quant_softmax import softmax_table

    return lambda rng: softmax_table(x_scale, row)


def const(value: Any, dtype: str) -> Gen:
    return lambda rng: np.asarray(value, dtype=dtype)


@dataclass
class OpCase:
    inputs: tuple[Gen, ...]
    attrs: dict[str, Any] = field(default_factory=dict)
    rtol: float = 1e-5
    atol: float = 1e-6
    note: str = ""


# A grouped u8 convolution in qlinear_conv_packed's operands, which qlinear_conv_grouped
# (its vector-tile form) takes as well.
GROUPED_U8 = OpCase((ints(1, 4, 6, 6, low=0, high=256, dtype="uint8"),
                     ints(4, 2, 3, 3, low=-128, high=128, dtype="int8"),
                     ints(4, low=-50000, high=50000), const(120, "uint8"),
                     const([0.0025, 0.005, 0.00375, 0.0075], "float32"), const(100, "uint8")),
                    {"group": 2, "pads": (1, 0, 1, 2), "strides": (2, 1), "dilations": (1, 1)})
X = f32(2, 3, 4)
POS = f32(2, 3, 4, low=0.1, high=3.0)
UNIT = f32(2, 3, 4, low=-0.9, high=0.9)
IMG = f32(1, 2, 7, 6)


def _unary(gen: Gen = X, **attrs: Any) -> list[OpCase]:
    return [OpCase((gen,), attrs)]


COL = f32(3, 1)


def _binary(a: Gen = X, b: Gen = COL) -> list[OpCase]:
    return [OpCase((a, b)), OpCase((f32(4), f32(2, 3, 4)))]


CASES: dict[str, list[OpCase]] = {
    # elementwise unary
    "neg": _unary() + _unary(ints(5)), "abs": _unary() + _unary(ints(5, dtype="int8")),
    "sign": _unary() + _unary(ints(6)), "sqrt": _unary(POS), "exp": _unary(),
    "log": _unary(POS), "erf": _unary(), "floor": _unary(), "ceil": _unary(),
    "round": [OpCase((const([0.5, 1.5, 2.5, -0.5, -1.5, 1.2, -2.7], "float32"),))],
    "reciprocal": _unary(POS), "sin": _unary(), "cos": _unary(), "tan": _unary(UNIT),
    "asin": _unary(UNIT), "acos": _unary(UNIT), "atan": _unary(), "sinh": _unary(),
    "cosh": _unary(), "asinh": _unary(), "acosh": _unary(f32(5, low=1.0, high=4.0)),
    "atanh": _unary(UNIT), "tanh": _unary(), "sigmoid": _unary(),
    "relu": _unary() + _unary(ints(7)), "leaky_relu": _unary(alpha=0.2),
    "elu": _unary(alpha=0.7), "selu": _unary(), "celu": _unary(alpha=1.5),
    "hard_sigmoid": _unary(f32(10, low=-5, high=5), alpha=0.3, beta=0.4),
    "hard_swish": _unary(f32(10, low=-5, high=5)),
    "softplus": _unary(f32(6, low=-30, high=30)), "softsign": _unary(), "mish": _unary(),
    "thresholded_relu": _unary(alpha=0.5), "shrink": _unary(lambd=0.6, bias=0.2),
    "swish": _unary(alpha=1.3),
    "gelu": _unary() + _unary(approximate="tanh"),
    "bitwise_not": _unary(ints(6, dtype="int16")) + _unary(ints(6, low=0, high=200,
                                                                   dtype="uint8")),
    "isnan": _unary(const([0.0, np.nan, np.inf, -1.0], "float32")),
    "isinf": _unary(const([0.0, np.nan, np.inf, -np.inf], "float32"))
    + _unary(const([0.0, np.inf, -np.inf], "float32"), detect_negative=0),
    "copy": _unary(),
    "cast": [OpCase((X,), {"dtype": "int32"}), OpCase((f32(5),), {"dtype": "bool"}),
             OpCase((ints(5),), {"dtype": "float16"}), OpCase((X,), {"dtype": "float64"}),
             # onnxruntime's out-of-range rule (finite: the interpreter refuses NaN casts)
             OpCase((const([3e9, -1.5, 300.5, -3e9, 1e10, 0.5], "float32"),),
                    {"dtype": "uint8", "float_to_int": "x86"})],
    "clip": [OpCase((X,), {"min": -0.5, "max": 0.7}), OpCase((ints(8),), {"min": -3}),
             OpCase((X,), {"max": 0.1})],
    # elementwise binary (broadcasting)
    "add": [*_binary(), OpCase((ints(3, 2), ints(2)))], "subtract": _binary(),
    "multiply": _binary(),
    "divide": [*_binary(X, f32(3, 1, low=0.5, high=2.0)), OpCase((ints(8), nonzero_ints(8)))],
    "maximum": _binary(), "minimum": _binary(),
    "power": [OpCase((POS, f32(3, 4, low=-2, high=2))),
              OpCase((ints(6, low=-4, high=5), ints(6, low=0, high=4)))],
    "prelu": [OpCase((X, f32(3, 1, low=0.0, high=0.5)))],
    "mod": [OpCase((ints(10), nonzero_ints(10))),
            OpCase((f32(8, low=-6, high=6), f32(8, low=0.5, high=3))),
            OpCase((f32(8, low=-6, high=6), f32(8, low=-3, high=-0.5)))],
    "fmod": [OpCase((ints(10), nonzero_ints(10))),
             OpCase((f32(8, low=-6, high=6), f32(8, low=0.5, high=3)))],
    "bitwise_and": [OpCase((ints(6), ints(6)))], "bitwise_or": [OpCase((ints(6), ints(6)))],
    "bitwise_xor": [OpCase((ints(6), ints(6)))],
    "left_shift": [OpCase((ints(6, low=0, high=9, dtype="uint8"),
                           const([0, 1, 2, 7, 8, 9], "uint8")))],
    "right_shift": [OpCase((ints(6, dtype="int32"), const([0, 1, 3, 31, 32, -1], "int32")))],
    # comparisons and logic
    "equal": [OpCase((ints(3, 4, low=0, high=3), ints(4, low=0, high=3)))],
    "not_equal": [OpCase((ints(3, 4, low=0, high=3), ints(4, low=0, high=3)))],
    "less": _binary(), "less_equal": [OpCase((ints(6, low=0, high=3), ints(6, low=0,
                                                                           high=3)))],
    "greater": _binary(), "greater_equal": [OpCase((ints(6, low=0, high=3),
                                                    ints(6, low=0, high=3)))],
    "logical_and": [OpCase((bools(3, 4), bools(4)))], "logical_or": [OpCase((bools(5),
                                                                             bools(5)))],
    "logical_xor": [OpCase((bools(5), bools(5)))], "logical_not": [OpCase((bools(5),))],
    "where": [OpCase((bools(3, 1), X, f32(4)))],
    # anchors
    "cblas_matmul": [OpCase((f32(3, 4), f32(4, 5))),
                     OpCase((f32(2, 3, 4), f32(5, 4)), {"transpose_b": True})],
    "matmul": [OpCase((f32(3, 4), f32(4, 5))), OpCase((f32(2, 3, 4), f32(4,))),
               OpCase((f32(4,), f32(2, 4, 3))), OpCase((f32(2, 1, 3, 4), f32(3, 4, 2))),
               OpCase((ints(3, 4, dtype="int8", low=-5, high=5),
                       ints(4, 2, dtype="int8", low=-5, high=5)))],
    # B packed as [panels][K][nr]: 19 columns in 3 panels of 8 (the last zero-padded)
    "matmul_packed": [OpCase((f32(7, 5), f32(3, 5, 8)), {"n": 19}),
                      OpCase((f32(2, 3, 4), f32(1, 4, 16)), {"n": 16}),
                      OpCase((f32(4,), f32(2, 4, 4)), {"n": 5})],
    # K 40 zero-padded to the 64 of two pair blocks; 19 columns in 3 panels of 8
    "matmul_packed_bf16": [OpCase((bf16_exact(3, 40), bf16_panels(8, 40, 19)),
                                  {"n": 19, "k": 40}, rtol=1e-5, atol=1e-5)],
    # 19 columns in 3 float16 panels of 8 (the last zero-padded)
    "matmul_packed_f16": [OpCase((f32(3, 40), f16_panels(8, 40, 19)), {"n": 19}),
                          OpCase((f32(2, 3, 5), f16_panels(16, 5, 16)), {"n": 16})],
    # 4-bit codes in blocks of 16 along K = 40 (the last block padded), zero points or
    # the default 8; 8-bit codes in blocks of 32
    "matmul_nbits": [OpCase((f32(3, 40), ints(5, 3, 8, low=0, high=256, dtype="uint8"),
                             f32(5, 3, low=0.01, high=0.1), f32(5, 3, low=0, high=15)),
                            {"k": 40, "n": 5, "bits": 4, "block": 16}, rtol=1e-4, atol=1e-5),
                     OpCase((f32(2, 1, 33), ints(4, 2, 32, low=0, high=256, dtype="uint8"),
                             f32(4, 2, low=0.01, high=0.1)),
                            {"k": 33, "n": 4, "bits": 8, "block": 32}, rtol=1e-4, atol=1e-5)],
    # the same in panels of 8 columns (N = 5 and 12: one partial panel, one whole and one not)
    "matmul_nbits_packed": [
        OpCase((f32(3, 40), ints(1, 3, 8, 8, low=0, high=256, dtype="uint8"),
                f32(1, 3, 8, low=0.01, high=0.1), f32(1, 3, 8, low=0, high=15)),
               {"k": 40, "n": 5, "bits": 4, "block": 16}, rtol=1e-4, atol=1e-5),
        OpCase((f32(2, 33), ints(2, 2, 32, 8, low=0, high=256, dtype="uint8"),
                f32(2, 2, 8, low=0.01, high=0.1)),
               {"k": 33, "n": 12, "bits": 8, "block": 32}, rtol=1e-4, atol=1e-5)],
    # both activations: the reference rounds both, the te compute neither
    "matmul_tiled_bf16": [OpCase((bf16_exact(2, 5, 40), bf16_exact(2, 40, 9))),
                          OpCase((bf16_exact(3, 7, 4), bf16_exact(3, 6, 4)),
                                 {"transpose_b": True})],
    # one row of A; B stored [N][K] (Gemm's transB) and read in place
    "matmul_gemv": [OpCase((f32(1, 5), f32(7, 5)), {"transpose_b": True}),
                    OpCase((f32(1, 33), f32(19, 33)), {"transpose_b": True})],
    # softmax(q @ k^T * scale [+ bias]) @ v, keys [n, d] (transpose_b) or [d, n] (one
    # key/value head read by a group's 2 query heads); causal: the 5 rows the last of 7
    # positions, with a bias broadcast over the heads (and NaN probabilities as 0);
    # key_counts: the keys each row of the first batch axis attends, its scores capped
    # (softcap 1.5: scores of 4 products of normal values pass 1.5)
    "attention_tiled": [OpCase((f32(2, 5, 4), f32(2, 6, 4), f32(2, 6, 3)),
                               {"transpose_b": True, "scale": 0.5}),
                        OpCase((f32(1, 2, 3, 4), f32(1, 1, 4, 7), f32(1, 1, 7, 2))),
                        OpCase((f32(2, 5, 4), f32(2, 7, 4), f32(2, 7, 3), f32(1, 5, 7)),
                               {"transpose_b": True, "causal": True, "zero_nan": True}),
                        # each batch row's keys (clamped to [1, 9]: 0 and 12 take 1 and 9)
                        OpCase((f32(3, 2, 5, 4), f32(3, 2, 9, 4), f32(3, 2, 9, 3),
                                f32(3, 1, 5, 9), const([0, 4, 12], "int64")),
                               {"transpose_b": True, "key_counts": True, "softcap": 1.5})],
    # the reference rounds the softmax's output to bfloat16, the te compute does not
    "attention_tiled_bf16": [OpCase((bf16_exact(2, 5, 4), bf16_exact(2, 6, 4),
                                     bf16_exact(2, 6, 3)), {"transpose_b": True},
                                    rtol=1e-2, atol=1e-2)],
    "matmul_tiled": [OpCase((f32(2, 1, 7, 4), f32(3, 4, 9))),
                     OpCase((f32(2, 5, 3), f32(2, 6, 3)), {"transpose_b": True})],
    "einsum": [OpCase((f32(2, 3, 4), f32(2, 4, 5)), {"equation": "bij,bjk->bik"}),
               OpCase((f32(3, 3),), {"equation": "ii->i"}),
               OpCase((f32(3, 4),), {"equation": "ij->"}),
               OpCase((f32(2, 3), f32(2, 3)), {"equation": "ij,ij->i"}),
               OpCase((f32(2, 5, 3), f32(3, 4)), {"equation": "...j,jk->...k"}),
               OpCase((f32(3,), f32(4,)), {"equation": "i,j"})],
    "conv1d": [OpCase((f32(1, 2, 9), f32(4, 2, 3)), {"strides": (2,), "pads": (1, 2)})],
    "conv2d": [OpCase((IMG, f32(3, 2, 3, 3), f32(3)), {"pads": (1, 1, 1, 1)}),
               OpCase((f32(1, 4, 6, 6), f32(4, 1, 3, 3)),
                      {"group": 4, "strides": (2, 2), "dilations": (1, 2),
                       "pads": (0, 1, 2, 1)}),
               OpCase((f32(2, 4, 5, 5), f32(6, 2, 2, 2)), {"group": 2}),
               OpCase((ints(1, 2, 4, 4, dtype="int8", low=-4, high=4),
                       ints(2, 2, 2, 2, dtype="int8", low=-4, high=4)), {})],
    "conv2d_mlas": [OpCase((f32(1, 20, 5, 5), f32(6, 20, 3, 3), f32(6)),
                           {"pads": (1, 1, 1, 1), "threads": 2}),
                    OpCase((f32(2, 4, 6, 6), f32(6, 2, 2, 2)),
                           {"group": 2, "strides": (2, 2), "threads": 1}),
                    OpCase((f32(1, 6, 7, 7), f32(6, 1, 3, 3), f32(6)),
                           {"group": 6, "pads": (1, 1, 1, 1), "threads": 2})],
    "conv2d_blocked": [OpCase((IMG, f32(1, 1, 2, 3, 3, 8), f32(5)),
                              {"channels": 5, "pads": (1, 1, 1, 1)}),
                       OpCase((f32(1, 4, 6, 5), f32(2, 1, 2, 3, 3, 4)),
                              {"channels": 6, "group": 2, "strides": (2, 2),
                               "pads": (0, 1, 2, 1)})],
    # 6 input channels in 2 blocks of 4 (words of single lanes, `word_block`: 3 rows, not
    # 4), 5 outputs in a tile of 8
    "conv2d_nchwc_bf16": [OpCase((bf16_exact(1, 2, 4, 3, 4), bf16_conv_weight(8, 4, 5, 6, 3, 3),
                                  f32(5)), {"channels": 5, "c_in": 6, "pads": (1, 1, 1, 1)},
                                 rtol=1e-5, atol=1e-5),
                          # 9 input channels in 3 blocks (single lanes: 5 rows, not 8)
                          OpCase((bf16_exact(2, 3, 6, 5, 4), bf16_conv_weight(4, 4, 3, 9, 1, 1)),
                                 {"channels": 3, "c_in": 9, "strides": (2, 2)},
                                 rtol=1e-5, atol=1e-5),
                          # an NCHW input of 3 channels (a region's first layer) -> NCHW4c
                          OpCase((bf16_exact(1, 3, 6, 5), bf16_conv_weight(8, 1, 5, 3, 3, 3),
                                  f32(5)), {"channels": 5, "c_in": 3, "block": 4,
                                            "pads": (1, 1, 1, 1), "strides": (2, 2)},
                                 rtol=1e-5, atol=1e-5),
                          # the same with a 5x5 kernel's neighbouring columns paired
                          OpCase((bf16_exact(1, 3, 4, 5), bf16_row_taps_weight(8, 5, 3, 5, 5)),
                                 {"channels": 5, "c_in": 3, "block": 4, "row_taps": 5,
                                  "pads": (2, 1, 2, 3), "strides": (1, 2)},
                                 rtol=1e-5, atol=1e-5),
                          # 8 channels of 4x6 as the words its producer stored: a border
                          # of (1, 1, 2, 1), and one row of positions for a 1x1 layer
                          OpCase((bf16_exact_words(1, 1, 7, 8, 4),
                                  bf16_conv_weight(8, 4, 5, 8, 3, 3), f32(5)),
                                 {"channels": 5, "c_in": 8, "pads": (1, 1, 2, 1),
                                  "words_input": (4, 6)}, rtol=1e-5, atol=1e-5),
                          OpCase((bf16_exact_words(2, 1, 12, 4),
                                  bf16_conv_weight(4, 4, 3, 8, 1, 1)),
                                 {"channels": 3, "c_in": 8, "words_input": (3, 4)},
                                 rtol=1e-5, atol=1e-5),
                          # 12 channels (3 blocks of 4) as words of half blocks (rows of
                          # 2 lanes: `half_words`) under a border of (1, 1, 1, 1)
                          OpCase((bf16_exact_words(1, 3, 6, 7, 2),
                                  bf16_conv_weight(4, 4, 5, 12, 3, 3), f32(5)),
                                 {"channels": 5, "c_in": 12, "pads": (1, 1, 1, 1),
                                  "words_input": (4, 5), "half_words": True},
                                 rtol=1e-5, atol=1e-5)],
    # a border of (1, 0, 2, 1) around 3x5 positions; one row of 3x4 positions
    "bf16_words": [OpCase((f32(1, 4, 3, 5, 4),), {"pads": (1, 0, 2, 1)}),
                   OpCase((f32(2, 2, 3, 4, 4),), {"pads": (0, 0, 0, 0), "flat": True}),
                   # the halves of each of 3 blocks paired (`half_words`)
                   OpCase((f32(1, 3, 3, 5, 4),), {"pads": (1, 0, 2, 1), "half_words": True}),
                   OpCase((f32(2, 3, 3, 4, 4),), {"pads": (0, 0, 0, 0), "flat": True,
                                                   "half_words": True})],
    "conv2d_nchwc": [OpCase((f32(1, 1, 5, 6, 4), f32(1, 1, 3, 3, 3, 8), f32(5)),
                            {"channels": 5, "pads": (1, 1, 1, 1)}),
                     OpCase((f32(2, 2, 6, 5, 4), f32(1, 1, 6, 1, 1, 4)),
                            {"channels": 3, "strides": (2, 2)}),
                     # one tile of 6 channels: a block and a half
                     OpCase((f32(1, 2, 5, 6, 4), f32(1, 1, 6, 1, 1, 6), f32(5)),
                            {"channels": 5}),
                     # an NCHW input (a region's first layer) -> NCHW4c
                     OpCase((f32(1, 3, 6, 5), f32(1, 1, 3, 3, 3, 8), f32(5)),
                            {"channels": 5, "strides": (2, 2), "pads": (1, 1, 1, 1),
                             "block": 4})],
    "layout_transform": [OpCase((f32(2, 5, 3, 4),), {"src": "NCHW", "dst": "NCHW4c"}),
                         OpCase((f32(1, 2, 3, 3, 8),),
                                {"src": "NCHW8c", "dst": "NCHW", "channels": 13})],
    "pool2d_nchwc": [OpCase((f32(1, 2, 5, 6, 4),), {"pool": "max_pool2d", "kernel_shape": (3, 3),
                                                    "strides": (2, 2), "pads": (1, 1, 1, 1)}),
                     OpCase((f32(1, 1, 4, 4, 8),), {"pool": "avg_pool2d",
                                                    "kernel_shape": (2, 2)})],
    "conv2d_rows": [OpCase((f32(1, 5, 3, 7), f32(3, 5, 1, 1, 6), f32(13)), {"channels": 13}),
                    OpCase((f32(2, 3, 7, 9), f32(1, 3, 3, 2, 6)),
                           {"channels": 5, "strides": (2, 2), "pads": (1, 0, 2, 1),
                            "dilations": (1, 2)})],
    "conv2d_gemm": [OpCase((f32(2, 5, 4, 8), f32(3, 5, 1, 1), f32(3)), {"tile": (3, 16)}),
                    OpCase((f32(1, 4, 7, 6), f32(5, 4, 3, 3)),
                           {"strides": (2, 2), "pads": (1, 0, 2, 1), "dilations": (1, 2)})],
    "conv2d_depthwise": [OpCase((f32(1, 4, 6, 6), f32(4, 1, 3, 3), f32(4)),
                                {"group": 4, "dilations": (1, 2), "pads": (1, 2, 1, 0)})],
    "conv3d": [OpCase((f32(1, 2, 4, 5, 4), f32(2, 2, 2, 3, 2)),
                      {"pads": (1, 0, 1, 0, 1, 1), "dilations": (1, 1, 2)})],
    "conv_transpose1d": [OpCase((f32(1, 2, 5), f32(2, 3, 3)),
                                {"strides": (2,), "pads": (1, 0), "output_padding": (1,)})],
    "conv_transpose2d": [OpCase((f32(1, 2, 3, 4), f32(2, 3, 3, 3), f32(3)),
                                {"strides": (3, 2), "pads": (1, 0, 1, 2)}),
                         OpCase((f32(1, 4, 3, 3), f32(4, 1, 2, 2)),
                                {"group": 2, "dilations": (2, 1)}),
                         OpCase((f32(1, 1, 3, 3), f32(1, 2, 3, 3)),
                                {"strides": (3, 2), "pads": (0, 0, -1, -1)})],
    "conv_transpose3d": [OpCase((f32(1, 1, 2, 3, 2), f32(1, 2, 2, 2, 2)),
                                {"strides": (1, 2, 1)})],
    # image 7x6, block 3x2: ((7+1-3)//2+1) x ((6+2-3)//1+1) = 3 x 6 block positions
    "col2im": [OpCase((f32(2, 2 * 6, 18),), {"image_shape": (7, 6), "block_shape": (3, 2),
                                              "strides": (2, 1), "pads": (1, 0, 0, 2),
                                              "dilations": (1, 2)}),
               # a transposed convolution's: stride 3 and dilation 2 (taps every third
               # offset), negative pads, 1-D and 3-D
               OpCase((f32(1, 4 * 5, 4),), {"image_shape": (16,), "block_shape": (4,),
                                            "strides": (3,), "dilations": (2,),
                                            "pads": (-1, 1)}),
               OpCase((f32(1, 3 * 8, 12),), {"image_shape": (4, 5, 3),
                                             "block_shape": (2, 2, 2),
                                             "strides": (2, 2, 1), "pads": (1, 0, 0, 0, 1, 0)}),
               # a grouped GEMM's columns [N, G, C/G * B, L]: 2 groups of 3 channels
               OpCase((f32(2, 2, 3 * 4, 9),), {"image_shape": (6, 6), "block_shape": (2, 2),
                                               "strides": (2, 2), "pads": (0, 1, 1, 0)})],
    "lrn": [OpCase((f32(1, 5, 3, 2),), {"size": 3, "alpha": 0.01, "beta": 0.6, "bias": 1.5}),
            OpCase((f32(2, 4, 3),), {"size": 2}),
            # not float32: the tensor-expression definition instead of the kernel
            OpCase((f32(1, 4, 3, 2, dtype="float64"),), {"size": 3, "beta": 0.5})],
    # LRN across the channel blocks of NCHW{b}c (windows crossing blocks; by square
    # roots and by Eigen's pow)
    "lrn_nchwc": [OpCase((f32(2, 2, 3, 2, 4),), {"size": 5, "alpha": 0.5, "beta": 0.75,
                                                 "bias": 1.0, "roots": True}),
                  OpCase((f32(1, 3, 2, 2, 4),), {"size": 4, "alpha": 0.01, "beta": 0.6,
                                                 "bias": 1.5})],
    # pooling
    "max_pool1d": [OpCase((f32(1, 2, 9),), {"kernel_shape": (3,), "strides": (2,),
                                            "pads": (1, 1), "ceil_mode": True})],
    "max_pool2d": [OpCase((IMG,), {"kernel_shape": (3, 2), "strides": (2, 2),
                                   "pads": (1, 0, 1, 1), "dilations": (1, 2)}),
                   OpCase((ints(1, 1, 5, 5, dtype="int8"),), {"kernel_shape": (2, 2)})],
    "max_pool3d": [OpCase((f32(1, 1, 4, 5, 3),), {"kernel_shape": (2, 2, 2),
                                                  "ceil_mode": True, "strides": (2, 2, 2)})],
    "avg_pool1d": [OpCase((f32(1, 2, 9),), {"kernel_shape": (4,), "strides": (3,),
                                            "pads": (2, 2), "count_include_pad": True})],
    "avg_pool2d": [OpCase((IMG,), {"kernel_shape": (3, 3), "strides": (2, 2),
                                   "pads": (1, 1, 1, 1)}),
                   OpCase((IMG,), {"kernel_shape": (3, 3), "strides": (2, 2),
                                   "pads": (1, 1, 1, 1), "count_include_pad": True,
                                   "ceil_mode": True}),
                   OpCase((IMG,), {"kernel_shape": (2, 3), "dilations": (2, 2),
                                   "pads": (1, 1, 1, 1), "count_include_pad": True})],
    "avg_pool3d": [OpCase((f32(1, 1, 4, 4, 4),), {"kernel_shape": (3, 3, 3),
                                                  "pads": (1, 1, 1, 1, 1, 1)})],
    "lp_pool1d": [OpCase((f32(1, 2, 6),), {"kernel_shape": (3,), "p": 3})],
    "lp_pool2d": [OpCase((IMG,), {"kernel_shape": (2, 2), "strides": (2, 2)})],
    "lp_pool3d": [OpCase((f32(1, 1, 3, 3, 3),), {"kernel_shape": (2, 2, 2), "p": 1})],
    "global_avg_pool": [OpCase((IMG,))], "global_max_pool": [OpCase((f32(2, 3, 4, 2, 2),))],
    # reductions and normalisation
    "reduce_sum": [OpCase((X,), {"axes": (0, 2), "keepdims": True}),
                   OpCase((ints(3, 4),), {"axes": None, "keepdims": False})],
    "reduce_mean": [OpCase((X,), {"axes": (1,), "keepdims": False}),
                    OpCase((ints(3, 4),), {"axes": (1,)})],
    "reduce_max": [OpCase((X,), {"axes": (2,)}), OpCase((f32(2, 0, 3),), {"axes": (1,)})],
    "reduce_min": [OpCase((X,), {"axes": (0, 1), "keepdims": False})],
    "reduce_prod": [OpCase((f32(2, 3, low=0.5, high=1.5),), {"axes": (1,)})],
    "reduce_l1": [OpCase((X,), {"axes": (2,)})], "reduce_l2": [OpCase((X,), {"axes": (2,)})],
    "reduce_sum_square": [OpCase((X,), {"axes": (0,)})],
    "reduce_log_sum": [OpCase((POS,), {"axes": (1, 2)})],
    "argmax": [OpCase((const([[1, 3, 3], [2, 2, 0]], "float32"),), {"axis": 1}),
               OpCase((const([[1, 3, 3], [2, 2, 0]], "int32"),),
                      {"axis": 1, "select_last_index": True, "keepdims": False})],
    "argmin": [OpCase((X,), {"axis": 0, "keepdims": False})],
    "cumprod": [OpCase((f32(2, 5, low=0.5, high=1.5),), {"axis": 1, "exclusive": True}),
                OpCase((ints(6, low=-3, high=4),), {"axis": 0, "reverse": True})],
    # data-dependent sizes (kiln.ops.data_dependent): "dim" names the run-time size
    "nonzero": [OpCase((ints(3, 4, low=-1, high=2),), {"dim": "n"}),
                OpCase((const([0, 0, 0], "float32"),), {"dim": "n"}, note="none")],
    "compress": [OpCase((X, const([1, 0, 1, 1], "bool")), {"axis": None, "dim": "n"}),
                 OpCase((X, const([0, 1, 1], "bool")), {"axis": 1, "dim": "n"})],
    "topk_k": [OpCase((const([2], "int64"), X), {"axis": 2, "dim": "k"})],
    "topk_dynamic": [OpCase((f32(3, 6), const([0, 1, 2], "int64")),
                            {"axis": 1, "largest": True})],
    "unique": [OpCase((ints(9, low=0, high=4),), {"axis": None, "sorted": True, "dim": "n"}),
               OpCase((const([[1, 2], [0, 0], [1, 2]], "float32"),),
                      {"axis": 0, "sorted": False, "dim": "n"})],
    "non_max_suppression": [OpCase(
        (const([[[0, 0, 1, 1], [0, 0.1, 1, 1.1], [2, 2, 3, 3]]], "float32"),
         const([[[0.9, 0.8, 0.7]]], "float32"), const([2], "int64"), const([0.5], "float32"),
         const([0.0], "float32")),
        {"center_point_box": 0, "has_score_threshold": True, "dim": "n"})],
    "topk": [OpCase((f32(3, 6),), {"k": 3, "axis": 1}),
             OpCase((const([[1, 3, 3, 2], [5, 5, 5, 0]], "int32"),), {"k": 3, "axis": -1,
                                                                      "largest": False}),
             OpCase((const([[1, 3, 3, 2], [5, 5, 5, 0]], "float32"),), {"k": 2, "axis": 0})],
    "cumsum": [OpCase((X,), {"axis": 1}), OpCase((X,), {"axis": 2, "exclusive": True,
                                                      "reverse": True})],
    "softmax": [OpCase((X,), {"axis": 1}), OpCase((f32(3, 5, low=-50, high=50),),
                                                   {"axis": -1})],
    "log_softmax": [OpCase((X,), {"axis": 2})],
    "layer_norm": [OpCase((X, f32(4), f32(4)), {"axis": -1, "epsilon": 1e-3}),
                   OpCase((X, f32(3, 4)), {"axis": 1}), OpCase((X,), {"axis": 2})],
    # tensor manipulation
    "reshape": [OpCase((X,), {"shape": (4, 6)}), OpCase((X,), {"shape": (24,)})],
    "transpose": [OpCase((X,), {"perm": (2, 0, 1)}), OpCase((X,), {})],
    # X is 2x3x4: ShuffleNet's channel shuffle of 6 channels in 2 groups, rows of 4
    "reshape_transpose": [OpCase((X,), {"inner": (2, 3, 4), "perm": (1, 0, 2),
                                        "shape": (6, 4)}),
                          OpCase((X,), {"inner": (6, 4), "perm": (1, 0), "shape": (2, 2, 6)})],
    "concat": [OpCase((X, f32(2, 1, 4), f32(2, 2, 4)), {"axis": 1})],
    # batch row 0 keeps its whole past (a concatenation), row 1 one past row, then zeros
    "cache_rows": [OpCase((f32(2, 3, 4, 5), f32(2, 3, 2, 5), const([4, 1], "int64"),
                           const(np.arange(6), "int64")))],
    "split": [OpCase((f32(2, 7),), {"axis": 1, "sections": (2, 0, 5)})],
    "shape_of": [OpCase((X,), {"start": 0, "end": 3}), OpCase((X,), {"start": 1, "end": 2})],
    "strided_slice": [OpCase((X,), {"starts": (1, -1), "ends": (100, -4), "axes": (1, 2),
                                    "steps": (1, -2)}),
                      OpCase((X,), {"starts": (0,), "ends": (1,)})],
    "gather": [OpCase((X, const([[0, -1], [1, 0]], "int64")), {"axis": 1}),
               OpCase((X, const(1, "int32")), {"axis": 0})],
    "gather_elements": [OpCase((f32(3, 3), const([[1, 2, 0], [2, -1, 0]], "int64")),
                               {"axis": 0})],
    "gather_nd": [OpCase((f32(2, 3, 4), const([[0, 1], [1, -1]], "int64")), {}),
                  OpCase((f32(2, 3, 4), const([[[1], [0]], [[2], [2]]], "int64")),
                         {"batch_dims": 1})],
    "scatter_elements": [
        OpCase((f32(3, 4), const([[1, 0, 2], [0, 2, 1]], "int64"), f32(2, 3)), {"axis": 0}),
        OpCase((f32(3, 4), const([[1, 1], [-1, 0]], "int64"), f32(2, 2)),
               {"axis": 1, "reduction": "add"}),
        OpCase((f32(2, 3), const([[0, 0]], "int64"), f32(1, 2)), {"axis": 1,
                                                                 "reduction": "max"})],
    "scatter_nd": [
        OpCase((f32(4, 3), const([[1], [3]], "int64"), f32(2, 3)), {}),
        OpCase((f32(2, 3), const([[0, 1], [1, 2], [0, 1]], "int64"), f32(3)),
               {"reduction": "mul"}),
        OpCase((f32(2, 3), const([[0, 1], [-1, 0]], "int64"), f32(2)), {"reduction": "min"})],
    "reverse_sequence": [OpCase((f32(4, 2, 3), const([3, 1], "int64")),
                                {"batch_axis": 1, "time_axis": 0}),
                         OpCase((f32(2, 4), const([4, 2], "int32")),
                                {"batch_axis": 0, "time_axis": 1})],
    "broadcast_to": [OpCase((f32(3, 1),), {"shape": (2, 3, 4)}),
                     OpCase((f32(2, 3),), {"shape": (3, 1, 1)})],
    "tile": [OpCase((f32(2, 3),), {"repeats": (2, 3)})],
    "pad": [OpCase((f32(2, 3),), {"pads": (1, 0, 2, 3), "mode": "constant", "value": 1.5}),
            OpCase((f32(3, 4),), {"pads": (2, 1, 1, 3), "mode": "reflect"}),
            OpCase((f32(3, 4),), {"pads": (1, 2, 2, 1), "mode": "edge"}),
            OpCase((f32(3, 4),), {"pads": (4, 1, 2, 5), "mode": "wrap"})],
    "trilu": [OpCase((f32(4, 5),), {"k": 1, "upper": True}),
              OpCase((f32(2, 3, 3),), {"k": -1, "upper": False})],
    "resize": [OpCase((f32(1, 1, 3, 4),), {"sizes": (1, 1, 5, 7), "scales": (1, 1, 5 / 3, 7 / 4),
                                           "mode": "linear"}),
               OpCase((f32(1, 1, 4, 4),), {"sizes": (1, 1, 8, 2), "scales": (1, 1, 2.0, 0.5),
                                           "mode": "nearest",
                                           "coordinate_transformation_mode": "asymmetric",
                                           "nearest_mode": "floor"}),
               OpCase((f32(1, 1, 4, 4),), {"sizes": (1, 1, 3, 3), "scales": (1, 1, 0.8, 0.8),
                                           "mode": "cubic", "exclude_outside": True}),
               OpCase((f32(1, 1, 4, 4),), {"sizes": (1, 1, 3, 5), "scales": (1, 1, 0.75, 1.25),
                                           "mode": "linear", "roi": (0, 0, 0.2, 0.1,
                                                                     1, 1, 0.9, 1.2),
                                           "coordinate_transformation_mode":
                                               "tf_crop_and_resize",
                                           "extrapolation_value": 7.0}),
               OpCase((ints(1, 1, 3, 3, low=0, high=250, dtype="uint8"),),
                      {"sizes": (1, 1, 5, 5), "scales": (1, 1, 5 / 3, 5 / 3), "mode": "cubic"})],
    # quantized operators (docs/quantization.md)
    "quantize_linear": [
        OpCase((f32(2, 3, 4, low=-8, high=8), const(0.05, "float32"), const(3, "uint8"))),
        OpCase((f32(2, 3, 4, low=-40, high=40), const([0.1, 0.2, 0.3], "float32"),
                const([0, -3, 5], "int8")), {"axis": 1}),
        OpCase((f32(2, 6, low=-30, high=30), const([[0.1, 0.2], [0.3, 0.05]], "float32"),
                const([[1, -2], [0, 4]], "int16")), {"axis": 1, "block_size": 4}),
        OpCase((f32(2, 3, 4, low=-8, high=8), const(0.05, "float32"), const(3, "uint8")),
               {"zero_point_first": True})],
    "dequantize_linear": [
        OpCase((ints(2, 3, 4, low=-128, high=128, dtype="int8"),
                const([0.1, 0.2, 0.3], "float32"), const([0, -3, 5], "int8")), {"axis": 1}),
        OpCase((ints(6, low=-99999, high=99999), const(0.001, "float32"), const(0, "int32")))],
    "dynamic_quantize_linear": [OpCase((f32(3, 5),)), OpCase((f32(4, low=0.5, high=2.0),))],
    "matmul_integer": [
        OpCase((ints(2, 3, 5, low=0, high=256, dtype="uint8"),
                ints(5, 4, low=-128, high=128, dtype="int8"), const(7, "uint8"),
                const([1, -2, 0, 3], "int8"))),
        OpCase((ints(3, 5, low=-128, high=128, dtype="int8"),
                ints(4, 5, low=-128, high=128, dtype="int8"), const(-3, "int8"),
                const(0, "int8")), {"transpose_b": True})],
    "conv_integer": [
        OpCase((ints(1, 4, 5, 6, low=0, high=256, dtype="uint8"),
                ints(6, 2, 3, 3, low=-128, high=128, dtype="int8"), const(100, "uint8"),
                const([0, 1, -1, 2, 0, 3], "int8")),
               {"group": 2, "pads": (1, 0, 1, 2), "strides": (2, 1), "dilations": (1, 1)})],
    "qlinear_matmul": [
        OpCase((ints(2, 4, 6, low=0, high=256, dtype="uint8"),
                ints(6, 5, low=-128, high=128, dtype="int8"), ints(5, low=-900, high=900),
                const(128, "uint8"), const(0, "int8"),
                const([0.001, 0.002, 0.0015, 0.003, 0.0005], "float32"), const(10, "uint8")),
               {"qmin": 10}),
        OpCase((ints(3, 6, low=-128, high=128, dtype="int8"),
                ints(5, 6, low=-128, high=128, dtype="int8"), ints(5, low=-900, high=900),
                const(-4, "int8"), const([1, 0, -1, 2, 0], "int8"), const(0.0021, "float32"),
                const(-3, "int8")), {"transpose_b": True, "qmax": 60})],
    "qlinear_conv": [
        OpCase((ints(1, 4, 6, 6, low=0, high=256, dtype="uint8"),
                ints(4, 2, 3, 3, low=-128, high=128, dtype="int8"), ints(4, low=-500, high=500),
                const(120, "uint8"), const(0, "int8"),
                const([0.0025, 0.005, 0.00375, 0.0075], "float32"), const(100, "uint8")),
               {"group": 2, "pads": (1, 0, 1, 2), "strides": (2, 1), "dilations": (1, 1)}),
        OpCase((ints(1, 3, 7, low=-128, high=128, dtype="int8"),
                ints(5, 3, 2, low=-128, high=128, dtype="int8"), ints(5, low=-500, high=500),
                const(3, "int8"), const(0, "int8"), const(0.004, "float32"),
                const(-10, "int8")), {"pads": (1, 1), "dilations": (2,), "qmin": -10})],
    # onnxruntime's QLinearAdd/QLinearMul formulas (a per-channel A swaps the roles)
    "qlinear_add": [
        OpCase((ints(2, 3, 4, low=0, high=256, dtype="uint8"), const(0.05, "float32"),
                const(120, "uint8"), ints(2, 3, 4, low=0, high=256, dtype="uint8"),
                const(0.03, "float32"), const(131, "uint8"), const(0.07, "float32"),
                const(128, "uint8"))),
        OpCase((ints(1, 3, 1, low=-128, high=128, dtype="int8"), const(0.02, "float32"),
                const(-3, "int8"), ints(2, 3, 5, low=-128, high=128, dtype="int8"),
                const(0.045, "float32"), const(4, "int8"), const(0.04, "float32"),
                const(0, "int8")))],
    "qlinear_mul": [
        OpCase((ints(2, 3, 4, low=0, high=256, dtype="uint8"), const(0.05, "float32"),
                const(120, "uint8"), ints(4, low=0, high=256, dtype="uint8"),
                const(0.03, "float32"), const(131, "uint8"), const(0.07, "float32"),
                const(128, "uint8")))],
    "qlinear_global_average_pool": [
        OpCase((ints(2, 3, 4, 5, low=0, high=256, dtype="uint8"), const(0.05, "float32"),
                const(120, "uint8"), const(0.01, "float32"), const(7, "uint8"))),
        OpCase((ints(1, 4, 3, 6, low=-128, high=128, dtype="int8"), const(0.02, "float32"),
                const(-3, "int8"), const(0.004, "float32"), const(5, "int8")),
               {"channels_last": 1}),
        # words of 4 channels ([N][C / 4][H][W][4]): the word rows' kernel
        OpCase((ints(2, 3, 3, 5, 4, low=0, high=256, dtype="uint8"), const(0.05, "float32"),
                const(120, "uint8"), const(0.01, "float32"), const(7, "uint8")),
               {"in_layout": "NCHW4c"})],
    "qlinear_softmax": [
        OpCase((ints(2, 3, 9, low=0, high=256, dtype="uint8"), exp_table(0.1, 9),
                const(2, "uint8")), {"y_multiplier": 255}),
        OpCase((ints(4, 17, low=-128, high=128, dtype="int8"), exp_table(0.05, 17),
                const(-128, "int8")), {"y_multiplier": 256})],
    "qlinear_matmul_packed": [
        OpCase((ints(2, 4, 6, low=0, high=256, dtype="uint8"),
                ints(1, 6, 5, low=-128, high=128, dtype="int8"), ints(5, low=-9000, high=9000),
                const([0.001, 0.002, 0.0015, 0.003, 0.0005], "float32"), const(10, "uint8")),
               {"qmin": 10, "n": 5}),
        OpCase((ints(3, 6, low=-128, high=128, dtype="int8"),
                ints(1, 6, 5, low=-255, high=256, dtype="int16"), ints(5, low=-900, high=900),
                const(0.0021, "float32"), const(-3, "int8")), {"n": 5}),
        OpCase((ints(5, 9, low=0, high=256, dtype="uint8"),
                ints(2, 9, 64, low=-128, high=128, dtype="int8"),
                ints(70, low=-9000, high=9000), const(0.004, "float32"), const(100, "uint8")),
               {"qmax": 200, "n": 70})],
    "qlinear_conv_packed": [
        GROUPED_U8,
        OpCase((ints(1, 3, 7, low=-128, high=128, dtype="int8"),
                ints(5, 3, 2, low=-255, high=256, dtype="int16"), ints(5, low=-500, high=500),
                const(3, "int8"), const(0.004, "float32"), const(-10, "int8")),
               {"pads": (1, 1), "dilations": (2,), "qmin": -10})],
    # depthwise and grouped: the operands of qlinear_conv_packed on vector tiles
    "qlinear_conv_grouped": [
        GROUPED_U8,
        OpCase((ints(1, 3, 9, 7, low=-128, high=128, dtype="int8"),
                ints(3, 1, 3, 3, low=-255, high=256, dtype="int16"), ints(3, low=-500, high=500),
                const(3, "int8"), const(0.004, "float32"), const(-10, "int8")),
               {"group": 3, "pads": (1, 1, 1, 1), "strides": (2, 2), "dilations": (1, 1),
                "qmin": -10}),
        # depthwise, stride 1, dilated, a channel multiplier of 2 (the plane kernel on
        # targets of 8 int32 lanes and more; tests/quantization/test_depthwise_conv.py)
        OpCase((ints(1, 2, 6, 5, low=-128, high=128, dtype="int8"),
                ints(4, 1, 3, 3, low=-128, high=128, dtype="int8"), ints(4, low=-900, high=900),
                const(-7, "int8"), const([0.003, 0.004, 0.002, 0.005], "float32"),
                const(4, "int8")),
               {"group": 2, "pads": (2, 1, 0, 2), "dilations": (2, 1)})],
    # weights as the dot-product kernel's int32 words of 4 int8 values (K = 4*3*3 = 36
    # and 3*2*2 = 12), made from random int8 weights by the packing itself
    "qlinear_conv_dot": [
        OpCase((ints(1, 4, 6, 6, low=0, high=256, dtype="uint8"),
                weight_words(4, 4, 3, 3), ints(4, low=-5000, high=5000), const(120, "uint8"),
                const([0.0025, 0.005, 0.00375, 0.0075], "float32"), const(100, "uint8")),
               {"w_shape": (4, 4, 3, 3), "pads": (1, 0, 1, 2), "strides": (2, 1),
                "dilations": (1, 1)}),
        OpCase((ints(1, 3, 7, 5, low=-128, high=128, dtype="int8"),
                weight_words(5, 3, 2, 2), ints(5, low=-500, high=500), const(3, "int8"),
                const(0.004, "float32"), const(-10, "int8")),
               {"w_shape": (5, 3, 2, 2), "pads": (1, 1, 0, 1), "dilations": (2, 1),
                "qmin": -10}),
        # the channels-as-lanes tile's panels of 4 channels: 6 channels, a partial panel;
        # stride 1 (its words packed in the padded input grid), uneven pads, dilated
        OpCase((ints(1, 3, 5, 5, low=0, high=256, dtype="uint8"),
                weight_panels(4, 6, 3, 3, 3), ints(6, low=-900, high=900), const(17, "uint8"),
                const([0.003, 0.004, 0.002, 0.005, 0.001, 0.006], "float32"),
                const(90, "uint8")), {"w_shape": (6, 3, 3, 3), "pads": (2, 0, 1, 1),
                                      "dilations": (1, 2)})],
    # dynamic quantization's fused product: A quantized as DynamicQuantizeLinear does,
    # then float32(acc) * (a_scale * b_scale) + bias
    "dynamic_quant_matmul": [
        OpCase((f32(2, 3, 5, low=-3, high=1), ints(5, 4, low=-128, high=128, dtype="int8"),
                const([1, -2, 0, 3], "int8"), const(0.02, "float32"), f32(4))),
        OpCase((f32(3, 6, low=0.5, high=2.0), ints(6, 2, low=0, high=256, dtype="uint8"),
                const(128, "uint8"), const([0.01, 0.03], "float32"), f32(2)))],
    "dynamic_quant_matmul_packed": [
        OpCase((f32(2, 3, 5), ints(1, 5, 4, low=-255, high=256, dtype="int16"),
                ints(4, low=-900, high=900), const(0.02, "float32"), f32(4)), {"n": 4}),
        # 2-D A: the register-tiled kernel, with partial row and column tiles and K past
        # one range chunk
        OpCase((f32(5, 19), ints(2, 19, 64, low=-128, high=128, dtype="int8"),
                ints(70, low=-900, high=900), f32(70, low=0.001, high=0.01), f32(70)),
               {"n": 70})],
    "matmul_integer_packed": [
        OpCase((ints(2, 3, 5, low=0, high=256, dtype="uint8"),
                ints(1, 5, 4, low=-255, high=256, dtype="int16"), ints(4, low=-900, high=900),
                const(131, "uint8")), {"n": 4}),
        # 2-D A: the register-tiled kernel, with partial row and column tiles
        OpCase((ints(5, 9, low=0, high=256, dtype="uint8"),
                ints(2, 9, 64, low=-128, high=128, dtype="int8"), ints(70, low=-900, high=900),
                const(7, "uint8")), {"n": 70})],
    # QLinearConcat: the first input copied (the output's parameters), the others
    # requantized, an int8 one included
    "qlinear_concat": [
        OpCase((ints(1, 2, 3, 4, low=0, high=256, dtype="uint8"),
                ints(1, 3, 3, 4, low=0, high=256, dtype="uint8"),
                ints(1, 1, 3, 4, low=-128, high=128, dtype="int8")),
               {"axis": 1, "x_scales": (0.05, 0.0731, 0.031), "x_zero_points": (120, 3, -7),
                "y_scale": 0.05, "y_zero_point": 120, "dtype": "uint8"})],
    # a grouped convolution as one GEMM per group: 1x1 positions in whole panels (read
    # in place, a bias), strided ones copied into padded panels
    "conv2d_group_gemm": [
        OpCase((f32(2, 6, 4, 8), f32(9, 2, 1, 1), f32(9)), {"group": 3, "tile": (3, 16)}),
        # its output channel-shuffled (on a bfloat16 target, in the stores)
        OpCase((f32(1, 6, 4, 8), f32(9, 2, 1, 1), f32(9)), {"group": 3, "shuffled": True}),
        OpCase((f32(1, 4, 7, 6), f32(6, 2, 1, 1)), {"group": 2, "strides": (2, 2)}),
        # a 3x3 layer (what tuning may give the kernel): padded panels per group
        OpCase((f32(1, 4, 5, 6), f32(6, 2, 3, 3)),
               {"group": 2, "pads": (1, 0, 1, 1), "strides": (1, 2)})],
    # a depthwise convolution on NCHW{b}c: padding channels (7 of 8), border columns,
    # whole tiles and a remainder between them, stride 2 with a 5x5 window
    "conv2d_nchwc_depthwise": [
        OpCase((f32(1, 2, 5, 6, 4), f32(2, 3, 3, 4), f32(8)),
               {"channels": 7, "group": 7, "pads": (1, 1, 1, 1)}),
        OpCase((f32(1, 1, 3, 20, 4), f32(1, 3, 3, 4)),
               {"channels": 4, "group": 4, "pads": (1, 0, 1, 2)}),
        OpCase((f32(2, 1, 9, 8, 8), f32(1, 5, 5, 8)),
               {"channels": 8, "group": 8, "strides": (2, 2), "pads": (2, 2, 2, 2)})],
    # an SE block's per-channel scale on NCHW{b}c (its vector kernel)
    "channel_scale_nchwc": [OpCase((f32(2, 2, 3, 5, 4), f32(2, 2, 1, 1, 4)), {}),
                            OpCase((f32(2, 2, 3, 5, 4), f32(1, 2, 1, 1, 4)), {})],
}


def winograd_weight(m: int, *shape: int) -> Gen:
    """A random OIHW 3x3 weight of `shape` transformed for F(m x m, 3 x 3)."""
    from kiln.kernels.conv.winograd import weight_transform

    return lambda rng: weight_transform(rng.uniform(-2.0, 2.0, shape).astype(np.float32), m)


# Winograd F(4x4) with uneven pads, partial tiles and a bias (the recorded tile); F(2x2)
# over a batch of two without one (the rule's tile); rounding differs from direct sums
CASES["conv2d_winograd"] = [
    OpCase((f32(1, 5, 9, 7), winograd_weight(4, 6, 5, 3, 3), f32(6)),
           {"pads": (1, 0, 2, 1), "tile": (4, 3, 16)}, rtol=1e-4, atol=1e-4),
    OpCase((f32(2, 3, 5, 6), winograd_weight(2, 4, 3, 3, 3)), {"pads": (1, 1, 1, 1)},
           rtol=1e-4, atol=1e-4)]


def winograd_panels(m: int, nr: int, *shape: int) -> Gen:
    """`winograd_weight` packed in panels of `nr` output channels (the NCHW{b}c op's)."""
    from kiln.kernels.conv.winograd_nchwc import pack_panels

    return lambda rng: pack_panels(winograd_weight(m, *shape)(rng), nr)


# Winograd on NCHW{b}c: F(4x4) with uneven pads, partial tiles at the bottom and right,
# a bias and output channels padded to a whole panel (the recorded tile); F(2x2) over a
# batch of two without one (the rule's tile)
CASES["conv2d_winograd_nchwc"] = [
    OpCase((f32(1, 2, 9, 7, 4), winograd_panels(4, 16, 12, 8, 3, 3), f32(12)),
           {"pads": (1, 0, 2, 1), "tile": (4, 3, 16), "channels": 12}, rtol=1e-4, atol=1e-4),
    OpCase((f32(2, 1, 5, 6, 8), winograd_panels(2, 8, 8, 8, 3, 3)),
           {"pads": (1, 1, 1, 1), "tile": (2, 4, 8), "channels": 8}, rtol=1e-4, atol=1e-4)]
