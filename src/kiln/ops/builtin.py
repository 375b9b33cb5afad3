"""Imports every module that registers built-in operators."""

from kiln.ops import (  # noqa: F401
    cblas,
    composed,
    conv_direct,
    data_dependent,
    elementwise,
    gemm,
    image,
    indexing,
    layout,
    logic,
    manip,
    nn,
    pool,
    pool_nchwc,
    quant,
    quant_kernels,
    quant_onnx,
    recurrent,
    reduce,
    sampling,
)
