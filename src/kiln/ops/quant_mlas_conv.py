"""`conv2d_mlas`: a float32 2-D convolution summed in the order onnxruntime's MLAS sums it.

A quantized model's convolution that onnxruntime keeps in float (a QDQ group its graph
optimizer does not fuse into QLinearConv, kiln.ops.quant_ort) is followed by a
QuantizeLinear, which turns a last-bit difference of the float sum into a whole quantum
now and then; the layers after it carry that on. This op computes the sum as MLAS's
float convolution does (its `MlasConv`: the input expanded into columns, then SGEMM), so
the quantized result is onnxruntime's (docs/quantization.md, "Files quantized by
others"):

- column n (an output position) holds the input under the window, k = (channel, tap
  row, tap column) in that order, zeros in the padding (MLAS's im2col);
- K is cut into blocks; each output's products in a block are added in k order with
  fused multiply-adds (each rounded once) starting from 0, as the SGEMM kernels of every
  x86-64 CPU with FMA do; the blocks' sums are added in order, then the bias;
- a group of one output channel (a depthwise convolution) runs MLAS's M = 1 kernel
  instead: in each block, the products (rounded) of 4 k at a time added in order,
  `((p0 + p1) + p2) + p3`, that sum added to the output so far, then 2 and 1 for the
  block's rest, no FMA;
- the blocks' length (`k_blocks`) is MLAS's choice, which follows how it splits the
  work: the output positions between onnxruntime's threads (attribute `threads`, its
  intra-op thread count) and each part's panels; for K <= 128 there is one block
  whatever the split, and the thread count matters only where a thread's share of the
  positions is small beside K.

The order is per output, so the kernel (kiln.kernels.int8.mlas_conv) is free to tile and
split the work as kiln's own GEMM convolution does.

Refused (an IRError; the caller keeps kiln's own convolution): an output of one position
(MLAS's N = 1 kernel reduces in an order that depends on the channel's place), an M-split
that leaves a thread one output channel of several, 1-D and 3-D convolutions, symbolic
shapes.

Attributes: `strides`, `pads`, `dilations`, `group` (as conv2d) and `threads`. Operands:
x `[N, C, H, W]`, w `[OC, C / group, KH, KW]`, an optional bias `[OC]`, all float32.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.ir.types import TensorType, Type
from kiln.ops import te
from kiln.ops.nn import conv_compute, conv_geometry, conv_infer
from kiln.ops.quant_elementwise import fma_f32
from kiln.ops.registry import register_op

Attrs = Mapping[str, Any]
CONV = "conv2d_mlas"

#: MLAS's SGEMM slices (`MLAS_SGEMM_STRIDEN`, `MLAS_SGEMM_STRIDEK`), the column alignment
#: of its thread split, the multiply-adds per thread before it adds one, its thread cap.
STRIDE_N = 128
STRIDE_K = 128
THREAD_ALIGN = 16
THREAD_COMPLEXITY = 64 * 1024
MAX_THREADS = 16


@dataclass(frozen=True)
class Shape:
    """The GEMM MLAS runs per image and group: `filters` x `positions` x `k`."""

    batch_groups: int
    filters: int
    positions: int
    k: int
    direct: bool  # MLAS's GemmDirect: the input is B as it is (1x1, stride 1, no pads)



def m1_steps(length: int) -> list[int]:
    """How MLAS's M = 1 kernel takes a block of `length` k: 4 at a time, then 2, then 1
    (the order of its sums, which the reference and the kernel follow)."""
    return [4] * (length // 4) + ([2] if length % 4 >= 2 else []) + ([1] if length % 2 else [])

def sgemm_stride_k(n: int, k: int) -> int:
    """The K slice of `MlasSgemmOperation` for an N x K panel: narrower when N is wide
    beside K (every block then holds all of K), wider when N is small. `MlasConvOperation`
    slices a segment of N positions the same way, and its SGEMM calls keep each slice
    whole."""
    stride_n, stride_k = STRIDE_N, STRIDE_K
    if n >= k:
        while stride_k // 2 >= k:
            stride_n, stride_k = stride_n * 2, stride_k // 2
    else:
        while stride_n > 16 and stride_n // 2 >= n:
            stride_n, stride_k = stride_n // 2, stride_k * 2
    return stride_k


def _partition(index: int, count: int, total: int) -> tuple[int, int]:
    """`MlasPartitionWork`: thread `index`'s (start, count) of `total` items."""
    per, extra = divmod(total, count)
    if index < extra:
        return (per + 1) * index, per + 1
    return per * index + extra, per


