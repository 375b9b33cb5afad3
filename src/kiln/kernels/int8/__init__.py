"""The int8 (quantized) kernels, moved out of kiln.ops."""
