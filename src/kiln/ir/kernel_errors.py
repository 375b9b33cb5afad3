"""The error codes a kernel returns, and their messages.

A kernel (docs/abi.md) returns 0 or one of these codes; host.c's entry turns
the code into the message of the call's exception, and the reference
interpreter raises the message directly. Code 1 is an allocation failure, code 10
a buffer size (from symbolic dimensions) that overflows int64;
the others are failed `check` intrinsics (docs/ir.md, "Checks"): data-dependent
conditions an operator verifies while running, such as an index read from a
tensor being in range. Codes are part of the compiled artifact: never renumber.
"""

from __future__ import annotations

from kiln.errors import IRError

ERROR_OUT_OF_MEMORY = 1
ERROR_NO_CUDA_DEVICE = 8
ERROR_CUDA_LAUNCH = 9
ERROR_SIZE_OVERFLOW = 10
ERROR_LOOP_SCAN = 20
ERROR_TERMINATED = 21
# Codes from here on are a function's own checks: their messages are in the lowered
# function's `kiln.check_messages` (a Loop's iteration limit names the Loop).
FIRST_FUNCTION_ERROR = 64

KERNEL_ERRORS: dict[int, str] = {
    ERROR_OUT_OF_MEMORY: "out of memory allocating a workspace",
    2: "gather: an index is out of range [-n, n) for an axis of size n",
    3: "gather_elements: an index is out of range [-n, n) for an axis of size n",
    4: "gather_nd: an index is out of range [-n, n) for an axis of size n",
    5: "scatter_elements: an index is out of range [-n, n) for an axis of size n",
    6: "scatter_nd: an index is out of range [-n, n) for an axis of size n",
    7: "reverse_sequence: a sequence length is out of range [0, n] for a time axis of size n",
    # Returned by the launch stubs of a CUDA library (kiln.codegen.cuda).
    8: "no CUDA device: this library's CUDA kernels run only on a machine with a GPU and "
       "cuda-python (pip install 'kiln-tensor[cuda]'; docs/gpu.md)",
    9: "a CUDA kernel launch failed",
    # A buffer sized by symbolic dimensions whose byte count does not fit int64 (or
    # size_t): refused before any allocation (kiln.dim_expr's checked arithmetic).
    ERROR_SIZE_OVERFLOW: "size overflows int64: the symbolic dimensions ask for a buffer "
                         "larger than any allocation",
    # Data-dependent sizes (kiln.ops.data_dependent): a run-time k outside its axis.
    11: "topk: k is out of range [0, n] for an axis of size n",
    # The same run-time size as GroupQueryAttention's present length (onnxruntime refuses
    # a total_sequence_length above past + the new tokens).
    12: "GroupQueryAttention: total_sequence_length is above the past length plus the "
        "new sequence length",
    # A graph-level Loop with scan outputs (kiln.transform.lower_control_flow) that ran
    # more or fewer iterations than a scan output has slices.
    ERROR_LOOP_SCAN: "loop: the number of iterations differs from the length of a scan output",
    # The `terminate_check` intrinsic (kiln.transform.terminate): the caller set the
    # call's terminate flag (docs/abi.md, "Stopping a call").
    ERROR_TERMINATED: "terminated: the caller set the call's terminate flag",
}


def op_error_code(op: str) -> int:
    """The code of the check that operator `op` fails (its message starts with `op:`)."""
    for code, message in KERNEL_ERRORS.items():
        if message.startswith(f"{op}: "):
            return code
    raise IRError(f"operator {op!r} has no kernel error code")


def error_message(code: int) -> str:
    """The message of kernel error `code` (a generic one for an unknown code)."""
    return KERNEL_ERRORS.get(code, f"kernel failed with status {code}")
