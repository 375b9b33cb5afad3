"""Helpers for the C backend tests: build kernels.c + host.c into a .so, call it via ctypes.

Independent of kiln.runtime on purpose: these tests check the generated C and
the packed ABI with nothing in between. Every C file is compiled with
`-Wall -Wextra -Werror -pedantic` on top of the artifact's own cflags.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kiln.codegen.c import codegen_c
from kiln.codegen.constants import ConstantPool
from kiln.ir import IRModule
from kiln.ir import dtype as dt
from kiln.runtime.abi import dl_type
from kiln.transform.outline import OutlineParallelLoops

CC = os.environ.get("CC", "cc")
WARNINGS = ("-Wall", "-Wextra", "-Werror", "-pedantic")
PREFIX = "kiln_"

ARG_INT, ARG_FLOAT, ARG_DLTENSOR = 0, 2, 7


def have_cc() -> bool:
    return shutil.which(CC) is not None


# ------------------------------------------------------------------ ctypes mirrors


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
        ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64),
    ]


class KilnValue(ctypes.Union):
    _fields_ = [("v_int64", ctypes.c_int64), ("v_float64", ctypes.c_double),
                ("v_handle", ctypes.c_void_p)]


@dataclass
class Tensor:
    """A hand-built DLTensor and the objects it points into."""

    struct: DLTensor
    keep: list[Any]


def tensor(arr: np.ndarray | None, *, device_type: int = 1, ndim: int | None = None,
           shape: Sequence[int] | None = None, strides: Sequence[int] | None = None,
           dtype: tuple[int, int, int] | None = None, data: int | None = None,
           byte_offset: int = 0) -> Tensor:
    """A DLTensor over `arr`; keyword arguments override single fields (for bad inputs)."""
    keep: list[Any] = [arr]
    t = DLTensor()
    if arr is not None:
        t.data = arr.ctypes.data if data is None else data
        shape = list(arr.shape) if shape is None else list(shape)
        dtype = dtype or dl_type(dt.from_numpy(arr.dtype))
    else:
        t.data = data
        shape = list(shape or [])
        dtype = dtype or (2, 32, 1)
    shape_arr = (ctypes.c_int64 * max(len(shape), 1))(*shape)
    keep.append(shape_arr)
    t.shape = ctypes.cast(shape_arr, ctypes.POINTER(ctypes.c_int64))
    if strides is not None:
        strides_arr = (ctypes.c_int64 * max(len(strides), 1))(*strides)
        keep.append(strides_arr)
        t.strides = ctypes.cast(strides_arr, ctypes.POINTER(ctypes.c_int64))
    t.ndim = len(shape) if ndim is None else ndim
    t.device = DLDevice(device_type, 0)
    t.dtype = DLDataType(*dtype)
    t.byte_offset = byte_offset
    return Tensor(t, keep)


@dataclass
class Raw:
    """An explicit packed argument: a value of the union and a type code."""

    value: int | float | None
    code: int


# ------------------------------------------------------------------ building


def compile_c(path: Path, cflags: Sequence[str], *, std_override: str | None = None) -> Path:
    """Compile one C file to an object with -Werror; fail the test with cc's output."""
    obj = path.with_suffix(".o")
    flags = [f for f in cflags if not (std_override and f.startswith("-std="))]
    if std_override:
        flags.append(std_override)
    cmd = [CC, *WARNINGS, *flags, "-c", str(path), "-o", str(obj)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        numbered = "\n".join(f"{i + 1:4} {line}"
                             for i, line in enumerate(path.read_text().splitlines()))
        raise AssertionError(f"{' '.join(cmd)} failed:\n{proc.stderr}\n--- {path.name}\n{numbered}")
    return obj


def consts_c(content: bytes, symbol: str, align: int) -> str:
    """The constants blob as a C array (what the native linker makes of constants.bin)."""
    body = ",".join(str(b) for b in content) or "0"
    return (f"#include <stdint.h>\n"
            f"__attribute__((visibility(\"hidden\"), aligned({align})))\n"
            f"const uint8_t {symbol}[{max(len(content), 1)}] = {{{body}}};\n")


class CLibrary:
    """A built library: packed calls, last error and metadata through ctypes."""

    def __init__(self, lib: ctypes.CDLL, path: Path, prefix: str, artifacts: list[Any]) -> None:
        self.lib = lib
        self.path = path
        self.prefix = prefix
        self.artifacts = artifacts
        self._last_error = getattr(self.lib, f"{prefix}_last_error")
        self._last_error.restype = ctypes.c_char_p
        self._last_error.argtypes = []
        self._metadata = getattr(self.lib, f"{prefix}_metadata")
        self._metadata.restype = ctypes.c_char_p
        self._metadata.argtypes = []

    def source(self, file_name: str = "kernels.c") -> str:
        return next(a.content.decode() for a in self.artifacts if a.file_name == file_name)

    def has_symbol(self, name: str) -> bool:
        return hasattr(self.lib, name)

    def last_error(self) -> str:
        raw = self._last_error()
        return raw.decode() if raw else ""

    def metadata(self) -> dict[str, Any]:
        return json.loads(self._metadata().decode())

    def call(self, name: str, *args: Any, num_args: int | None = None,
             null_args: bool = False) -> int:
        """Call the packed entry `name`; return its status (0 = success)."""
        fn = getattr(self.lib, f"{self.prefix}{name}")
        fn.restype = ctypes.c_int32
        fn.argtypes = [ctypes.POINTER(KilnValue), ctypes.POINTER(ctypes.c_int32), ctypes.c_int32]
        values = (KilnValue * max(len(args), 1))()
        codes = (ctypes.c_int32 * max(len(args), 1))()
        keep: list[Any] = []
        for i, arg in enumerate(args):
            if isinstance(arg, np.ndarray):
                arg = tensor(arg)
            if isinstance(arg, Tensor):
                keep.append(arg)
                values[i].v_handle = ctypes.addressof(arg.struct)
                codes[i] = ARG_DLTENSOR
            elif arg is None:
                values[i].v_handle = None
                codes[i] = ARG_DLTENSOR
            elif isinstance(arg, Raw):
                if isinstance(arg.value, float):
                    values[i].v_float64 = arg.value
                else:
                    values[i].v_int64 = arg.value or 0
                codes[i] = arg.code
            elif isinstance(arg, (bool, int, np.integer)):
                values[i].v_int64 = int(arg)
                codes[i] = ARG_INT
            elif isinstance(arg, (float, np.floating)):
                values[i].v_float64 = float(arg)
                codes[i] = ARG_FLOAT
            else:
                raise TypeError(f"cannot pass {arg!r}")
        n = len(args) if num_args is None else num_args
        if null_args:
            return int(fn(None, None, n))
        return int(fn(values, codes, n))

    def run(self, name: str, *args: Any) -> None:
        """Call `name`; raise AssertionError with the library's message on failure."""
        rc = self.call(name, *args)
        if rc != 0:
            raise AssertionError(f"{name} returned {rc}: {self.last_error()}")


def build(mod: IRModule, directory: Path, *, prefix: str = PREFIX, target: Any = None,
          extra_c: str = "", pool: ConstantPool | None = None) -> CLibrary:
    """codegen_c + cc -Werror + link into directory/lib.so, loaded with ctypes."""
    return build_many({prefix: mod}, directory, target=target, extra_c=extra_c,
                      pools={prefix: pool} if pool is not None else None)[prefix]


def build_many(mods: dict[str, IRModule], directory: Path, *, target: Any = None,
               extra_c: str = "", pools: dict[str, ConstantPool] | None = None,
               host_opt: str | None = None) -> dict[str, CLibrary]:
    """Several modules, one prefix each, compiled in parallel and linked into one .so.

    `host_opt` (e.g. "-O0") replaces host.c's optimisation flag, to save time.
    """
    directory.mkdir(parents=True, exist_ok=True)
    jobs: list[tuple[Path, list[str]]] = []
    libs: list[str] = []
    artifacts_of: dict[str, list[Any]] = {}
    for prefix, mod in mods.items():
        pool = (pools or {}).get(prefix) or ConstantPool.from_module(mod)
        # The backend takes parallel loops outlined, as kiln.compile hands them over.
        artifacts = codegen_c(OutlineParallelLoops()(mod), target, prefix=prefix, pool=pool)
        artifacts_of[prefix] = artifacts
        for art in artifacts:
            if art.file_name.endswith(".c"):
                path = directory / f"{prefix}{art.file_name}"
                path.write_bytes(art.content)
                flags = list(art.metadata["cflags"])
                if host_opt and art.file_name == "host.c":
                    flags = [host_opt if f.startswith("-O") else f for f in flags]
                jobs.append((path, flags))
                libs.extend(art.metadata.get("libs", ()))
            elif art.file_name == "constants.bin":
                path = directory / f"{prefix}constants.c"
                path.write_text(consts_c(art.content, art.metadata["symbol"],
                                         art.metadata["align"]))
                jobs.append((path, ["-std=c99", "-fPIC"]))
    if extra_c:
        path = directory / "extra.c"
        path.write_text(extra_c)
        jobs.append((path, ["-std=c99", "-fPIC", "-O2"]))
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool_exec:
        objects = list(pool_exec.map(lambda job: compile_c(*job), jobs))
    so = directory / "lib.so"
    cmd = [CC, "-shared", "-o", str(so), *map(str, objects), *dict.fromkeys(libs)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed:\n{proc.stderr}")
    lib = ctypes.CDLL(str(so))
    return {prefix: CLibrary(lib, so, prefix, artifacts_of[prefix]) for prefix in mods}
