"""The function attributes kiln itself reads and writes, by name.

A function's `attrs` is an open mapping (users and importers add their own keys,
printed and compared like any other), so the keys stay plain `str` values; what
this module fixes is the spelling of the ones kiln's passes and backends agree on.
`kiln.`-prefixed keys are set by kiln; the two unprefixed ones are for users.
"""

from __future__ import annotations

from typing import Final

# Set by the user (or the ONNX importer) on a graph function.
ATTR_GIVEN_OUTPUT_NAMES: Final = "output_names"  # names of the results, in order
ATTR_TARGET: Final = "target"                    # compile this function for this target

# Set by the ONNX importer (or the user) on a graph function with symbolic dimensions,
# and kept on the PrimFunc it lowers to: one `(name, min, max)` triple per dimension
# variable (kiln.ir.shape_expr), sorted by name; `max` is None when unbounded. The
# packed entry checks every bound before any kernel runs (docs/dynamic-shapes.md).
ATTR_DIM_BOUNDS: Final = "kiln.dim_bounds"

# Set by the ONNX importer beside `kiln.dim_bounds`: sizes the model divides by, which
# must not be 0 at call time (a Reshape's -1 is the element count divided by the other
# dimensions, and onnxruntime refuses the reshape when they are 0). One `(text, why)`
# pair per size: its `kiln.dim_expr` text and the node that needs it; the packed entry
# checks each after the bounds (docs/dynamic-shapes.md, "Zero sizes").
ATTR_DIM_NONZERO: Final = "kiln.dim_nonzero"

# Set by LegalizeOps / FuseOps on the PrimFuncs they create: reachable only through a
# call, so dead-code elimination may drop them and they get no public entry.
ATTR_PRIVATE: Final = "kiln.private"

# Set by LowerGraphToTensor on the PrimFunc a graph function becomes; the ABI reads them.
ATTR_GRAPH: Final = "kiln.graph"                  # lowered from a graph-level function
ATTR_NUM_OUTPUTS: Final = "kiln.num_outputs"      # trailing buffer params the caller allocates
ATTR_TUPLE_RESULT: Final = "kiln.tuple_result"    # the graph result was a tuple
ATTR_OUTPUT_NAMES: Final = "kiln.output_names"    # names of those output buffers
ATTR_WORKSPACE_BYTES: Final = "kiln.workspace_bytes"  # size of the workspace arena
# Names of buffer parameters the function's external calls only read (e.g. the
# operands of cblas_sgemm); without it a buffer handed to external code counts as written.
ATTR_EXTERN_READS: Final = "kiln.extern_reads"

# Set by LegalizeOps on the kernel of a lone `concat` (kiln.ops.manip): the axis it
# joins along. Lowering makes the inputs views of the output and drops the call
# (kiln.transform.concat_views).
ATTR_CONCAT_AXIS: Final = "kiln.concat_axis"

# Set by the heterogeneous build (kiln.driver.split) on the kernels another target's
# code generator defines: the host's codegen declares them instead of compiling them.
ATTR_EXTERNAL: Final = "kiln.external"

# Set by loop outlining (kiln.transform.outline) on an outlined parallel loop body.
ATTR_PARALLEL_OF: Final = "kiln.parallel_loop_of"   # the kernel the loop came from
ATTR_PARALLEL_VAR: Final = "kiln.parallel_loop_var"  # the loop variable's name hint
# Set by a kernel builder that chose its parallel loops itself (the work threshold of
# kiln.kernels.parallel_work): the parallelize pass leaves the kernel alone.
ATTR_PARALLEL_DECIDED: Final = "kiln.parallel_decided"

# Data-dependent output sizes (docs/abi.md, "Data-dependent output sizes").
# On a kernel that binds dimensions at run time (kiln.ops.data_dependent): one
# `(name, bound)` pair per dimension it binds (bound: an int or a dimension text over
# its inputs' dimensions); after its outputs it takes one int64[1] buffer per pair,
# into which it writes the dimension's value.
ATTR_BINDS_DIMS: Final = "kiln.binds_dims"
# On a lowered graph function with such dimensions: one `(name, bound, places)` triple
# per dimension, sorted by name (bound: int or dimension text over the inputs'
# dimensions; places: the `(result, axis)` pairs whose extent it is). The function
# takes one more int64 buffer after its results, into which it writes their values.
ATTR_RUNTIME_DIMS: Final = "kiln.runtime_dims"
# On a kernel that takes a size of its arguments at run time (a 1x1 convolution's input
# channel count, kiln.kernels.conv.run_time_width): one `(name, param, axis)` triple per
# dimension scalar its callers pass as the static extent of axis `axis` of their
# argument for buffer parameter `param`, not as a dimension of their own.
ATTR_ARG_DIMS: Final = "kiln.arg_dims"

# Set by a kernel builder whose vector code is all explicit (`vector` loops over a register
# tile, kiln.kernels): the LLVM backend keeps LLVM's SLP vectorizer off the kernel and
# its outlined loop bodies (docs/codegen-llvm.md, "Kernels LLVM must not regroup").
ATTR_NO_SLP: Final = "kiln.no_slp"

