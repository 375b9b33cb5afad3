"""kiln.kernels.gemm: the float32 matrix-product kernels.

- `micro_kernel`: the register-tile micro-kernel over packed B panels and its tile rule;
- `schedule`, `loop_nest`: one GEMM loop nest's choices (`GemmSchedule`) and its
  variants (`gemm_body`);
- `run_time_pack`: B packed into panels at run time (an activation);
- `families`: the `gemm` and `gemm_tiled` kernel families (`matmul_packed`,
  `matmul_tiled`); `gemv`, `gemv_family`: the matrix-vector kernel and its family
  (`matmul_gemv`);
- `mlas_order`: a GEMM summed in MLAS's order (kiln.ops.quant_mlas_conv);
- `lowering`, `cblas`: the lowerings of the products (kiln.kernels.lowering.LOWERINGS).

The ops (meaning, type rule, reference) are kiln.ops.gemm and kiln.ops.cblas; the
tile, K blocking and K unroll knobs kiln.kernels.gemm.knobs.
"""
