"""MatMulNBits nodes packed by hand (com.microsoft's layout), for the tests of its import
(tests/frontend/test_contrib_llm_ops.py) and of its kernels
(tests/ops/kernels/test_matmul_nbits.py)."""

from __future__ import annotations

import numpy as np

from support.graphs import GraphBuilder

MS = "com.microsoft"


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """uint8 bytes of `codes` ([rows, count], count a multiple of 8 // bits), low bits
    first: MatMulNBits' packing, written independently of kiln's unpacking."""
    per = 8 // bits
    rows = codes.reshape(codes.shape[0], -1, per).astype(np.uint16)
    out = np.zeros(rows.shape[:2], np.uint16)
    for i in range(per):
        out |= rows[..., i] << (i * bits)
    return out.astype(np.uint8)


def hand_packed(b: GraphBuilder, name: str, bits: int, k: int, n: int, block: int, *,
                zp: str = "packed", g_idx: bool = False, bias: bool = False,
                rows: tuple[int | str, ...] = ("batch", "seq")) -> None:
    """A MatMulNBits node on input `a_{name}` ([*rows, k]) to output `y_{name}`:
    random codes and scales, zero points packed uint8 ("packed"), float ("float") or
    none (the default 2^(bits-1)); act-order `g_idx` (a permutation of the K rows'
    blocks); a bias."""
    rng = b.rng
    blocks = -(-k // block)
    codes = rng.integers(0, 1 << bits, (n, blocks * block))
    inputs = [b.input(f"a_{name}", [*rows, k]),
              b.const(pack_codes(codes, bits).reshape(n, blocks, block * bits // 8)),
              b.const(rng.uniform(0.01, 0.1, (n, blocks)).astype(np.float32))]
    if zp == "packed":
        zps = rng.integers(0, 1 << bits, (n, blocks + (-blocks) % (8 // bits)))
        inputs.append(b.const(pack_codes(zps, bits)))
    elif zp == "float":
        inputs.append(b.const(rng.uniform(0, 1 << bits, (n, blocks)).astype(np.float32)))
    else:
        inputs.append("")
    if g_idx:
        inputs.append(b.const(rng.permutation(np.arange(k) // block).astype(np.int32)))
    if bias:
        inputs += [""] * (5 - len(inputs)) + [b.const(rng.normal(0, 1, n).astype(np.float32))]
    b.node("MatMulNBits", inputs, [f"y_{name}"], domain=MS, K=k, N=n, bits=bits,
           block_size=block)
    b.output(f"y_{name}", [*rows, n])
