"""CUDA device code generation (docs/gpu.md). So far: PTX from LLVM IR (`emit_ptx`)."""

from kiln.codegen.cuda.ptx import NVPTX_TRIPLE, emit_ptx

__all__ = ["NVPTX_TRIPLE", "emit_ptx"]
