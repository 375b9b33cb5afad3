"""bfloat16 words into a max pool: its producer stores them, the pool reads them.

ResNet's stem (a 7x7 bfloat16 convolution and ReLU, 64 channels at 112x112) writes 3.2 MB
of float32 that its max pool reads back, past the L2; OpenVINO's pool reads the stem's
bfloat16 output, half that (docs/performance.md, rounds twenty-nine and thirty-one). Where
a `pool2d_nchwc` max pool's input is a float32 value of an even count of 16-lane blocks,
read by the pool alone, larger than the L2 per image, and closing a group whose head may
store words of pairs of blocks (kiln.transform.bf16_words `_producer`), the producer
stores them as one row of positions (`bf16_words` `flat`) and the pool reads them
(attribute `words_input`, kiln.ops.pool_nchwc; kiln.kernels.pool.nchwc): half the
bytes on both sides. The pool's input is then rounded to bfloat16, as OpenVINO's bf16
activations are; a max of rounded values is the rounded max, so the pool's output is
the float32 one rounded to bfloat16.
"""

from __future__ import annotations

from collections import Counter
from typing import cast

from kiln.ir import graph as g
from kiln.ir.analysis.graph_uses import var_use_counts
from kiln.ir.types import TensorType
from kiln.ops import call
from kiln.ops import conv_bf16 as cv
from kiln.ops.pool_nchwc import POOL_NCHWC
from kiln.target.isa import ISA
from kiln.transform.bf16_depthwise_words import Producer, large_blocks
from kiln.transform.splice import splice


def read_pool_words(fn: g.Function, isa: ISA, block: int, producer: Producer) -> g.Function:
    """`fn` with each qualifying max pool (module docstring) reading its input's words;
    `producer` tells whether a binding's group may store them."""
    uses: Counter[g.Var] = var_use_counts(fn)
    results = fn.result.fields if isinstance(fn.result, g.Tuple) else (fn.result,)
    returned = {id(r) for r in results}
    index = {id(b.var): k for k, b in enumerate(fn.bindings)}
    after: dict[int, g.Binding] = {}
    replaced: dict[int, g.Binding] = {}
    for b in fn.bindings:
        pool = b.value
        if not (isinstance(pool, g.Call) and pool.op == POOL_NCHWC
                and pool.attrs.get("pool") == "max_pool2d"
                and cv.WORDS_INPUT not in pool.attrs):
            continue
        x = pool.args[0]
        k = index.get(id(x))
        if not (isinstance(x, g.Var) and k is not None and uses[x] == 1
                and id(x) not in returned and large_blocks(x.type, block, isa)
                and producer(fn.bindings, k, uses, block, False)):
            continue
        words = call(cv.BF16_WORDS, x, pads=(0, 0, 0, 0), flat=True)
        var = g.Var(f"{x.name}_words", words.ret_type)
        after[id(x)] = g.Binding(var, words)
        shape = cast(TensorType, x.type).shape
        replaced[id(b.var)] = g.Binding(b.var, call(
            POOL_NCHWC, var, **dict(pool.attrs),
            **{cv.WORDS_INPUT: (int(cast(int, shape[2])), int(cast(int, shape[3])))}))
    if not replaced:
        return fn
    bindings = splice(fn.bindings, set(), {k: (v,) for k, v in replaced.items()}, after)
    return g.Function(fn.params, tuple(bindings), fn.result, dict(fn.attrs))
