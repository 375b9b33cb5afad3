"""The ONNX converters: one module per `kiln.ops` module whose operators they map to
(`nn.py` for kiln.ops.nn's, ...), plus the ONNX operators kiln imports as compositions
of its operators (`composed.py`, `sampling.py`, `recurrent.py`); `quant.py` holds the
quantized models' (QDQ and QOperator forms, onto kiln.ops.quant and its siblings).

`registry.py` holds the machinery: the `@onnx_op` decorator, the `ONNX_CONVERTERS`
registry, the `GraphContext` a converter is given and the helpers converters share;
`converters()` loads the modules `builtin.py` lists on first use.
"""

from kiln.frontend.onnx.converters.registry import (
    ONNX_CONVERTERS,
    Converter,
    GraphContext,
    LoopStep,
    OnnxConverter,
    converters,
    onnx_op,
)

__all__ = ["ONNX_CONVERTERS", "Converter", "GraphContext", "LoopStep", "OnnxConverter",
           "converters", "onnx_op"]
