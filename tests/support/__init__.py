"""Shared helpers of the kiln test suite, importable as `support` from every test
folder (pytest's `pythonpath` setting in pyproject.toml puts tests/ on the path; child
interpreters get it through `support.processes.child_env`). Tests never edit sys.path
and never create onnxruntime sessions themselves (tests/test_test_support.py checks).

Modules (import the one you need; this package imports nothing itself):

- `support.reference`: `ort_session(model_or_path, options=None)`, the one way to create
  an onnxruntime (CPU) session; `onnxruntime_outputs(model, feeds)`, all its outputs.
- `support.numerics`: `assert_close(got, want, tol, cases=None)` (shapes, then relative
  L2 error per output, naming the failing case); `rel_l2(actual, expected)`.
- `support.graphs`: `GraphBuilder(seed=0)`, the one way tests build ONNX graphs:
  values named for the test (`node`, `const(name=)`, `consts`, `input`, `inputs_for`,
  `output`, `add`) or by the builder (`op`, `weight`, `conv`, `bn`, `linear`, `proj`,
  `layer_norm`, `gelu_erf`, `relu6`); `graph` for If/Loop/Scan bodies; `model` with
  opset/domain imports, IR version, inferred output types and onnx's
  checker. `value_info(name, shape, elem=FLOAT)`, `untyped(name)`.
- `support.small_models`: MLP, VGG, ResNet-18, MobileNetV2 and transformer families
  built with GraphBuilder (`MODELS`, `example_inputs`).
- `support.dynamic_models`: models with symbolic dimensions (`encoder`, `cnn`,
  `feeds(model, sizes)`, `reference`).
- `support.ir_samples`: small hand-built IR modules with numpy references.
- `support.handmade_lib`: a kiln library written by hand after docs/abi.md.
- `support.processes`: `child_env(*paths, **vars)`, `run_python(code_or_script, *args,
  paths=(), env=None, timeout=300)` for fresh interpreters, and
  `outputs_in_fresh_process(executable, feeds, tmp_path, threads)`.
- `support.toolchains`: `find_tool(*names)`, `require_tool(*names, why="")` (skips with
  a reason when none is on PATH), `c_compiler()` ($CC or cc).
- `support.targets`: `NATIVE_TARGETS` ("llvm", "llvm-avx2", "c") and
  `native_target(name)`, the llvm / c target params of backend fixtures.
- `support.c_programs`: `build_c_program(source, out)` (cc -std=c11 -Werror against
  kiln's headers) and `program_and_library(request, tmp_path_factory, model, example)`,
  the body of a fixture that builds an examples/c_deploy program and a model's library.
- `support.seeds`: `rng_for(request)`, a numpy generator seeded by the test's node id
  (`seed_for(nodeid)`), so a test's random data do not depend on the tests run before it;
  `reseed(request)` rebinds a module's `RNG` to it (an autouse fixture's body).
- `support.nbits`: `hand_packed(builder, name, bits, k, n, block, zp=, g_idx=, bias=)`,
  a MatMulNBits node packed by hand; `pack_codes(codes, bits)`.
- `support.cuda_nets`, `support.cuda_ptx_kernels`: the GPU tests' models and kernels.

Helpers used by one folder only stay in that folder (pytest puts a test file's folder
on the path when it imports it).
"""
