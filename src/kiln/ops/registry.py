"""The operator registry: one `OpDef` per graph-level operator.

An operator's rules live together: type inference, the tensor-expression
definition that legalization lowers to a PrimFunc, and a numpy reference that
the interpreter and constant folding use. (The ONNX mapping lives in the frontend,
in kiln.frontend.onnx.converters: a module there beside each module here.)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln._registry import Registry
from kiln.errors import IRError
from kiln.ir import graph as g
from kiln.ir.pin_hint import pin_hint_for
from kiln.ir.shape_expr import is_static, shape_text, simplify_shape
from kiln.ir.tensor import PrimFunc
from kiln.ir.types import TensorType, TupleType, Type
from kiln.ops import te

# How an op may fuse (TVM's OpPattern): elementwise and broadcast ops fuse into
# their producer; "anchor" ops (conv, matmul) take an elementwise epilogue.
PATTERNS = ("elemwise", "broadcast", "injective", "reduce", "anchor", "opaque")

Attrs = Mapping[str, Any]
InferFn = Callable[[Sequence[TensorType], Attrs], Type]
ComputeFn = Callable[[Sequence[te.Tensor], Attrs], "te.Tensor | tuple[te.Tensor, ...]"]
ReferenceFn = Callable[..., Any]


@dataclass(frozen=True)
class OpDef:
    """A graph-level operator: its type rule, its lowering and its numpy reference."""

    name: str
    pattern: str
    infer: InferFn
    compute: ComputeFn
    reference: ReferenceFn
    #: Attributes whose tuple entries may be dimension texts (kiln.dim_expr) over the
    #: variables of the arguments' shapes: the interpreter (kiln.ir.evaluate) gives the
    #: reference their values; the type rule and the compute read them symbolically.
    dim_text_attrs: tuple[str, ...] = ()

    def infer_type(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        """The result type of a call with `arg_types`; IRError if an argument is no tensor."""
        tensors: list[TensorType] = []
        for k, t in enumerate(arg_types):
            if not isinstance(t, TensorType):
                raise IRError(f"operator {self.name}: argument {k} is {t}, not a tensor")
            tensors.append(t)
        if all(is_static(t.shape) for t in tensors):
            return self.infer(tensors, attrs)
        # Symbolic dimensions: a rule written for static shapes fails with a clear error
        # naming the op and the dimensions; results are kept canonical (shape_expr).
        try:
            out = self.infer(tensors, attrs)
        except (TypeError, ValueError, ArithmeticError, IRError) as exc:
            if isinstance(exc, IRError) and "is not static" not in str(exc):
                raise
            shapes = ", ".join(shape_text(t.shape) for t in tensors)
            raise IRError(f"operator {self.name} does not support symbolic dimensions "
                          f"(arguments {shapes}); "
                          f"{pin_hint_for(t.shape for t in tensors)}") from exc
        return _canonical(out)

    def legalize(self, call: g.Call) -> tuple[PrimFunc, str]:
        """The PrimFunc(inputs..., outputs...) computing `call`, and a name hint (the
        op's tensor-expression definition; a hand-built kernel is kiln.kernels')."""
        types = [_tensor_type(a.type) for a in call.args]
        inputs = [te.placeholder(t.shape, t.dtype, f"x{k}") for k, t in enumerate(types)]
        outs = self.compute(inputs, call.attrs)
        outputs = outs if isinstance(outs, tuple) else (outs,)
        return te.lower(inputs, outputs, self.name), self.name


def _canonical(t: Type) -> Type:
    if isinstance(t, TupleType):
        return TupleType(tuple(_canonical(f) for f in t.fields))
    return TensorType(simplify_shape(t.shape), t.dtype)


def _tensor_type(t: Type) -> TensorType:
    if not isinstance(t, TensorType):
        raise IRError(f"expected a tensor, got {t}")
    return t


OPS: Registry[OpDef] = Registry("operator")

#: Operators whose all-constant calls the ONNX importer keeps as calls rather than
#: folding: a dequantized weight stays `dequantize_linear(int8 constant)` so the
#: quantize-ops pass can fuse it into an integer kernel (kiln.transform.quantize_ops);
#: fold-constants folds the ones it leaves in float.
KEPT_AT_IMPORT = frozenset({"dequantize_linear"})


def register_op(name: str, *, pattern: str, infer: InferFn, compute: ComputeFn,
                reference: ReferenceFn, dim_text_attrs: tuple[str, ...] = ()) -> OpDef:
    """Register the operator `name`: its fusion `pattern` (one of PATTERNS), type rule,
    lowering and numpy reference (`dim_text_attrs`: see OpDef). A duplicate name raises
    RegistryError.
    """
    if pattern not in PATTERNS:
        raise IRError(f"unknown op pattern {pattern!r}; known: {', '.join(PATTERNS)}")
    op = OpDef(name, pattern, infer, compute, reference, dim_text_attrs)
    OPS.register(name, op)
    return op


def get_op(name: str) -> OpDef:
    """The OpDef of `name` (built-in operators are loaded on first use)."""
    load_builtin_ops()
    return OPS.get(name)


def list_ops() -> list[str]:
    """The names of all registered operators, sorted."""
    load_builtin_ops()
    return OPS.names()


def call(op: str, *args: g.Expr, **attrs: Any) -> g.Call:
    """A graph `Call` of `op` with its result type inferred."""
    opdef = get_op(op)
    frozen = g.freeze_attrs(attrs)
    return g.Call(op, tuple(args), frozen, opdef.infer_type([a.type for a in args], frozen))


def evaluate_call(op: str, args: Sequence[np.ndarray], attrs: Attrs) -> Any:
    """Run the numpy reference of `op` (constant folding, the interpreter)."""
    return get_op(op).reference(*args, **dict(attrs))


_LOADED = False


def load_builtin_ops() -> None:
    """Register the built-in operators (kiln.ops.builtin) once, on first lookup."""
    global _LOADED
    if not _LOADED:
        _LOADED = True
        import kiln.ops.builtin  # lazy: loaded on first use (registry)  # noqa: F401  (registers the built-in operators)


def result_types(t: Type) -> tuple[TensorType, ...]:
    """The tensor types of a call's results: the fields of a tuple type, or the one type."""
    if isinstance(t, TupleType):
        return tuple(_tensor_type(f) for f in t.fields)
    return (_tensor_type(t),)
