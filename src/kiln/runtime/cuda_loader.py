"""The `cuda` loader: a library's CUDA artifacts -> a `CudaModule` (docs/gpu.md).

Loading touches no GPU: the module keeps the PTX and the function table
(kernels.json) and installs a launcher into the host library's launch stubs
(`{prefix}_cuda_set_launcher`, written by the CUDA codegen). The CUDA driver
(cuda-python, imported lazily by kiln.runtime.cuda_device) is first used when a
kernel runs, so a machine without a GPU loads, inspects and exports CUDA
libraries; there a call fails with the stubs' error 8, "no CUDA device ...",
raised as a CallError by the host entry.

Two ways to run the kernels:

- the library's graph functions (`lib["main"](x)`) take host (numpy) tensors as
  every kiln function does; each kernel launch then copies the buffers it reads
  to the device and the ones it writes back (correct, not fast: a device-resident
  graph runner is future work);
- `CudaModule.launch(name, *tensors)` launches one kernel on device tensors that
  cross as DLPack (torch, cupy: zero-copy), each checked against the table.

The device is chosen at run time (`CudaModule.device`, default `kiln.cuda(0)`).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from kiln.artifact.artifact import AnyArtifact
from kiln.errors import CallError, FormatError
from kiln.runtime.abi import KDL_CUDA
from kiln.runtime.ctypes_abi import CTYPES_BY_DTYPE, DLTensor
from kiln.runtime.cuda_device import CudaDevice, cuda, require_device
from kiln.runtime.loaders import LoadContext
from kiln.runtime.module import Module

TABLE_FORMAT = "kiln-cuda-functions"
# Error codes of the launch stubs (the IR's kernel error table, docs/abi.md: 8 and 9).
NO_DEVICE, LAUNCH_FAILED = 8, 9

LAUNCHER = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_int32,
                            ctypes.POINTER(ctypes.c_void_p))
_SET_LAUNCHER = (None, [LAUNCHER, ctypes.c_void_p])


def load_cuda(artifacts: list[AnyArtifact], ctx: LoadContext) -> CudaModule:
    """The loader registered as "cuda" (kiln.runtime.loaders)."""
    by_name = {a.file_name: a for a in artifacts}
    tables = [a for a in artifacts if a.file_name.endswith(".json")]
    if len(tables) != 1:
        raise FormatError(f"a library holds the kernels of one CUDA target; found "
                          f"{len(tables)} function tables (kernels.json)")
    table_art = tables[0]
    try:
        table = json.loads(bytes(table_art.content).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FormatError(f"cuda function table {table_art.file_name}: {exc}") from None
    if not isinstance(table, dict) or table.get("format") != TABLE_FORMAT:
        raise FormatError(f"cuda function table {table_art.file_name} is not a "
                          f"{TABLE_FORMAT} file")
    # A device's file names start with its target key (kiln.artifact.with_target_key).
    key = table_art.target_key
    ptx_art = by_name.get(f"{key}_{table.get('ptx')}" if key else str(table.get("ptx")))
    if ptx_art is None:
        raise FormatError(f"the cuda function table names PTX {table.get('ptx')!r}, which "
                          "the library does not hold")
    module = CudaModule(table, bytes(ptx_art.content), artifacts=artifacts)
    module.attach(ctx)
    return module


class CudaModule(Module):
    """A library's CUDA kernels: the function table, the PTX and the launcher."""

    kind = "cuda"

    def __init__(self, table: Mapping[str, Any], ptx: bytes, *,
                 artifacts: list[AnyArtifact]) -> None:
        super().__init__(artifacts=artifacts)
        self.table = dict(table)
        self.kernels: list[dict[str, Any]] = list(self.table.get("kernels", []))
        self.by_name = {k["name"]: k for k in self.kernels}
        self.ptx = ptx
        self.device: CudaDevice = cuda(0)
        self.last_launch_error = ""
        self._callback: Any = None
        self._setter: Any = None
        self._loaded: tuple[Any, Any, dict[str, Any]] | None = None  # driver, module, fns

    # ------------------------------------------------------------------ host launches
    def attach(self, ctx: LoadContext) -> None:
        """Install the launcher into the host library's stubs (if it has them)."""
        cdll = getattr(ctx.host, "cdll", None)
        if cdll is None:
            return
        try:
            setter = getattr(cdll, f"{ctx.prefix}_cuda_set_launcher")
        except AttributeError:
            return
        setter.restype, setter.argtypes = _SET_LAUNCHER
        self._callback = LAUNCHER(self._launch_from_host)
        self._setter = setter
        setter(self._callback, None)

    def _launch_from_host(self, _context: Any, index: int, args: Any) -> int:
        """The launcher: never raises (it runs inside a C call); returns a stub code."""
        try:
            self._staged_launch(self.kernels[index], args)
        except CallError as exc:
            self.last_launch_error = str(exc)
            return NO_DEVICE if str(exc).startswith("no CUDA device") else LAUNCH_FAILED
        except Exception as exc:  # reported through the entry's error code
            self.last_launch_error = f"{type(exc).__name__}: {exc}"
            return LAUNCH_FAILED
        return 0

    def _staged_launch(self, kernel: Mapping[str, Any], args: Any) -> None:
        cu, _, fns = self._ensure_loaded()
        device_ptrs: list[tuple[int, int, int]] = []  # (device ptr, host ptr, nbytes)
        values: list[Any] = []
        types: list[Any] = []
        try:
            for i, p in enumerate(kernel["params"]):
                slot = args[i]
                if p["kind"] == "buffer":
                    host = ctypes.c_void_p.from_address(slot).value or 0
                    nbytes = int(p["nbytes"])
                    dptr = _ok(cu.cuMemAlloc(max(nbytes, 1)), "cuMemAlloc")
                    device_ptrs.append((int(dptr), host, nbytes if p["access"] != "read" else 0))
                    if nbytes:  # written buffers too: a kernel may write only part of one
                        _ok(cu.cuMemcpyHtoD(dptr, host, nbytes), "cuMemcpyHtoD")
                    values.append(dptr)
                    types.append(None)
                else:
                    ctype = CTYPES_BY_DTYPE[p["dtype"]]
                    values.append(ctype.from_address(slot).value)
                    types.append(ctype)
            self._launch(cu, fns[kernel["name"]], kernel, values, types)
            for dptr, host, nbytes in device_ptrs:
                if nbytes:
                    _ok(cu.cuMemcpyDtoH(host, dptr, nbytes), "cuMemcpyDtoH")
        finally:
            for dptr, _, _ in device_ptrs:
                cu.cuMemFree(dptr)

    # ------------------------------------------------------------------ DLPack launches
    def launch(self, name: str, *tensors: Any) -> None:
        """Launch kernel `name` on device tensors (DLPack, on `self.device`), in place."""
        kernel = self.by_name.get(name)
        if kernel is None:
            raise CallError(f"no CUDA kernel '{name}'; kernels: {', '.join(self.by_name)}")
        params = kernel["params"]
        if len(tensors) != len(params):
            raise CallError(f"{name}: expected {len(params)} arguments, got {len(tensors)}")
        cu, _, fns = self._ensure_loaded()
        values: list[Any] = []
        types: list[Any] = []
        for p, value in zip(params, tensors):
            if p["kind"] == "buffer":
                values.append(self._device_pointer(name, p, value))
                types.append(None)
            else:
                ctype = CTYPES_BY_DTYPE[p["dtype"]]
                values.append(ctype(value).value)
                types.append(ctype)
        self._launch(cu, fns[name], kernel, values, types)

    def _device_pointer(self, name: str, param: Mapping[str, Any], value: Any) -> int:
        where = f"{name}: argument '{param['name']}'"
        if not hasattr(value, "__dlpack__"):
            raise CallError(f"{where}: expected a CUDA tensor with __dlpack__, got "
                            f"{type(value).__name__}")
        dev_type, dev_id = (int(x) for x in value.__dlpack_device__())
        if (dev_type, dev_id) != (KDL_CUDA, self.device.index):
            raise CallError(f"{where}: expected a tensor on {self.device} (DLPack device "
                            f"({KDL_CUDA}, {self.device.index})), got ({dev_type}, {dev_id})")
        capsule = value.__dlpack__()
        get = ctypes.pythonapi.PyCapsule_GetPointer
        get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
        tensor = DLTensor.from_address(get(capsule, b"dltensor"))
        shape = [tensor.shape[k] for k in range(tensor.ndim)]
        if shape != list(param["shape"]):
            raise CallError(f"{where}: expected shape {param['shape']}, got {shape}")
        if tensor.strides:
            expected = [int(s) for s in np.cumprod([1, *shape[:0:-1]])[::-1]] if shape else []
            strides = [tensor.strides[k] for k in range(tensor.ndim)]
            if any(n > 1 and s != e for n, s, e in zip(shape, strides, expected)):
                raise CallError(f"{where}: expected a contiguous tensor")
        return int(tensor.data or 0) + int(tensor.byte_offset)

    # ------------------------------------------------------------------ the driver
    def _ensure_loaded(self) -> tuple[Any, Any, dict[str, Any]]:
        if self._loaded is not None:
            return self._loaded
        cu = require_device(self.device)  # CallError "no CUDA device ..." without one
        dev = _ok(cu.cuDeviceGet(self.device.index), "cuDeviceGet")
        ctx = _ok(cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
        _ok(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        module = _ok(cu.cuModuleLoadData(self.ptx + b"\0"), "cuModuleLoadData")
        fns = {k["name"]: _ok(cu.cuModuleGetFunction(module, k["entry"].encode()),
                              f"cuModuleGetFunction({k['entry']})") for k in self.kernels}
        self._loaded = (cu, module, fns)
        return self._loaded

    @staticmethod
    def _launch(cu: Any, fn: Any, kernel: Mapping[str, Any], values: list[Any],
                types: list[Any]) -> None:
        grid, block = kernel["grid"], kernel["block"]
        _ok(cu.cuLaunchKernel(fn, *grid, *block, int(kernel.get("shared_bytes", 0)), 0,
                              (tuple(values), tuple(types)), 0), f"launching {kernel['name']}")
        _ok(cu.cuCtxSynchronize(), f"running {kernel['name']}")

    def close(self) -> None:
        """Remove the launcher from the host library and unload the GPU module."""
        if self._setter is not None:
            with contextlib.suppress(Exception):  # the host library may be gone already
                self._setter(LAUNCHER(), None)
            self._setter = None
        if self._loaded is not None:
            cu, module, _ = self._loaded
            cu.cuModuleUnload(module)
            self._loaded = None
        super().close()


def _ok(result: Any, what: str) -> Any:
    err, *rest = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise CallError(f"CUDA: {what} failed with error {int(err)} ({err})")
    return rest[0] if len(rest) == 1 else (rest or None)
