"""Imports every module that registers built-in ONNX converters."""

from kiln.frontend.onnx.converters import (  # noqa: F401
    composed,
    contrib_attention,
    contrib_llm,
    data_dependent,
    elementwise,
    image,
    indexing,
    logic,
    lrn,
    manip,
    nn,
    pool,
    quant,
    quant_recurrent,
    recurrent,
    reduce,
    sampling,
)
