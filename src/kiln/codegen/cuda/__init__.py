"""CUDA device code generation (docs/gpu.md): kernels.cu, kernels.ptx, kernels.json and the
host's launch stubs, from kernels scheduled by bind-gpu-threads."""

from kiln.codegen.cuda.ptx import NVPTX_TRIPLE, emit_ptx

__all__ = ["NVPTX_TRIPLE", "emit_ptx"]
