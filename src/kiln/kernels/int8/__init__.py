"""The int8 (quantized) kernels: the hand-built lowerings of the packed integer ops of
kiln.ops (their meaning: kiln.ops.quant_packed, quant_conv_words, quant_dynamic,
quant_elementwise, quant_mlas_conv), and the kernel families that pack quantized
products for them (kiln.kernels.registry).

- `families`: the int8 families (`select(call, isa)` picks one for each quantized
  product the quantize-ops pass packs), on `packing`: the weights shifted by their zero
  points, packed as words or panels, the zero-point corrections folded into the bias;
- `dot`: the dot-product form (the target's instruction family, the tiles' shapes);
- `matmul`: the packed matrix products' register tiles; `dynamic`: dynamic
  quantization's product (A quantized at run time, a float epilogue);
- `conv_dot`: the dot-form convolution (its schedule and variants), on `conv_tile`
  (which tile), `conv_input` (the input copies and phase planes), `conv_tiles` (the
  register tiles) and `conv_in_place` (no im2col);
- `grouped`: depthwise and grouped convolutions on vector tiles;
- `elementwise`: `qlinear_add`'s flat kernel and `qlinear_concat`'s;
- `mlas_conv`: `conv2d_mlas`, a float convolution summed in MLAS's order.
"""
