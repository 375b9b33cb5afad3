"""The onnxruntime reference: the one way the tests create a session and read outputs.

Always the CPU execution provider, so a reference never depends on what other
providers the host's onnxruntime build has.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, overload

import numpy as np
import onnx
import onnxruntime as ort

from kiln.target import Target
from kiln.target.host import machine_config
from kiln.target.isa import isa_for

PROVIDERS = ["CPUExecutionProvider"]


def ort_session(model: onnx.ModelProto | str | Path,
                options: ort.SessionOptions | None = None,
                disabled_optimizers: list[str] | None = None) -> ort.InferenceSession:
    """An onnxruntime CPU session for a model proto or a model file (without the graph
    transformers named in `disabled_optimizers`)."""
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    if disabled_optimizers:
        return ort.InferenceSession(source, options, providers=PROVIDERS,
                                    disabled_optimizers=disabled_optimizers)
    return ort.InferenceSession(source, options, providers=PROVIDERS)


def onnxruntime_outputs(model: onnx.ModelProto | str | Path, feeds: dict[str, Any],
                        options: ort.SessionOptions | None = None,
                        disabled_optimizers: list[str] | None = None) -> list[np.ndarray]:
    """Every output of `model` on `feeds` as onnxruntime computes it (the reference)."""
    session = ort_session(model, options, disabled_optimizers)
    return [np.asarray(out) for out in session.run(None, feeds)]


def onnxruntime_saturates() -> bool:
    """Whether this host's onnxruntime saturates its u8 x s8 pair sums: an x86 host
    without VNNI (MLAS picks its kernels from the CPU; with `vpdpbusd` the sums are
    exact, on AVX2 and AVX-512BW `vpmaddubsw` clamps each pair to int16). The machine's
    CPU, not a `$KILN_HOST_CPU` standing in for it: onnxruntime runs on the machine."""
    isa = isa_for(Target(machine_config()))
    return isa.arch in ("x86_64", "x86", "i686") and not {"avx512vnni", "avxvnni"} & isa.features


@overload
def like_onnxruntime(target: str) -> str: ...
@overload
def like_onnxruntime(target: Target) -> Target: ...
def like_onnxruntime(target: str | Target) -> str | Target:
    """`target` with the integer products of this host's onnxruntime: on an x86 host
    without VNNI (`onnxruntime_saturates`) it compiles with `int8-pairs=saturate`
    (docs/quantization.md), elsewhere it is `target`."""
    if not onnxruntime_saturates():
        return target
    if isinstance(target, Target):
        return target.with_attrs({"int8-pairs": "saturate"})
    return f"{target} -int8-pairs=saturate"