# Module attribute set by the vectorize-loops pass (kiln.transform.vectorize_loops): the
# vector register width, in bits, its `vector` loops were decided for; the C backend
# prints those loops in chunks of that width.
ATTR_VECTOR_BITS: Final = "kiln.vector_bits"

# Module attribute set by kiln.from_torch: which exporter wrote the ONNX model and why
# it fell back from dynamo, `{"exporter": "dynamo" | "torchscript", "fallback_reason": str
# | None}` (kiln/frontend/pytorch.py).
ATTR_TORCH_EXPORT: Final = "kiln.torch_export"

# Module attribute (kiln.compile's max_loop_iterations): the most iterations a graph-level
# Loop may run; lowering (kiln.transform.lower_control_flow) fails the call at the next.
ATTR_MAX_LOOP_ITERATIONS: Final = "kiln.max_loop_iterations"
# Set by the ONNX importer on a Loop's body function: the Loop node's name, which the
# loop's errors quote.
ATTR_SOURCE_NODE: Final = "kiln.source_node"

# Set by TerminateChecks (kiln.transform.terminate) on a lowered graph function: it takes
# one more parameter, an int32 0-d buffer (the caller's terminate flag), after its
# results and its run-time dimensions' buffer, before its dimension scalars; it polls the
# flag before every kernel call and at every loop back-edge (docs/abi.md).
ATTR_TERMINATE_FLAG: Final = "kiln.terminate_flag"

# Set by lowering (kiln.transform.lower_control_flow) on a lowered graph function whose
# own `check` codes (kiln.ir.kernel_errors.FIRST_FUNCTION_ERROR and up) have messages
# of their own: `(code, message)` pairs; host.c reports them (a Loop's iteration limit).
ATTR_CHECK_MESSAGES: Final = "kiln.check_messages"

# Set by a kernel builder on a kernel whose output may be one of its inputs' own buffer:
# (input index, output index) among its parameters. The kernel compares the two
# addresses itself (kiln.ir.same_address); a graph function whose result is that output
# and whose parameter is that input, read by nothing else, declares the result
# `in_place_of` the parameter (kiln.codegen.in_place, docs/abi.md).
ATTR_IN_PLACE: Final = "kiln.in_place"

# Set by the pass `last-position` (kiln.transform.last_position) on a decoder graph
# function: the name of its companion, the same function with its logits computed for
# each row's last position only (what a generation loop's prompt call reads); and on
# the companion: the name of the decoder it was made from. The library metadata names
# the companion in the decoder's signature ("last_position", docs/abi.md).
ATTR_LAST_POSITION: Final = "kiln.last_position"
ATTR_LAST_POSITION_OF: Final = "kiln.last_position_of"

# Module attribute set by ProfileKernelCalls (kiln.transform.profile): one
# (function, kernel or None) pair per timer site, in site order.
ATTR_PROFILE_SITES: Final = "kiln.profile_sites"

# Set by kiln.kernels' builders on the PrimFunc they build: which builder made it (the
# kernel kind as a str, or a marker); nothing in kiln reads them, the tests do (which
# kernel a model compiled to).
ATTR_CONV_KERNEL: Final = "kiln.conv_kernel"  # a conv kind, e.g. "conv2d_gemm", "conv2d_nchwc"
ATTR_GEMM_KERNEL: Final = "kiln.gemm_kernel"  # a matmul kind, e.g. "matmul_tiled", "qlinear_*"
ATTR_POOL_KERNEL: Final = "kiln.pool_kernel"  # a pooling kernel's name, e.g. "pool2d_nchwc"
ATTR_ROW_KERNEL: Final = "kiln.row_kernel"    # a row operator's name, e.g. "softmax"
ATTR_CHANNEL_SCALE: Final = "kiln.channel_scale"   # True: the per-channel scale kernel
ATTR_QLINEAR_ADD: Final = "kiln.qlinear_add"       # "flat": the flat int8 add kernel
ATTR_QLINEAR_CONCAT: Final = "kiln.qlinear_concat"  # "runs": the int8 concat by runs

KILN_ATTRS: Final = frozenset({
    ATTR_PRIVATE, ATTR_GRAPH, ATTR_NUM_OUTPUTS, ATTR_TUPLE_RESULT, ATTR_OUTPUT_NAMES,
    ATTR_WORKSPACE_BYTES, ATTR_PARALLEL_OF, ATTR_PARALLEL_VAR, ATTR_EXTERNAL, ATTR_DIM_BOUNDS,
    ATTR_BINDS_DIMS, ATTR_RUNTIME_DIMS, ATTR_ARG_DIMS, ATTR_CONCAT_AXIS, ATTR_NO_SLP,
    ATTR_TERMINATE_FLAG, ATTR_CHECK_MESSAGES, ATTR_SOURCE_NODE, ATTR_IN_PLACE, ATTR_CONV_KERNEL,
    ATTR_GEMM_KERNEL, ATTR_POOL_KERNEL, ATTR_ROW_KERNEL, ATTR_CHANNEL_SCALE, ATTR_QLINEAR_ADD,
    ATTR_QLINEAR_CONCAT, ATTR_LAST_POSITION, ATTR_LAST_POSITION_OF,
})
"""Every attribute key kiln sets itself."""
