"""`FlatEpilogue`: a convolution's fused epilogue over the 4-D output index `(n, c, oh,
ow)` seen as one over `(n, c, p)`, `p = oh * OW + ow`, for kernels whose tiles hold runs
of consecutive positions of an NCHW output (the GEMM convolution, the blocked direct
kernel's NCHW stores): loads of tensors shaped like the output (a residual) become
loads at consecutive addresses along `p`."""

from __future__ import annotations

from kiln.ir.dtype import INDEX_DTYPE
from kiln.ir.shape_expr import shapes_equal
from kiln.ir.tensor import Buffer, DeclBuffer, Load, PrimExpr, Stmt, Var
from kiln.ir.visitor import StmtExprMutator, iter_exprs, substitute
from kiln.kernels.tiles import Epilogue, const


class FlatEpilogue:
    """A 4-D `(n, c, oh, ow)` epilogue as one over `(n, c, p)`, `p = oh * OW + ow`.

    A load in it at `(..., oh, ow)` of a buffer whose last dims are the output's
    `(OH, OW)` becomes a load of a view merging them, at `(..., p)`; any other use of
    `oh`/`ow` gets `p // OW`, `p % OW`. `decls` declares the views (put them before the
    kernel that calls the epilogue)."""

    def __init__(self, epilogue: Epilogue, out_h: int, out_w: int) -> None:
        self.epilogue = epilogue
        self.out_h, self.out_w = out_h, out_w
        self.oh, self.ow = Var("oh", INDEX_DTYPE), Var("ow", INDEX_DTYPE)
        self.views: dict[Buffer, Buffer] = {}
        self.decls: list[Stmt] = []

    def view(self, buf: Buffer) -> Buffer:
        if buf not in self.views:
            flat = Buffer(f"{buf.name}_flat", (*buf.shape[:-2], self.out_h * self.out_w),
                          buf.dtype)
            self.views[buf] = flat
            self.decls.append(DeclBuffer(flat, buf, 0))
        return self.views[buf]

    def merges(self, load: Load) -> bool:
        """Whether `load` reads a tensor shaped like the output at `(..., oh, ow)`: the
        loads this epilogue reads through a flat view."""
        return (len(load.indices) >= 2 and load.indices[-2] is self.oh
                and load.indices[-1] is self.ow
                and shapes_equal(load.buffer.shape[-2:], (self.out_h, self.out_w)))

    def reads_output_shaped(self) -> bool:
        """Whether the epilogue loads a tensor shaped like the output (a residual Add's
        other operand), asked of the 4-D epilogue without building the flat one."""
        expr = self.epilogue(Var("value", "float32"), (const(0), const(0), self.oh, self.ow))
        return any(isinstance(e, Load) and self.merges(e) for e in iter_exprs(expr))

    def __call__(self, value: PrimExpr, idx: tuple[PrimExpr, ...]) -> PrimExpr:
        n, c, p = idx
        expr = _Flatten(self, p).visit_expr(self.epilogue(value, (n, c, self.oh, self.ow)))
        one_row = isinstance(self.out_h, int) and self.out_h == 1
        h: PrimExpr = const(0) if one_row else p // self.out_w
        w: PrimExpr = p if one_row else p % self.out_w
        return substitute(expr, {self.oh: h, self.ow: w})


class _Flatten(StmtExprMutator):
    def __init__(self, flat: FlatEpilogue, p: PrimExpr) -> None:
        self.flat, self.p = flat, p

    def visit_load(self, e: Load) -> PrimExpr:
        f = self.flat
        if f.merges(e):
            head = tuple(self.visit_expr(i) for i in e.indices[:-2])
            return Load(f.view(e.buffer), (*head, self.p))
        return super().visit_load(e)
