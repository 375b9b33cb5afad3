"""The host side of a CUDA library without a GPU: the native graph function calls the
launch stubs, the cuda loader's launcher stages every buffer through a stand-in for
the CUDA driver whose kernel launch runs the same scheduled kernel IR with kiln's
reference interpreter, and the model still matches onnxruntime. Everything but the
PTX itself (tests/gpu runs that on a GPU) is the real path."""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import pytest

import kiln
from kiln.errors import CallError
from kiln.runtime import cuda_loader
from kiln.runtime.cuda_device import CudaDevice
from support.cuda_nets import NETS
from support.reference import onnxruntime_outputs

CUDA = {"kind": "cuda", "arch": "sm_90", "host": {"kind": "llvm"}}


class InterpreterDriver:
    """The cuda-python driver calls the loader makes; device memory is host memory."""

    def __init__(self, ex: kiln.Executable, table: dict[str, Any]) -> None:
        self.ex = ex
        self.kernels = {k["entry"]: k for k in table["kernels"]}
        self.memory: dict[int, Any] = {}
        self.launches: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = []

    def cuDeviceGet(self, index: int) -> tuple[int, int]:
        return 0, index

    def cuDevicePrimaryCtxRetain(self, dev: int) -> tuple[int, str]:
        return 0, "context"

    def cuCtxSetCurrent(self, ctx: str) -> tuple[int]:
        return (0,)

    def cuModuleLoadData(self, ptx: bytes) -> tuple[int, str]:
        assert ptx.endswith(b"\0") and b".entry" in ptx
        return 0, "module"

    def cuModuleGetFunction(self, module: str, entry: bytes) -> tuple[int, str]:
        return 0, entry.decode()

    def cuMemAlloc(self, nbytes: int) -> tuple[int, int]:
        buf = ctypes.create_string_buffer(nbytes)
        self.memory[ctypes.addressof(buf)] = buf
        return 0, ctypes.addressof(buf)

    def cuMemFree(self, ptr: int) -> tuple[int]:
        del self.memory[ptr]
        return (0,)

    def cuMemcpyHtoD(self, dst: int, src: int, nbytes: int) -> tuple[int]:
        ctypes.memmove(dst, src, nbytes)
        return (0,)

    def cuMemcpyDtoH(self, dst: int, src: int, nbytes: int) -> tuple[int]:
        ctypes.memmove(dst, src, nbytes)
        return (0,)

    def cuLaunchKernel(self, fn: str, gx: int, gy: int, gz: int, bx: int, by: int, bz: int,
                       shared: int, stream: int, args: Any, extra: int) -> tuple[int]:
        kernel = self.kernels[fn]
        assert (gx, gy, gz) == tuple(kernel["grid"]) and (bx, by, bz) == tuple(kernel["block"])
        values, _types = args
        operands = []
        for p, value in zip(kernel["params"], values):
            if p["kind"] == "buffer":
                assert value in self.memory  # a device pointer, not the caller's memory
                raw = (ctypes.c_char * p["nbytes"]).from_address(value)
                operands.append(np.frombuffer(raw, p["dtype"]).reshape(p["shape"]))
            else:
                operands.append(value)
        kiln.evaluate(self.ex.ir, kernel["name"], *operands)
        self.launches.append((kernel["name"], (gx, gy, gz), (bx, by, bz)))
        return (0,)

    def cuCtxSynchronize(self) -> tuple[int]:
        return (0,)

    def cuModuleUnload(self, module: str) -> tuple[int]:
        return (0,)


@pytest.mark.parametrize(("name", "host"), [("cnn", "llvm"), ("encoder", "llvm"), ("cnn", "c")])
def test_host_code_launches_every_kernel_through_the_loader(
        name: str, host: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model, feeds = NETS[name]()
    ex = kiln.compile(model, {**CUDA, "host": {"kind": host}})
    lib = ex.jit()
    (cuda,) = [m for m in lib.imports if isinstance(m, cuda_loader.CudaModule)]
    driver = InterpreterDriver(ex, cuda.table)
    asked: list[CudaDevice] = []

    def require_device(device: CudaDevice) -> InterpreterDriver:
        asked.append(device)
        return driver

    monkeypatch.setattr(cuda_loader, "require_device", require_device)
    got = lib["main"](*feeds.values())
    np.testing.assert_allclose(got, onnxruntime_outputs(model, feeds)[0], rtol=1e-4, atol=1e-4)
    assert asked == [kiln.cuda(0)]
    # main's kernel calls, in order, each with its table's launch shape; memory freed.
    calls = [s.func for s in _calls(ex.ir["main"].body)]
    assert [n for n, _, _ in driver.launches] == calls
    assert driver.memory == {}


def test_a_failing_launch_is_the_calls_error(monkeypatch: pytest.MonkeyPatch) -> None:
    model, feeds = NETS["cnn"]()
    lib = kiln.compile(model, CUDA).jit()

    def no_gpu(device: CudaDevice) -> Any:
        raise CallError(f"no CUDA device {device.index}: this machine has 0 CUDA devices")

    monkeypatch.setattr(cuda_loader, "require_device", no_gpu)
    with pytest.raises(CallError, match=r"^main: no CUDA device"):
        lib["main"](*feeds.values())
    (cuda,) = [m for m in lib.imports if isinstance(m, cuda_loader.CudaModule)]
    assert cuda.last_launch_error == "no CUDA device 0: this machine has 0 CUDA devices"


def _calls(body: Any) -> list[Any]:
    from kiln.ir.tensor import CallFunc
    from kiln.ir.visitor import iter_stmts

    return [s for s in iter_stmts(body) if isinstance(s, CallFunc)]
