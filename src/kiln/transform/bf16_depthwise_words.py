"""bfloat16 words into a depthwise layer: its producer stores them, the layer reads them.

kiln.transform.bf16_words has a depthwise layer store its projection's words; its input
stays float32. On a large image (MobileNetV2's 112x112 layers: the 16 > 96 expansion
writes 4.8 MB of float32 that its depthwise layer reads back, past the L2) the producer
(a bfloat16 convolution, with its ReLU6) instead stores the words of pairs of its blocks,
one row of positions (`bf16_words` `flat`, kiln.ops.conv_bf16: a 1x1 tile's positions
cross image rows), and the depthwise layer reads them
(attribute `words_input`, kiln.ops.conv_nchwc_depthwise): half the bytes on both sides.
The depthwise layer's input is then rounded to bfloat16, as OpenVINO's bf16 activations
are; the layer still sums in float32.

Taken where the depthwise layer already stores words of pairs of blocks (its tiles sum
both blocks of a pair: one word row read for both), its input is an even count of
blocks read by it alone, whose float32 bytes per image exceed the target's L2
(smaller images were level or slower: docs/performance.md, round twenty-seven), and
the input's producer may store words (kiln.transform.bf16_words `_producer`), or is a
1x1 bfloat16 convolution whose channel tile, an odd count of blocks, is repacked to an
even one (`_paired`). In MobileNetV2: the stem (32 channels) and the 16 > 96 expansion
(3 vectors a tile, repacked to 2), both at 112x112.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import cast

import numpy as np

from kiln.ir import graph as g
from kiln.ir import weight_origin as wo
from kiln.ir.analysis.graph_uses import var_use_counts
from kiln.ir.types import TensorType
from kiln.kernels.conv.nchwc import pointwise_fits, pointwise_tile
from kiln.kernels.tiles import tile_lanes
from kiln.ops import call
from kiln.ops import conv_bf16 as cv
from kiln.ops.conv_direct import NCHW_INPUT_BLOCK
from kiln.ops.conv_nchwc_depthwise import NCHWC_DEPTHWISE
from kiln.ops.packed_attrs import TILE
from kiln.target.isa import ISA
from kiln.transform.fuse_rule import MAX_FUSED_OPS, chain
from kiln.transform.splice import splice

#: Whether binding `k`'s group may store words (`bindings`, `k`, the uses, the block,
#: words of half blocks).
Producer = Callable[[Sequence[g.Binding], int, Counter[g.Var], int, bool], bool]


def large_blocks(t: object, block: int, isa: ISA, half: bool = False) -> bool:
    """Whether `t` is a float32 NCHW{block}c value of static sizes and an even count of
    blocks (any count for words of `half` blocks), one image of which exceeds the L2."""
    if not (isinstance(t, TensorType) and t.dtype == "float32" and t.ndim == 5
            and all(isinstance(d, int) for d in t.shape[1:]) and t.shape[4] == block
            and (half or cast(int, t.shape[1]) % 2 == 0)):
        return False
    size = 4
    for d in t.shape[1:]:
        size *= cast(int, d)
    return size > isa.l2_bytes


def _paired(bindings: Sequence[g.Binding], k: int, uses: Counter[g.Var],
            isa: ISA) -> tuple[int, g.Binding] | None:
    """Where binding `k` closes the group of a 1x1 bfloat16 convolution whose channel tile
    is an odd count of blocks (MobileNetV2's 16 > 96 expansion: 3 vectors), the index of
    that convolution and its call repacked to an even count (`pointwise_tile`'s `even`):
    its tiles then hold whole pairs of blocks, whose words they can store."""
    j = chain(bindings, k, uses, cv.CONV_BF16, MAX_FUSED_OPS - 1)
    conv = None if j is None else bindings[j].value
    if not (isinstance(conv, g.Call) and isinstance(conv.args[1], g.Constant)):
        return None
    wp = np.asarray(conv.args[1].data)
    block = tile_lanes(isa)
    shape = cv.bf16_conv_shape([a.type for a in conv.args], conv.attrs)
    if int(wp.shape[4]) % (2 * block) == 0 or (shape.kh, shape.kw) != (1, 1) or cv.ROW_TAPS in \
            conv.attrs or NCHW_INPUT_BLOCK in conv.attrs:
        return None
    tile = pointwise_tile(shape.c_out, shape.out_h * shape.out_w, isa, even=True)
    if tile is None or tile[0] % (2 * block):
        return None
    # the most positions whose accumulators fit (2 x 10, not the rule's 2 x 8: the
    # 16 > 96 @112 expansion took 119 against 174 us; docs/performance.md, round thirty)
    vectors = tile[0] // block
    tile = (tile[0], max(w for w in range(tile[1], 4 * tile[1])
                         if pointwise_fits(vectors, w, isa)))
    packed = cv.pack_conv_bf16(cv.unpack_conv_weight(wp, conv.attrs, block), tile[0], block)
    new = call(cv.CONV_BF16, conv.args[0], g.Constant(packed, conv.args[1].name),
               *conv.args[2:], **{**dict(conv.attrs), TILE: tile})
    assert j is not None
    return j, g.Binding(bindings[j].var, new)


def _scalar_tail(bindings: Sequence[g.Binding], index: dict[int, int], k: int,
                 j: int) -> bool:
    """Whether the ops from binding `j`'s value to binding `k`'s (a group's epilogue)
    read nothing but the value before them and scalar constants (a ReLU6: the same for
    every channel, as a kernel summing lanes in another order needs)."""
    while k != j:
        value = bindings[k].value
        if not isinstance(value, g.Call):
            return False
        chained = [a for a in value.args if not (isinstance(a, g.Constant) and a.data.size <= 1)]
        if len(chained) != 1 or id(chained[0]) not in index:
            return False
        k = index[id(chained[0])]
    return True


def _halves_call(dw: g.Call, block: int) -> g.Call | None:
    """`dw` (a depthwise layer of whole blocks, its weight and bias constants) with its
    weight and bias in the lane order of words of half blocks (kiln.ops.conv_nchwc_depthwise
    `halves_order`), the order its kernel reads them in; None where it does not qualify."""
    if int(cast(int, dw.attrs["channels"])) % block or not all(
            isinstance(a, g.Constant) for a in dw.args[1:]):
        return None
    consts = [_halves_lanes(cast(g.Constant, a), block) for a in dw.args[1:]]
    return call(NCHWC_DEPTHWISE, dw.args[0], *consts, **dict(dw.attrs))


def _halves_lanes(c: g.Constant, block: int) -> g.Constant:
    """The constant `c` (`[...][block]` lanes last) with each block's lanes in
    `halves_order`: lane `2a + h` holds channel `a + h * block / 2` (a reshape, a
    transpose and a reshape, replayed as such on swapped weights)."""
    data = np.asarray(c.data)
    shape = data.shape if data.ndim > 1 else (data.size // block, block)
    split = (*shape[:-1], 2, block // 2)
    perm = (*range(len(shape) - 1), len(shape), len(shape) - 1)
    out = np.ascontiguousarray(data.reshape(split).transpose(perm)).reshape(data.shape)
    origin = wo.step("reshape", wo.step("transpose", wo.step(
        "reshape", wo.origin_of(c.data), shape=split), perm=perm), shape=data.shape)
    reordered = g.Constant(out, c.name)
    wo.record(reordered.data, origin)  # the constant's own (read-only) array
    return reordered


def read_words(fn: g.Function, isa: ISA, block: int, producer: Producer) -> g.Function:
    """`fn` with each qualifying depthwise layer (module docstring) reading its input's
    words; `producer` tells whether a binding's group may store them."""
    uses: Counter[g.Var] = var_use_counts(fn)
    results = fn.result.fields if isinstance(fn.result, g.Tuple) else (fn.result,)
    returned = {id(r) for r in results}
    index = {id(b.var): k for k, b in enumerate(fn.bindings)}
    heads: dict[int, bool] = {}  # the depthwise layers whose group stores words: half?
    for b in fn.bindings:
        v = b.value
        if isinstance(v, g.Call) and v.op == cv.BF16_WORDS and id(v.args[0]) in index:
            j = chain(fn.bindings, index[id(v.args[0])], uses, NCHWC_DEPTHWISE,
                      MAX_FUSED_OPS - 1)
            if j is not None:
                half = bool(v.attrs.get(cv.HALF_WORDS))
                if not half or _scalar_tail(fn.bindings, index, index[id(v.args[0])], j):
                    heads[j] = half
    after: dict[int, g.Binding] = {}
    replaced: dict[int, g.Binding] = {}
    for j, half in sorted(heads.items()):
        b = fn.bindings[j]
        dw = cast(g.Call, b.value)
        if cv.WORDS_INPUT in dw.attrs:
            continue
        x = dw.args[0]
        k = index.get(id(x))
        if not (isinstance(x, g.Var) and k is not None and uses[x] == 1
                and id(x) not in returned and large_blocks(x.type, block, isa, half)):
            continue
        if half:
            halved = _halves_call(dw, block)
            if halved is None or not producer(fn.bindings, k, uses, block, True):
                continue
            dw = halved
        elif not producer(fn.bindings, k, uses, block, False):
            repacked = _paired(fn.bindings, k, uses, isa)
            trial = list(fn.bindings)
            if repacked is not None:
                trial[repacked[0]] = repacked[1]
            if repacked is None or not producer(trial, k, uses, block, False):
                continue
            replaced[id(repacked[1].var)] = repacked[1]
        rows = {cv.HALF_WORDS: True} if half else {}
        words = call(cv.BF16_WORDS, x, pads=(0, 0, 0, 0), flat=True, **rows)
        var = g.Var(f"{x.name}_words", words.ret_type)
        after[id(x)] = g.Binding(var, words)
        shape = cast(TensorType, x.type).shape
        replaced[id(b.var)] = g.Binding(b.var, call(
            NCHWC_DEPTHWISE, var, *dw.args[1:], **dict(dw.attrs), **rows,
            **{cv.WORDS_INPUT: (int(cast(int, shape[2])), int(cast(int, shape[3])))}))
    if not replaced:
        return fn
    bindings = splice(fn.bindings, set(), {k: (v,) for k, v in replaced.items()}, after)
    return g.Function(fn.params, tuple(bindings), fn.result, dict(fn.attrs))
