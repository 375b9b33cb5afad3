"""bfloat16 words between convolutions: a producer stores its consumers' words.

Each `conv2d_nchwc_bf16` converts its float32 NCHW{b}c input into a workspace of int32
words of bfloat16 pairs before its tiles (kiln.kernels.conv.bf16, `converted_input`):
it reads the float32 activations and writes half their bytes as words, every layer.
Where a value is a bfloat16 convolution's output, seen through the elementwise ops that
FuseOps joins to it (its ReLU, a residual add: the group FuseOps would make of it, by
the rule both passes take from kiln.transform.fuse_rule), and every reader of the value
is a bfloat16 convolution that would convert it into a workspace of the same layout (the
same pads), the value's words are computed instead (`bf16_words`, kiln.ops.conv_bf16,
under those pads; one row of positions for unpadded 1x1 readers) and the readers take
them in place (attribute `words_input`). FuseOps then joins `bf16_words` to the producer's group
(`words_tail`): the producer's tiles round their outputs, after the epilogue in
float32, straight into the words (kiln.kernels.conv.bf16_words), and the float32 tensor
and the conversion passes are gone. A `channel_scale_nchwc` producer (DenseNet's
pre-activation BatchNorm and ReLU) and a `conv2d_nchwc_depthwise` (MobileNetV2's depthwise
layers, read by their projection) store them likewise (kiln.kernels.conv.channel_scale,
kiln.kernels.conv.nchwc_depthwise).
The words are the ones each reader's conversion would write, so the outputs are the same
bit for bit.

Taken where the readers' words are whole pairs of blocks of the value (an even count of
16-lane blocks, paired lane by lane: `word_block`) and not a region's first layer, and
where the producer's channel tile covers whole pairs of blocks; or, where the readers
pair the halves of each block (an odd count of whole blocks: MobileNetV2's 16 and 144
channels, `half_words`), where the producer is a bfloat16 convolution or a depthwise
layer, whose tiles store one block's halves as a word row of 8 lanes. A strided unpadded 1x1
reader (which converted only the positions it reads) reads every other stored word.
ResNet's bottlenecks: the 1x1 -> 3x3 and 3x3 -> 1x1 edges, and a stage's first block
input (read by its 1x1 layer and its strided 1x1 shortcut); a block output that also
feeds the next residual add stays float32. A channel concat read only by such
convolutions, whose every input is such a producer's value read by the concat alone
(SqueezeNet's fire modules: the two expansions, then the next squeeze layer), becomes
the concat of its inputs' words: each producer stores its words into its part of it
(lowering lays the pieces out as views of the concat's output,
kiln.transform.concat_views).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import cast

from kiln.ir import graph as g
from kiln.ir.analysis.graph_uses import var_use_counts
from kiln.ir.types import TensorType
from kiln.kernels.tiles import tile_lanes
from kiln.ops import call
from kiln.ops.channel_scale_nchwc import CHANNEL_SCALE
from kiln.ops.conv_bf16 import (
    BF16_WORDS,
    CONV_BF16,
    HALF_WORDS,
    ROW_TAPS,
    WORDS_INPUT,
    bf16_conv_shape,
    flat_words,
    word_block,
)
from kiln.ops.conv_direct import NCHW_INPUT_BLOCK
from kiln.ops.conv_nchwc_depthwise import NCHWC_DEPTHWISE
from kiln.ops.pool_nchwc import POOL_NCHWC
from kiln.target.isa import ISA
from kiln.transform.bf16_depthwise_words import read_words
from kiln.transform.bf16_pool_words import read_pool_words
from kiln.transform.fuse_rule import MAX_FUSED_OPS, chain

#: The ops whose kernels may store their readers' words in place of their float32 value.
_WORD_HEADS = (CONV_BF16, CHANNEL_SCALE, POOL_NCHWC, NCHWC_DEPTHWISE)


def _blocked(t: object, block: int, half: bool = False) -> bool:
    """Whether `t` is a float32 NCHW{block}c tensor of static sizes but the batch, of an
    even count of blocks (of any count for words of `half` blocks)."""
    return (isinstance(t, TensorType) and t.dtype == "float32" and t.ndim == 5
            and all(isinstance(d, int) for d in t.shape[1:]) and t.shape[4] == block
            and (half or cast(int, t.shape[1]) % 2 == 0))


def half_words(conv: g.Call, block: int) -> bool:
    """Whether the words the bfloat16 convolution `conv` reads pair the halves of each
    block (`word_block`: an odd count of whole blocks), not pairs of blocks."""
    c_in = conv.attrs.get("c_in")
    return (isinstance(c_in, int) and c_in % block == 0
            and word_block(c_in, block) == block // 2)


def reads_words(conv: g.Call, block: int) -> bool:
    """Whether the bfloat16 convolution `conv` may read its input as stored words (module
    docstring)."""
    attrs = conv.attrs
    half = conv.op == CONV_BF16 and half_words(conv, block)
    if not (conv.op == CONV_BF16 and _blocked(conv.args[0].type, block, half)
            and not any(a in attrs for a in (NCHW_INPUT_BLOCK, ROW_TAPS, WORDS_INPUT))
            and conv.args[0] not in conv.args[1:]):
        return False
    c_in = int(cast(int, attrs["c_in"]))
    return half or (word_block(c_in, block) == block and c_in % block == 0)


def stores_words(conv: g.Call, block: int, half: bool = False) -> bool:
    """Whether the bfloat16 convolution `conv` may store its output as words: its
    channels and its channel tile are whole pairs of blocks (whole blocks for words of
    `half` blocks)."""
    if not (conv.op == CONV_BF16 and _blocked(conv.ret_type, block, half)):
        return False
    weight, channels = conv.args[1].type, conv.attrs["channels"]
    unit = block if half else 2 * block
    return (isinstance(weight, TensorType) and isinstance(weight.shape[4], int)
            and weight.shape[4] % unit == 0
            and isinstance(channels, int) and channels % unit == 0)


def _stores_words(call: g.Call, block: int, half: bool) -> bool:
    """`stores_words`, or a `channel_scale_nchwc` (DenseNet's pre-activation BatchNorm,
    whose kernel stores words as it scales: kiln.kernels.conv.channel_scale) or a
    `pool2d_nchwc` (SqueezeNet's pools before a squeeze layer: kiln.kernels.pool.nchwc)
    or a `conv2d_nchwc_depthwise` (MobileNetV2's, before its projection:
    kiln.kernels.conv.nchwc_depthwise) of an even count of blocks; words of `half`
    blocks from the convolution and the depthwise layer only."""
    if half:
        return stores_words(call, block, half) or (call.op == NCHWC_DEPTHWISE
                                                   and _blocked(call.ret_type, block, half))
    return stores_words(call, block) or (call.op in _WORD_HEADS[1:]
                                         and _blocked(call.ret_type, block))


def _producer(bindings: Sequence[g.Binding], k: int, uses: Counter[g.Var],
              block: int, half: bool = False) -> bool:
    """Whether binding `k`'s value is the last of a FuseOps group (kiln.transform.fuse_rule:
    its head's epilogue of elementwise ops; room left for the words) whose head may store
    words (of `half` blocks): a bfloat16 convolution, DenseNet's pre-activation channel
    scale, a pool or a depthwise layer. The group's kernel then stores them."""
    for head in _WORD_HEADS:
        j = chain(bindings, k, uses, head, MAX_FUSED_OPS - 1)
        if j is not None:
            return _stores_words(cast(g.Call, bindings[j].value), block, half)
    return False


def _concat_pieces(bindings: Sequence[g.Binding], value: g.Expr, index: dict[int, int],
                   uses: Counter[g.Var], returned: set[int],
                   block: int) -> list[g.Var] | None:
    """The inputs of `value` where it is a channel concat (SqueezeNet's fire modules)
    whose every input is read by it alone and closes a group that may store words
    (`_producer`) of whole pairs of blocks: each producer then stores its words into
    its part of a concat of words (along the pairs' axis: a pair of blocks is one
    contiguous run of the words, as a block is of the float32 value). None otherwise."""
    if not (isinstance(value, g.Call) and value.op == "concat"
            and value.attrs.get("axis") == 1 and len(set(map(id, value.args))) == len(value.args)):
        return None
    pieces = []
    for a in value.args:
        k = index.get(id(a))
        if not (isinstance(a, g.Var) and k is not None and uses[a] == 1
                and id(a) not in returned and _blocked(a.type, block)
                and _producer(bindings, k, uses, block)):
            return None
        pieces.append(a)
    return pieces


def store_words(fn: g.Function, isa: ISA) -> g.Function:
    """`fn` with the words of each value that qualifies (module docstring) computed after
    it and read by its consumers in its place."""
    block = tile_lanes(isa)
    if isa.precision != "bf16" or block != 16:
        return fn  # the bfloat16 NCHWc kernel runs on AVX-512 only
    uses: Counter[g.Var] = var_use_counts(fn)
    results = fn.result.fields if isinstance(fn.result, g.Tuple) else (fn.result,)
    returned = {id(r) for r in results}
    readers: dict[int, list[g.Binding]] = {}
    for b in fn.bindings:
        if isinstance(b.value, g.Call):
            for a in set(b.value.args):
                readers.setdefault(id(a), []).append(b)
    after: dict[int, g.Binding] = {}     # id(value var) -> its words' binding
    replaced: dict[int, g.Binding] = {}  # id(consumer var) -> the consumer reading words
    index = {id(b.var): k for k, b in enumerate(fn.bindings)}
    for k, b in enumerate(fn.bindings):
        convs = readers.get(id(b.var), [])
        if not (convs and len(convs) == uses[b.var] and id(b.var) not in returned
                and all(reads_words(cast(g.Call, c.value), block) for c in convs)):
            continue
        half = half_words(cast(g.Call, convs[0].value), block)
        pieces = None if half else _concat_pieces(fn.bindings, b.value, index, uses,
                                                  returned, block)
        if pieces is None and not _producer(fn.bindings, k, uses, block, half):
            continue
        shapes = [bf16_conv_shape([a.type for a in cast(g.Call, c.value).args],
                                  cast(g.Call, c.value).attrs) for c in convs]
        layouts = {(s.pads, flat_words((s.kh, s.kw), s.pads)) for s in shapes}
        if len(layouts) != 1:
            continue  # the consumers want different borders
        ((pads, flat),) = layouts
        rows = {HALF_WORDS: True} if half else {}
        if pieces is None:
            words = call(BF16_WORDS, b.var, pads=pads, flat=flat, **rows)
            var = g.Var(f"{b.var.name}_words", words.ret_type)
            after[id(b.var)] = g.Binding(var, words)
        else:  # each piece's producer stores its words into the concat of words
            for piece in pieces:
                piece_words = call(BF16_WORDS, piece, pads=pads, flat=flat)
                after[id(piece)] = g.Binding(g.Var(f"{piece.name}_words",
                                                   piece_words.ret_type), piece_words)
            words = call("concat", *(after[id(p)].var for p in pieces), axis=1)
            var = g.Var(f"{b.var.name}_words", words.ret_type)
            replaced[id(b.var)] = g.Binding(var, words)
        for c, shape in zip(convs, shapes, strict=True):
            conv = cast(g.Call, c.value)
            replaced[id(c.var)] = g.Binding(c.var, call(
                CONV_BF16, var, *conv.args[1:], **dict(conv.attrs),
                **{WORDS_INPUT: (shape.h, shape.w)}, **rows))
    if replaced:
        bindings: list[g.Binding] = []
        for b in fn.bindings:
            bindings.append(replaced.get(id(b.var), b))
            if id(b.var) in after:
                bindings.append(after[id(b.var)])
        fn = g.Function(fn.params, tuple(bindings), fn.result, dict(fn.attrs))
    return read_pool_words(read_words(fn, isa, block, _producer), isa, block, _producer)


def words_tail(group: list[g.Binding], value: g.Expr) -> bool:
    """Whether `value` is the `bf16_words` of `group`'s last value and `group` a bfloat16
    convolution's, a channel scale's, a pool's or a depthwise layer's (the kernel stores
    the words: FuseOps joins it to the group)."""
    first = group[0].value
    return (isinstance(value, g.Call) and value.op == BF16_WORDS
            and value.args[0] is group[-1].var
            and isinstance(first, g.Call) and first.op in _WORD_HEADS)
