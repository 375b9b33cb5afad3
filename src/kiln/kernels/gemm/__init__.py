"""kiln.kernels.gemm: the float32 matrix-product kernels (the GEMM micro-kernel and its
families, the matrix-vector kernel, a GEMM summed in MLAS's order)."""
