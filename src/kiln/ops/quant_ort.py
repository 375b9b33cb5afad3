"""onnxruntime's view of a QDQ graph: the integer type it gives each quantized tensor.

On x86, onnxruntime's CPU graph optimizer runs a QDQ model's int8 activations as uint8
where it can, then fuses a DequantizeLinear -> op -> QuantizeLinear group into its
integer kernel only if the group's types fit that kernel; the other groups stay
dequantize, float op, quantize (docs/quantization.md, "Files quantized by others").
kiln fuses the same groups (kiln.transform.quantize_ops), so this module answers the one
question those rules need: which type onnxruntime's kernel sees for a quantized tensor.

- `QDQS8ToU8Transformer` turns an int8 QuantizeLinear -> DequantizeLinear pair into
  uint8 (both zero points + 128, the values shifted by 128: the same dequantized
  numbers) when the QuantizeLinear's only consumer is that DequantizeLinear: the
  QuantizeLinear as a graph output, or a second reader of the DequantizeLinear (its
  `EnsureUniqueDQForNodeUnit` first gives every consumer a DequantizeLinear of its own,
  and a graph output too when the DequantizeLinear also has a consumer, so the
  QuantizeLinear then has several) keeps the pair int8. Both zero points must be equal
  constant scalars.
- The selectors then fuse a convolution or MatMul only with uint8 activations in and out
  (int8 ones are not allowed on x86), a Gemm with int8 activations too when its weight is
  int8, and Add, Mul, the pools, Softmax and Concat when every quantized operand and the
  output have one type.

Constant weights keep their type (onnxruntime 1.32 converts no int8 weight read by a
DequantizeLinear in its default session).
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from kiln.ir import graph as g
from kiln.ir.types import TensorType


class OrtTypes:
    """The integer types onnxruntime gives the quantized tensors of one graph function."""

    def __init__(self, defs: dict[g.Var, g.Expr], uses: Counter[g.Var],
                 outputs: frozenset[g.Var]) -> None:
        self.defs = defs
        self.uses = uses
        self.outputs = outputs
        self.readers: dict[g.Var, list[g.Call]] = {}
        for value in defs.values():
            if isinstance(value, g.Call):
                for arg in value.args:
                    if isinstance(arg, g.Var):
                        self.readers.setdefault(arg, []).append(value)
        self.vars = {id(value): var for var, value in defs.items()}

    @classmethod
    def of(cls, func: g.Function, uses: Counter[g.Var]) -> OrtTypes:
        """The view of `func` (`uses`: its use counts)."""
        result = func.result
        items = result.fields if isinstance(result, g.Tuple) else (result,)
        return cls({b.var: b.value for b in func.bindings}, uses,
                   frozenset(e for e in items if isinstance(e, g.Var)))

    def var_of(self, call: g.Call) -> g.Var | None:
        """The variable `call` is bound to, if any."""
        return self.vars.get(id(call))

    def runs_as_uint8(self, q: g.Var) -> bool:
        """Whether the int8 QuantizeLinear bound to `q` and its DequantizeLinear become
        uint8 (the module docstring's rule)."""
        call = self.defs.get(q)
        if not (isinstance(call, g.Call) and call.op == "quantize_linear"
                and _int8_scalar(call.args[2])) or call.attrs.get("block_size") \
                or q in self.outputs or self.uses[q] != 1:
            return False
        (reader,) = self.readers.get(q, [None])
        if reader is None or reader.op != "dequantize_linear" or reader.args[0] is not q \
                or not _int8_scalar(reader.args[2]) \
                or _value(reader.args[2]) != _value(call.args[2]):
            return False
        # one reader of the DequantizeLinear, or none but the graph's output: it stays
        # one node (more, or one and the output, and each consumer gets a copy)
        dq = self.var_of(reader)
        return dq is not None and self.uses[dq] <= 1

    def stored(self, data: g.Expr) -> str | None:
        """The type onnxruntime's kernels see for `data`, the input of a DequantizeLinear:
        uint8 for a converted int8 pair, else `data`'s own dtype (None: not a tensor)."""
        if isinstance(data, g.Var) and self.runs_as_uint8(data):
            return "uint8"
        return data.type.dtype if isinstance(data.type, TensorType) else None

    def output(self, q: g.Call) -> str | None:
        """The type onnxruntime's kernel writes for the QuantizeLinear call `q`."""
        var = self.var_of(q)
        if var is not None and self.runs_as_uint8(var):
            return "uint8"
        return q.type.dtype if isinstance(q.type, TensorType) else None


def _int8_scalar(e: g.Expr) -> bool:
    return isinstance(e, g.Constant) and e.data.dtype == np.int8 and e.data.size == 1


def _value(e: g.Expr) -> int:
    assert isinstance(e, g.Constant)
    return int(np.asarray(e.data).reshape(()))
