"""The onnxruntime reference: the one way the tests create a session and read outputs.

Always the CPU execution provider, so a reference never depends on what other
providers the host's onnxruntime build has.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

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
