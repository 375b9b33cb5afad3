"""State shared while printing one translation unit and one kernel."""

from __future__ import annotations

from dataclasses import dataclass, field

from kiln.codegen.c.externs import ExternTable
from kiln.codegen.cfamily.dialect import C_DIALECT, CDialect
from kiln.codegen.cfamily.helpers import Helpers
from kiln.codegen.cfamily.printer import NameScope
from kiln.codegen.cfamily.signature import ParamQualifiers
from kiln.codegen.constants import ConstantPool
from kiln.codegen.naming import C_TYPE_NAMES
from kiln.errors import CompileError
from kiln.ir import dtype as dt
from kiln.ir.module import IRModule
from kiln.ir.outlined import Launch
from kiln.ir.tensor import Buffer, CallFunc, Var

# The value an allocation failure returns from a kernel; host.c turns it into
# "out of memory allocating a workspace of N bytes" (docs/codegen-c.md).
STATUS_OUT_OF_MEMORY = 1


def value_ctype(dtype: str) -> str:
    """The C type an expression of `dtype` computes in (16-bit floats: float)."""

    if dtype in ("float16", "bfloat16"):
        return "float"
    return C_TYPE_NAMES[dt.check_dtype(dtype)]


@dataclass
class BufferRef:
    """How the kernel names a buffer: a pointer or array `name`, read-only if `const`."""

    name: str
    const: bool = False


@dataclass
class ModuleContext:
    """What the translation unit needs besides the kernels: helpers, prototypes, macros."""

    mod: IRModule
    prefix: str
    pool: ConstantPool
    helpers: Helpers
    externs: ExternTable
    params: dict[str, ParamQualifiers]  # per kernel: written / restrict parameters
    macros: set[str] = field(default_factory=set)
    # Parallel loops outlined into loop-body kernels (kiln.ir.outlined).
    launches: dict[CallFunc, Launch] = field(default_factory=dict)
    # (dtype, lanes) of the vector types `vector` loops use (kiln.codegen.c.vector).
    vector_types: set[tuple[str, int]] = field(default_factory=set)
    uses_consts: bool = False
    # Kernels read constants' addresses from `{prefix}_const_table` (kiln.codegen.const_table).
    const_table: bool = False
    uses_malloc: bool = False
    dialect: CDialect = C_DIALECT  # the language printed (kiln.codegen.cfamily.dialect)


@dataclass
class FuncContext:
    """Names and buffers of the kernel being printed."""

    module: ModuleContext
    func_name: str
    names: NameScope
    vars: dict[Var, str] = field(default_factory=dict)
    buffers: dict[Buffer, BufferRef] = field(default_factory=dict)

    def error(self, message: str) -> CompileError:
        return CompileError(f"C codegen of '{self.func_name}': {message}")

    def var_name(self, var: Var) -> str:
        name = self.vars.get(var)
        if name is None:
            raise self.error(f"variable '{var.name}' is used outside the loop, let or "
                             "parameter list that binds it")
        return name

    def buffer(self, buf: Buffer) -> BufferRef:
        ref = self.buffers.get(buf)
        if ref is None:
            raise self.error(f"buffer '{buf.name}' is used outside the parameter list, "
                             "Allocate, AllocConst or DeclBuffer that declares it")
        return ref
