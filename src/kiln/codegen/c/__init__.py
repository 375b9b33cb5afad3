"""The `c` backend: readable C99 kernels plus the shared host entry points.

    from kiln.codegen.c import codegen_c
    artifacts = codegen_c(lowered_mod, Target("c"), prefix="kiln_", pool=pool)

See docs/codegen-c.md for the IR-to-C mapping, the flags and the error codes.
"""

from kiln.codegen.c.codegen import codegen_c, emit_kernels

__all__ = ["codegen_c", "emit_kernels"]
