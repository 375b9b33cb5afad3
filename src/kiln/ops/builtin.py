"""Imports every module that registers built-in operators."""

from kiln.ops import (  # noqa: F401
    cblas,
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
    recurrent,
    reduce,
)
