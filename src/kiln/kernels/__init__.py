"""kiln.kernels: the hand-built CPU kernels, between the ops (what an operator means)
and the passes (which choose and place kernels).

An operator's meaning lives in kiln.ops (`OpDef`: type rule, tensor-expression compute,
numpy reference); its target-tuned kernel lives here, registered by the operator's
name in `LOWERINGS` (kiln.kernels.lowering): `lowering_for(op)` is the one door through
which legalization and fusion (kiln.transform) ask for a hand-built kernel, always with
the target's ISA as an argument. An op without a lowering gets its tensor-expression
definition on every target.

- `lowering`: `LOWERINGS` and `lowering_for(op)`, the one door (above);
- `registry`: `KERNELS`, the kernel families by name, and `select(call, isa)`, which
  the blocking passes (kiln.transform.matmul_blocking, conv_blocking, nchwc_layout) and
  quantize-ops use to rewrite a call into a family's packed op (its weight packed, its
  register tile recorded in the `tile` attribute, kiln.ops.packed_attrs); `search`:
  the variants tuning may choose instead of the rule's;
- the pieces every kernel is built of: `tiles` (register-tile loops, multiply-adds,
  the parallel tile loop), `parallel_work` (when a loop is worth the thread pool),
  `epilogue` and `flat_epilogue` (the fused elementwise tail), `prefetch`, `math`
  (exp, tanh, erf as arithmetic), `window_symbolic` (windows over symbolic images);
- one subpackage per kind of kernel: `gemm`, `conv`, `int8`, `rows`, `pool`.

docs/performance.md, "The ISA object and the kernel registry", says what decides a
tile and how to add a family.
"""

from kiln.kernels.lowering import LOWERINGS, Lowering, legalize_call, lowering_for

__all__ = ["LOWERINGS", "Lowering", "legalize_call", "lowering_for"]
