"""kiln's hand-built CPU kernels, one module per family, chosen through one registry.

- `tiles`: the pieces every kernel is built of (register-tile loops, multiply-adds,
  the parallel tile loop and its work threshold, lanes and registers from the ISA);
- `registry`: `KERNELS`, the families by name, and `select(call, isa)`, which both
  the blocking passes (kiln.transform.matmul_blocking, conv_blocking, nchwc_layout)
  and legalization (`family_of(op)`) use;
- one module per family (`gemm`, `gemv`, `conv_direct`, `conv_rows`,
  `conv_depthwise`, `nchwc`), each with `applies(call, isa)`, `pack(call, isa)`
  (the rewritten call: packed weight, and the tile recorded in its `tile`
  attribute) and `build(...)` (the kernel, reading the recorded tile).

docs/performance.md, "The ISA object and the kernel registry", says what decides a
tile and how to add a family.
"""