def _gemm_blocks(s: Shape, threads: int) -> list[tuple[int, int, int]]:
    """`MlasGemm` (GemmDirect, ExpandThenGemm): the columns split between threads in
    16-column blocks when N > M (else the rows, which leaves N whole), each thread's
    `MlasSgemmOperation` with its own K slice."""
    work = s.filters * s.positions * s.k
    count = min(int(work / THREAD_COMPLEXITY) + 1, threads)
    if s.positions <= s.filters:
        if s.filters < 2 * count:
            raise IRError(f"{CONV}: {s.filters} output channels over {count} threads would "
                          "leave a thread one channel (MLAS's M = 1 kernel)")
        return [(0, s.positions, sgemm_stride_k(s.positions, s.k))]
    blocks = -(-s.positions // THREAD_ALIGN)
    count = min(count, blocks)
    out = []
    for t in range(count):
        start, n = _partition(t, count, blocks)
        start *= THREAD_ALIGN
        n = min(s.positions - start, n * THREAD_ALIGN)
        if n > 0:
            out.append((start, start + n, sgemm_stride_k(n, s.k)))
    return out


def _segment_blocks(s: Shape, threads: int) -> list[tuple[int, int, int]]:
    """ExpandThenGemmSegmented: the positions cut into one segment per thread (16-aligned,
    as `MlasConvPrepare` computes them), each expanded and multiplied in K slices."""
    if s.batch_groups > 1:  # threads take whole images and groups
        return [(0, s.positions, sgemm_stride_k(s.positions, s.k))]
    work = s.filters * s.positions * s.k
    count = int(work / THREAD_COMPLEXITY) + 1 if work < THREAD_COMPLEXITY * MAX_THREADS \
        else MAX_THREADS
    count = min(count, threads)
    stride = -(-s.positions // count)
    if count > 1:
        stride = (stride + THREAD_ALIGN - 1) & ~(THREAD_ALIGN - 1)
    if stride >= s.positions:
        return [(0, s.positions, sgemm_stride_k(s.positions, s.k))]
    return [(start, min(start + stride, s.positions),
             sgemm_stride_k(min(stride, s.positions - start), s.k))
            for start in range(0, s.positions, stride)]


def k_blocks(s: Shape, threads: int) -> tuple[tuple[int, int, int], ...]:
    """(first position, end position, K block length) for every range of output positions
    that MLAS sums alike, given onnxruntime's intra-op `threads`."""
    if threads < 1:
        raise IRError(f"{CONV}: threads must be at least 1, got {threads}")
    if s.positions == 1:
        raise IRError(f"{CONV}: MLAS sums a single output position with its N = 1 kernel "
                      "(its reduction depends on the channel's place), not reproduced")
    if s.filters == 1 and (s.direct or s.filters > s.positions):
        return ((0, s.positions, s.k),)  # its M = 1 kernel takes all of K at once
    if s.direct and s.batch_groups > 1:  # one MlasSgemmOperation per image and group
        return ((0, s.positions, sgemm_stride_k(s.positions, s.k)),)
    if s.direct or s.filters > s.positions:
        return tuple(_gemm_blocks(s, threads))
    return tuple(_segment_blocks(s, threads))


def default_threads() -> int:
    """onnxruntime's default intra-op thread count on this host: its physical cores (CPUs
    that share a core and a package count once), or the CPU count where the topology is
    not readable.

    A read of the host compiling the model, so only the quantize-ops pass calls it
    (kiln.transform.quantize_ops: the default of its `threads` option), once, and records
    the count in each `conv2d_mlas` call's `threads` attribute; the op's rules and its
    kernel (kiln.kernels.int8.mlas_conv) read that attribute, never the host."""

    cores = set()
    for cpu in glob.glob("/sys/devices/system/cpu/cpu[0-9]*/topology"):
        try:
            with open(os.path.join(cpu, "physical_package_id")) as a, \
                    open(os.path.join(cpu, "core_id")) as b:
                cores.add((a.read().strip(), b.read().strip()))
        except OSError:
            continue
    return len(cores) or os.cpu_count() or 1


# --------------------------------------------------------------------------- the op

@dataclass(frozen=True)
class Geometry:
    """A 2-D convolution's sizes (static), as the kernel and the reference read them."""

    batch: int
    channels: int
    height: int
    width: int
    filters: int
    kernel: tuple[int, int]
    strides: tuple[int, int]
    dilations: tuple[int, int]
    begins: tuple[int, int]
    ends: tuple[int, int]
    group: int
    out: tuple[int, int]

    @property
    def k(self) -> int:
        return self.channels // self.group * self.kernel[0] * self.kernel[1]

    @property
    def positions(self) -> int:
        return self.out[0] * self.out[1]

    def shape(self) -> Shape:
        direct = self.strides == (1, 1) and not any(self.begins + self.ends) \
            and self.kernel == (1, 1)
        return Shape(self.batch * self.group, self.filters // self.group, self.positions,
                     self.k, direct)


def geometry(x: Sequence[Any], w: Sequence[Any], attrs: Attrs) -> Geometry:
    """The static geometry of a `conv2d_mlas` call, checked."""
    if len(x) != 4 or not all(isinstance(d, int) for d in (*x, *w)):
        raise IRError(f"{CONV}: a 2-D convolution of static shapes, got input {tuple(x)}")
    _, strides, dilations, begins, ends = conv_geometry(x, w, attrs, CONV)
    group = int(attrs.get("group", 1))
    out = tuple((x[2 + j] + begins[j] + ends[j] - dilations[j] * (w[2 + j] - 1) - 1)
                // strides[j] + 1 for j in range(2))
    return Geometry(int(x[0]), int(x[1]), int(x[2]), int(x[3]), int(w[0]),
                    (int(w[2]), int(w[3])), (strides[0], strides[1]),
                    (dilations[0], dilations[1]), (begins[0], begins[1]), (ends[0], ends[1]),
                    group, (int(out[0]), int(out[1])))


def _infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    if any(t.dtype != "float32" for t in types):
        raise IRError(f"{CONV}: float32 operands only, got "
                      f"{', '.join(t.dtype for t in types)}")
    out = conv_infer(types, attrs)
    geo = geometry(types[0].shape, types[1].static_shape, attrs)
    k_blocks(geo.shape(), threads_attr(attrs))
    return out


def threads_attr(attrs: Attrs) -> int:
    """The call's `threads` attribute (onnxruntime's intra-op thread count), checked."""
    threads = attrs.get("threads")
    if not isinstance(threads, int) or isinstance(threads, bool):
        raise IRError(f"{CONV}: attribute threads (onnxruntime's intra-op thread count) "
                      f"must be an int, got {threads!r}")
    return threads


def columns_ref(x: np.ndarray, geo: Geometry) -> np.ndarray:
    """MLAS's im2col of every image and group: `[batch * group][K][positions]`."""
    (kh, kw), (sh, sw), (dh, dw) = geo.kernel, geo.strides, geo.dilations
    xp = np.pad(x, ((0, 0), (0, 0), (geo.begins[0], geo.ends[0]), (geo.begins[1], geo.ends[1])))
    oh, ow = geo.out
    cols = np.empty((geo.batch, geo.channels, kh, kw, oh, ow), np.float32)
    for i in range(kh):
        for j in range(kw):
            cols[:, :, i, j] = xp[:, :, i * dh:i * dh + (oh - 1) * sh + 1:sh,
                                  j * dw:j * dw + (ow - 1) * sw + 1:sw]
    return cols.reshape(geo.batch * geo.group, geo.k, oh * ow)


def conv2d_mlas_ref(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None,
                    **attrs: Any) -> np.ndarray:
    """numpy conv2d_mlas: MLAS's sums, each fused multiply-add rounded once."""
    geo = geometry(x.shape, w.shape, attrs)
    cols = columns_ref(np.asarray(x, np.float32), geo)
    per = geo.filters // geo.group
    weights = np.asarray(w, np.float32).reshape(geo.group, per, geo.k)
    out = np.empty((geo.batch * geo.group, per, geo.positions), np.float32)
    for n0, n1, stride in k_blocks(geo.shape(), threads_attr(attrs)):
        for bg in range(geo.batch * geo.group):
            wg, col = weights[bg % geo.group], cols[bg, :, n0:n1]
            blocks = [(k0, min(k0 + stride, geo.k)) for k0 in range(0, geo.k, stride)]
            out[bg, :, n0:n1] = (_m1_ref if per == 1 else _blocked_ref)(wg, col, blocks)
    y = out.reshape(geo.batch, geo.filters, *geo.out)
    if bias is not None:
        y = (y + np.asarray(bias, np.float32).reshape(1, -1, 1, 1)).astype(np.float32)
    return y


def _blocked_ref(w: np.ndarray, col: np.ndarray, blocks: list[tuple[int, int]]) -> np.ndarray:
    """`w @ col` (`[M][K] @ [K][N]`): each block from 0 with FMAs, the blocks added."""
    total = None
    for k0, k1 in blocks:
        part = np.zeros((w.shape[0], col.shape[1]), np.float32)
        for kk in range(k0, k1):
            part = fma_f32(w[:, kk:kk + 1], col[kk:kk + 1], part)
        total = part if total is None else (total + part).astype(np.float32)
    assert total is not None
    return total


def _m1_ref(w: np.ndarray, col: np.ndarray, blocks: list[tuple[int, int]]) -> np.ndarray:
    """`w @ col` for one row as MLAS's M = 1 kernel sums it (the module docstring)."""
    total = np.zeros((1, col.shape[1]), np.float32)
    with np.errstate(all="ignore"):
        for k0, k1 in blocks:
            k = k0
            for step in m1_steps(k1 - k0):
                part = (w[:, k:k + 1] * col[k:k + 1]).astype(np.float32)
                for j in range(1, step):
                    part = (part + w[:, k + j:k + j + 1] * col[k + j:k + j + 1]).astype(
                        np.float32)
                total = (part + total).astype(np.float32)
                k += step
    return total


def _compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    # the definition's value (the static-shape kernel is the one that runs: the sums in
    # MLAS's order)
    return conv_compute(inputs, attrs)


register_op(CONV, pattern="anchor", infer=_infer, compute=_compute,
            reference=conv2d_mlas_ref)

