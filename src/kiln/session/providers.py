"""Execution providers as onnxruntime names them: which kiln has, and what a session
given a providers list runs on.

kiln's sessions compile for this machine's CPU, so a session always runs on
"CPUExecutionProvider". A provider that is not available is skipped with
onnxruntime's own warning (its text, its category), as onnxruntime falls back to
the CPU; "CUDAExecutionProvider" is available when kiln's cuda target can run here
(the driver binding and a device, kiln.runtime.cuda_device), and the session still
runs on the CPU, saying so: a CUDA library is compiled with kiln.compile (docs/gpu.md).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from kiln.errors import CallError
from kiln.runtime.cuda_device import CudaDevice, require_device

CPU_PROVIDER = "CPUExecutionProvider"
CUDA_PROVIDER = "CUDAExecutionProvider"

# onnxruntime's get_all_providers(), in its order (the providers it can be built with).
ALL_PROVIDERS = (
    "TensorrtExecutionProvider", "CUDAExecutionProvider", "MIGraphXExecutionProvider",
    "OpenVINOExecutionProvider", "DnnlExecutionProvider", "VitisAIExecutionProvider",
    "QNNExecutionProvider", "NnapiExecutionProvider", "VSINPUExecutionProvider",
    "JsExecutionProvider", "CoreMLExecutionProvider", "DmlExecutionProvider",
    "RknpuExecutionProvider", "WebNNExecutionProvider", "WebGpuExecutionProvider",
    "XnnpackExecutionProvider", "CANNExecutionProvider", "AzureExecutionProvider",
    "CPUExecutionProvider",
)


@functools.cache
def cuda_usable() -> bool:
    """Whether kiln's cuda target can run here: the driver binding imports and device 0
    exists (asked once per process)."""
    try:
        require_device(CudaDevice(0))
    except (CallError, OSError, RuntimeError):  # no binding, no driver library, no device
        return False
    return True


def get_all_providers() -> list[str]:
    """Every provider name onnxruntime knows, as `onnxruntime.get_all_providers()`."""
    return list(ALL_PROVIDERS)


def get_available_providers() -> list[str]:
    """The providers kiln has here: ["CPUExecutionProvider"], with
    "CUDAExecutionProvider" first when kiln's cuda target can run on this machine."""
    return [CUDA_PROVIDER, CPU_PROVIDER] if cuda_usable() else [CPU_PROVIDER]


def get_device() -> str:
    """The device kiln's sessions run on, as `onnxruntime.get_device()`: "CPU"."""
    return "CPU"


def provider_name(entry: Any) -> Any:
    """The name of one `providers` entry: a name, or a (name, options dict) tuple."""
    if isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], Mapping):
        return entry[0]
    return entry


def warn_unavailable(providers: Sequence[Any] | None) -> None:
    """Warn, in onnxruntime's words, for each provider of a checked providers list that
    is not available (the session falls back to the CPU, as onnxruntime's), and for
    an available CUDA that kiln's session runs on the CPU anyway."""
    available = get_available_providers()
    for entry in providers or ():
        name = provider_name(entry)
        if name not in available:
            # onnxruntime's text, missing space included, so log filters match both.
            warnings.warn(f"Specified provider '{name}' is not in available provider names."
                          f"Available providers: '{', '.join(available)}'", UserWarning,
                          stacklevel=3)
        elif name != CPU_PROVIDER:
            warnings.warn(f"{name} is available, but kiln's InferenceSession compiles for the "
                          "CPU and runs there; compile a CUDA library with kiln.compile(model, "
                          "'cuda -arch=sm_XY') and open it (docs/gpu.md)", UserWarning,
                          stacklevel=3)


__all__ = ["ALL_PROVIDERS", "CPU_PROVIDER", "CUDA_PROVIDER", "cuda_usable",
           "get_all_providers", "get_available_providers", "get_device", "provider_name",
           "warn_unavailable"]
