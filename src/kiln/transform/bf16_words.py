"""bfloat16 words between convolutions: a producer stores its consumer's words.

Each `conv2d_nchwc_bf16` converts its float32 NCHW{b}c input into a workspace of int32
words of bfloat16 pairs before its tiles (kiln.kernels.conv.bf16, `converted_input`):
it reads the float32 activations and writes half their bytes as words, every layer.
Where a value is a bfloat16 convolution's output, seen through unary elementwise ops
(its ReLU), each read once, and its one reader is a bfloat16 convolution that would
convert it into its own workspace, the value's words are computed instead (`bf16_words`,
kiln.ops.conv_bf16, under the consumer's pads) and the consumer reads them in place
(attribute `words_input`). FuseOps then joins `bf16_words` to the producer's group
(`words_tail`): the producer's tiles round their outputs, after the epilogue in
float32, straight into the words (kiln.kernels.conv.bf16_words), and the float32 tensor
and the conversion pass are gone. The words are the ones the consumer's conversion
would write, so the outputs are the same bit for bit.

Taken where the consumer's workspace is whole pairs of blocks of the value (an even
count of 16-lane blocks, paired lane by lane: `word_block`), not subsampled (a strided
unpadded 1x1 layer converts only the positions it reads) and not a region's first
layer; and where the producer's channel tile covers whole pairs of blocks. ResNet's
bottlenecks: the 1x1 -> 3x3 and 3x3 -> 1x1 edges (the block's output also feeds the
residual add: it stays float32); VGG's 3x3 chains.
"""

from __future__ import annotations

from collections import Counter
from typing import cast

from kiln.ir import graph as g
from kiln.ir.analysis.graph_uses import var_use_counts
from kiln.ir.types import TensorType
from kiln.kernels.tiles import tile_lanes
from kiln.ops import call
from kiln.ops.conv_bf16 import (
    BF16_WORDS,
    CONV_BF16,
    ROW_TAPS,
    WORDS_INPUT,
    bf16_conv_shape,
    flat_words,
    word_block,
)
from kiln.ops.conv_direct import NCHW_INPUT_BLOCK
from kiln.target.isa import ISA
from kiln.transform.concat_tails import unary_elementwise


def _blocked(t: object, block: int) -> bool:
    """Whether `t` is a float32 NCHW{block}c tensor of static sizes but the batch, of an
    even count of blocks."""
    return (isinstance(t, TensorType) and t.dtype == "float32" and t.ndim == 5
            and all(isinstance(d, int) for d in t.shape[1:]) and t.shape[4] == block
            and cast(int, t.shape[1]) % 2 == 0)


def reads_words(conv: g.Call, block: int) -> bool:
    """Whether the bfloat16 convolution `conv` may read its input as stored words (module
    docstring)."""
    attrs = conv.attrs
    if not (conv.op == CONV_BF16 and _blocked(conv.args[0].type, block)
            and not any(a in attrs for a in (NCHW_INPUT_BLOCK, ROW_TAPS, WORDS_INPUT))):
        return False
    shape = bf16_conv_shape([a.type for a in conv.args], attrs)
    subsampled = ((shape.kh, shape.kw) == (1, 1) and shape.stride != (1, 1)
                  and not any(shape.pads))
    return word_block(shape.c_in, block) == block and shape.c_in % block == 0 and not subsampled


def stores_words(conv: g.Call, block: int) -> bool:
    """Whether the bfloat16 convolution `conv` may store its output as words: its
    channels and its channel tile are whole pairs of blocks."""
    if not (conv.op == CONV_BF16 and _blocked(conv.ret_type, block)):
        return False
    weight, channels = conv.args[1].type, conv.attrs["channels"]
    return (isinstance(weight, TensorType) and isinstance(weight.shape[4], int)
            and weight.shape[4] % (2 * block) == 0
            and isinstance(channels, int) and channels % (2 * block) == 0)


def store_words(fn: g.Function, isa: ISA) -> g.Function:
    """`fn` with the words of each value that qualifies (module docstring) computed after
    it and read by its consumer in its place."""
    block = tile_lanes(isa)
    if isa.precision != "bf16" or block != 16:
        return fn  # the bfloat16 NCHWc kernel runs on AVX-512 only
    uses: Counter[g.Var] = var_use_counts(fn)
    results = fn.result.fields if isinstance(fn.result, g.Tuple) else (fn.result,)
    # the bindings whose value one call reads and the function does not return
    once = {id(b.var): b for b in fn.bindings if uses[b.var] == 1}
    for r in results:
        once.pop(id(r), None)

    def read_once(x: g.Expr) -> g.Binding | None:
        return once.get(id(x))

    after: dict[int, g.Binding] = {}     # id(value var) -> its words' binding
    replaced: dict[int, g.Binding] = {}  # id(consumer var) -> the consumer reading words
    for b in fn.bindings:
        conv = b.value
        if not (isinstance(conv, g.Call) and reads_words(conv, block)):
            continue
        value = at = read_once(conv.args[0])
        while at is not None and unary_elementwise(at.value):
            at = read_once(cast(g.Call, at.value).args[0])
        if value is None or at is None or not (isinstance(at.value, g.Call)
                                               and stores_words(at.value, block)):
            continue
        shape = bf16_conv_shape([a.type for a in conv.args], conv.attrs)
        flat = flat_words((shape.kh, shape.kw), shape.stride, shape.pads)
        words = call(BF16_WORDS, value.var, pads=shape.pads, flat=flat)
        var = g.Var(f"{value.var.name}_words", words.ret_type)
        after[id(value.var)] = g.Binding(var, words)
        replaced[id(b.var)] = g.Binding(b.var, call(
            CONV_BF16, var, *conv.args[1:], **dict(conv.attrs),
            **{WORDS_INPUT: (shape.h, shape.w)}))
    if not replaced:
        return fn
    bindings: list[g.Binding] = []
    for b in fn.bindings:
        bindings.append(replaced.get(id(b.var), b))
        if id(b.var) in after:
            bindings.append(after[id(b.var)])
    return g.Function(fn.params, tuple(bindings), fn.result, dict(fn.attrs))


def words_tail(group: list[g.Binding], value: g.Expr) -> bool:
    """Whether `value` is the `bf16_words` of `group`'s last value and `group` a bfloat16
    convolution's (the kernel stores the words: FuseOps joins it to the group)."""
    first = group[0].value
    return (isinstance(value, g.Call) and value.op == BF16_WORDS
            and value.args[0] is group[-1].var
            and isinstance(first, g.Call) and first.op == CONV_BF16)
