








import numpy as np
import kiln
from kiln.runtime import load_module

kiln.compile(kiln.frontend.from_onnx("models/mlp.onnx"), "llvm").export_library("model.so")
lib = load_module("model.so")                  # or "model.tar"
y = lib["main"](np.ones((1, 64), np.float32))  # graph function: results allocated for you
out_buffer = np.empty_like(y)
lib["softmax"](y, out_buffer)                  # tensor function: writes into what you pass
