"""The float32 2-D convolution kernels: the families that take a `conv2d` (kiln.ops.
kernels.registry: `direct`, `rows`, `depthwise`, `gemm`, `grouped`, `winograd`, and
on NCHW{b}c activations `nchwc`, `winograd_nchwc`), the loop nests they build
(`blocked`, `window`, ...), the NCHW{b}c depthwise and channel-scale kernels, and the
lowerings of their ops (`lowering`, registered in kiln.kernels.lowering).

The pieces other kernel families build on (the pools' window kernel, the integer
depthwise kernel's padded input and row tiles) are re-exported here.
"""

from kiln.kernels.conv.padding import padded_input
from kiln.kernels.conv.row_tiles import rows_tile_width, tiled_row
from kiln.kernels.conv.window import Tap, depthwise_tile_width, window_body
from kiln.ops.conv_geometry import ConvShape

__all__ = ["ConvShape", "Tap", "depthwise_tile_width", "padded_input", "rows_tile_width",
           "tiled_row", "window_body"]
