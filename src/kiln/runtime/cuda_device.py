"""CUDA devices chosen at run time: `kiln.cuda(1)`.

A target says what code to generate (`cuda -arch=sm_90`); which GPU runs it is
chosen when the library is called, as in DLPack's (device_type, device_id).
The driver binding (NVIDIA's `cuda-python`, extra `kiln-tensor[cuda]`, docs/gpu.md) is
imported only when a device is actually needed, so a machine without a GPU can
still load, inspect and export a library holding CUDA artifacts.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from kiln.errors import CallError
from kiln.runtime.abi import KDL_CUDA


@dataclass(frozen=True)
class CudaDevice:
    """One CUDA device by ordinal; `dlpack_device` is its DLPack (type, id) pair."""

    index: int

    def __post_init__(self) -> None:
        if isinstance(self.index, bool) or not isinstance(self.index, int) or self.index < 0:
            raise CallError(f"CUDA device index must be an int >= 0, got {self.index!r}")

    @property
    def dlpack_device(self) -> tuple[int, int]:
        return (KDL_CUDA, self.index)

    def __str__(self) -> str:
        return f"cuda({self.index})"


def cuda(index: int = 0) -> CudaDevice:
    """The CUDA device with ordinal `index` (checked only when used)."""
    return CudaDevice(index)


def _driver() -> ModuleType:
    # cuda-python >= 12.6 names the module cuda.bindings.driver; older releases cuda.cuda.
    for name in ("cuda.bindings.driver", "cuda.cuda"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise CallError(
        "no CUDA device available: the CUDA driver binding 'cuda-python' is not installed "
        "(pip install 'kiln-tensor[cuda]'; see docs/gpu.md)")


def _check(driver: ModuleType, result: Any, what: str) -> Any:
    err, *rest = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise CallError(f"no CUDA device available: {what} failed with CUDA error {int(err)} "
                        f"({err})")
    return rest[0] if rest else None


def require_device(device: CudaDevice) -> ModuleType:
    """The driver binding, after checking that `device` exists; else a CallError."""
    driver = _driver()
    _check(driver, driver.cuInit(0), "cuInit")
    count = int(_check(driver, driver.cuDeviceGetCount(), "cuDeviceGetCount"))
    if device.index >= count:
        raise CallError(f"no CUDA device {device.index}: this machine has {count} "
                        f"CUDA device{'s' if count != 1 else ''}")
    return driver
