"""Pool kernels: 2-D max and average pooling, by hand.

- NCHW of static shape: the row-by-row max kernel (kiln.kernels.pool.max_rows: no padded
  copy, each window's rows then its columns) and the depthwise convolution's window
  kernel for an average (kiln.kernels.pool.window, which also holds the pools over an
  image of symbolic size);
- NCHW{b}c (`pool2d_nchwc`): one vector of the block's channel lanes per output
  position (kiln.kernels.pool.nchwc).

Their lowerings (kiln.kernels.pool.lowering) fuse the elementwise chain FuseOps groups
after a pool into its stores. The global pools are row reductions (kiln.kernels.rows);
the pools' meaning (max_floor, window_max, scans_from_first) is kiln.ops.pool's.
"""
