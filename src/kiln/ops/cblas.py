"""`cblas_matmul`: a float32 matrix product computed by the system's CBLAS.

On a target with `libs: ["cblas"]` the `use-cblas` graph pass
(kiln.transform.use_cblas) rewrites a float32 `matmul` whose B is one matrix
(`[K, N]`, or `[N, K]` with `transpose_b`) into this op: A's leading
dimensions are rows of one `cblas_sgemm` call (row-major), so an MLP layer or a
transformer projection is a single call. The kernel (kiln.kernels.gemm.cblas) is a
`call_extern` with the external dependency `cblas` (Debian's OpenBLAS:
`-lopenblas`), which the library metadata, Model Library Format archives and the
link step carry. `cblas_sgemm` returns nothing; the call is made for its effect and
its (absent) result is never read; kiln's interpreter runs it with
`_sgemm_reference`.

Whether a product calls the library is a tuning choice (`LIBRARY_CHOICE`, a
kiln.kernels.search.KernelChoice recorded as the pseudo-kernel `cblas_matmul`):
`use-cblas` asks the tuning session (kiln.tuning.apply) for each product it would
rewrite; `{"library": "cblas"}` is the rule's, `{"library": "own"}` leaves the product
to kiln's GEMM families (packed by their rule).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.errors import IRError, UsageError
from kiln.ir import graph as g
from kiln.ir.evaluate import register_extern_reference
from kiln.ir.tensor import ExternDependency
from kiln.ir.types import TensorType, Type
from kiln.ops import te
from kiln.ops.nn import matmul_compute, matmul_infer, matmul_ref
from kiln.ops.registry import OPS, OpDef
from kiln.target.isa import ISA

NAME = "cblas_matmul"
CBLAS = ExternDependency(short_name="cblas", version_spec=">=0.3",
                         url="https://www.openblas.net", url_type="url",
                         libs=("-lopenblas",))
# CBLAS enumerations (cblas.h): CblasRowMajor, CblasNoTrans, CblasTrans.
ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112


def supports(a: TensorType, b: TensorType, attrs: Mapping[str, Any]) -> bool:
    """Whether `matmul(a, b, **attrs)` is a float32 product with one B matrix."""
    return (a.dtype == b.dtype == "float32" and len(a.shape) >= 2 and len(b.shape) == 2
            and all(isinstance(d, int) and d > 0 for d in (*a.shape, *b.shape)))


#: The library choice's parameter and its values: the rule's first.
LIBRARY = "library"
LIBRARIES = ("cblas", "own")


@dataclass(frozen=True)
class LibraryChoice:
    """Whether a product `use-cblas` would rewrite calls CBLAS (the rule) or kiln's own
    GEMM: the tuning knob of the pseudo-kernel `cblas_matmul`, keyed by the source
    `matmul`'s signature (a kiln.kernels.search.KernelChoice)."""

    name: str = NAME

    def rule_params(self, call: g.Call, isa: ISA) -> dict[str, Any]:
        """The rule: the library."""
        return {LIBRARY: LIBRARIES[0]}

    def other_params(self, call: g.Call, isa: ISA) -> list[dict[str, Any]]:
        """Kiln's own kernels (the same product, as the GEMM families' rule packs it)."""
        return [{LIBRARY: lib} for lib in LIBRARIES[1:]]

    def kernel_params(self, call: g.Call, isa: ISA) -> dict[str, Any]:
        """Kiln's own kernels: the GEMM families take the product (and their tiles are
        tuned)."""
        return {LIBRARY: "own"}

    def calls_library(self, params: Mapping[str, Any] | None) -> bool:
        """Whether `params` (a tuning session's answer; None: the rule's) say CBLAS."""
        if params is None:
            return True
        if set(params) != {LIBRARY} or params[LIBRARY] not in LIBRARIES:
            raise UsageError(f"{NAME} params {dict(params)!r}: only "
                             f"{{{LIBRARY!r}: one of {', '.join(map(repr, LIBRARIES))}}}")
        return bool(params[LIBRARY] == LIBRARIES[0])


LIBRARY_CHOICE = LibraryChoice()


def _infer(types: Sequence[TensorType], attrs: Mapping[str, Any]) -> Type:
    return matmul_infer(types, attrs)


def _compute(inputs: Sequence[te.Tensor], attrs: Mapping[str, Any]) -> te.Tensor:
    return matmul_compute(inputs, attrs)


def _sgemm_reference(order: int, trans_a: int, trans_b: int, m: int, n: int, k: int,
                     alpha: float, a: np.ndarray, lda: int, b: np.ndarray, ldb: int,
                     beta: float, c: np.ndarray, ldc: int) -> int:
    """What cblas_sgemm computes (row-major), on the flat buffers: kiln's interpreter
    runs `cblas_matmul` kernels with it."""
    if order != ROW_MAJOR or trans_a != NO_TRANS:
        raise IRError("cblas_sgemm reference: only row-major, untransposed A")
    am = a[:m * lda].reshape(m, lda)[:, :k].astype(np.float64)
    rows, cols = (n, k) if trans_b == TRANS else (k, n)
    bm = b[:rows * ldb].reshape(rows, ldb)[:, :cols].astype(np.float64)
    if trans_b == TRANS:
        bm = bm.T
    cm = c[:m * ldc].reshape(m, ldc)
    product = alpha * (am @ bm)
    # beta == 0: C is not read (it may hold anything, NaN included), as in CBLAS.
    cm[:, :n] = (product if beta == 0 else product + beta * cm[:, :n]).astype(np.float32)
    return 0


register_extern_reference(
    "cblas_sgemm", ("int", "int", "int", "int", "int", "int", "float32", "buffer", "int",
                    "buffer", "int", "float32", "buffer", "int"), None, _sgemm_reference)
OPS.register(NAME, OpDef(NAME, "opaque", _infer, _compute, matmul_ref))

__all__ = ["CBLAS", "LIBRARIES", "LIBRARY", "LIBRARY_CHOICE", "NAME", "LibraryChoice",
           "supports"]
