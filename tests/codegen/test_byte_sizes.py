"""Byte sizes past the address space are compile errors that name the tensor.

A 171-byte ONNX model that Expands to [2**62, 4] float32 (2**66 bytes) used to
compile, wrap its workspace size in the generated C and crash on the first
call. Sizes are now checked at compile time: against int64 in the memory plan,
against the target's pointer width (PTRDIFF_MAX) in both code generators.
"""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.codegen.sizes import max_object_bytes, triple_pointer_bits
from kiln.errors import CompileError
from kiln.frontend.onnx import from_onnx
from kiln.ir import IRBuilder
from kiln.transform.memory_plan import MAX_BYTES, Block, plan_memory
from support.graphs import GraphBuilder


def expand_model(shape: list[int], out_shape: list[int], reduce: bool) -> bytes:
    """x[4] -> Expand(shape) -> Relu (-> ReduceMax over axis 0 when `reduce`)."""
    b = GraphBuilder()
    b.node("Expand", ["x", "shape"], ["big"], name="expand")
    b.node("Relu", ["big"], ["r" if reduce else "y"], name="relu")
    if reduce:
        b.node("ReduceMax", ["r"], ["y"], axes=[0], keepdims=1)
    b.input("x", [4])
    b.output("y", out_shape)
    b.const(np.array(shape, np.int64), name="shape")
    return b.model(ir_version=None)


@pytest.mark.parametrize("target", ["c", "llvm"])
def test_expand_to_2_62_by_4_is_a_compile_error(target: str) -> None:
    model = expand_model([2**62, 4], [1, 4], reduce=True)
    assert len(model.SerializeToString()) < 200
    with pytest.raises(CompileError, match=r"tensor '\w+' .*needs 73786976294838206464 bytes"):
        kiln.compile(from_onnx(model), target)


@pytest.mark.parametrize("target", ["c", "llvm"])
def test_oversized_result_names_the_parameter(target: str) -> None:
    model = expand_model([2**62, 4], [2**62, 4], reduce=False)
    with pytest.raises(CompileError, match=r"parameter 'y' of function 'main'"):
        kiln.compile(from_onnx(model), target)


def big_param_module(n: int) -> kiln.ir.IRModule:
    ib = IRBuilder()
    with ib.prim_func("f"):
        x = ib.arg("huge_input", (n,), "float32")
        y = ib.arg("Y", (1,), "float32")
        ib.store(y, [0], x[0])
    return ib.get()


@pytest.mark.parametrize("target", ["c -mtriple=thumbv7em-none-eabi",
                                    "llvm -mtriple=thumbv7em-none-eabi",
                                    "c -mtriple=i686-linux-gnu"])
def test_32_bit_targets_have_a_2_gib_object_limit(target: str) -> None:
    # 2**29 float32 = 2 GiB: one byte past PTRDIFF_MAX of a 32-bit target.
    with pytest.raises(CompileError, match=r"'huge_input' .* 32-bit target .*2147483647"):
        kiln.compile(big_param_module(2**29), target)
    kiln.compile(big_param_module(2**29 - 16), target)  # fits
    kiln.compile(big_param_module(2**29), "c")  # this 64-bit machine takes it


def test_pointer_widths_of_triples() -> None:
    assert triple_pointer_bits("x86_64-linux-gnu") == 64
    assert triple_pointer_bits("aarch64-linux-gnu") == 64
    assert triple_pointer_bits("riscv32-unknown-elf") == 32
    assert triple_pointer_bits("wasm32-unknown-unknown") == 32
    assert triple_pointer_bits("armv7-linux-gnueabihf") == 32
    assert max_object_bytes(32) == 2**31 - 1


def test_memory_plan_checks_blocks_and_the_arena() -> None:
    with pytest.raises(CompileError, match="needs"):
        Block("b", MAX_BYTES + 1, 0, 0)
    # Two blocks live at once, each fits, together they do not.
    blocks = [Block("a", MAX_BYTES // 2 + 64, 0, 1), Block("b", MAX_BYTES // 2 + 64, 0, 1)]
    with pytest.raises(CompileError, match="workspace arena needs"):
        plan_memory(blocks)
