"""Row kernels: softmax, log_softmax, layer_norm and reductions over trailing axes, by hand.

Their tensor-expression definitions (kiln.ops.reduce) materialize a row max and
a row sum (softmax) or a mean and a variance (layer_norm) in global arrays, each
in its own loop nest, then normalize in a third. These kernels walk one row at
a time instead, every row's statistics held in `lanes` stack accumulators (the
innermost loops are `vectorized` of constant extent, lanes along the row):

- softmax and log_softmax: three passes over the row (kiln.kernels.rows.softmax);
- layer_norm: the mean, the squared deviations from it, then the normalization
  (kiln.kernels.rows.layer_norm), or onnxruntime's arithmetic step for step where a
  quantized model needs its values (kiln.kernels.rows.layer_norm_onnxruntime);
- reductions over trailing axes (reduce_sum/mean/max/..., global pooling): one
  pass, `lanes` partial results combined at the end (kiln.kernels.rows.reduce).

Rows split over threads: the row loops write disjoint slices of the output, so
the `parallelize` pass marks one `parallel` when the work pays for it
(kiln.kernels.rows.loops). FuseOps may hand these kernels an elementwise chain on each
side (`lower_fused`): producers are inlined where the row is read (a scale, a mask, a
residual add), consumers where the result is stored. Other dtypes and axes keep the
tensor-expression definitions. The lowerings: kiln.kernels.rows.lowering (softmax,
log_softmax, layer_norm) and kiln.kernels.rows.reduce (the reductions).
"""
