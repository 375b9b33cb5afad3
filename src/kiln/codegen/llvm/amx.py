"""The AMX tile calls (kiln.ir.amx) defined inside the module: inline assembly on fixed
tile registers.

A kernel's `CallExtern` of an AMX call name gets a private, always-inlined function of
that name in the module it is lowered into (`amx_helper`), so nothing is left to link.
The tiles are fixed registers: a block of `tm` x `tn` tiles keeps its accumulators in
`tmm0`.. (`tm * tn` of them), then its A tiles, then its B tiles, at most the eight
registers. LLVM's own AMX intrinsics (`llvm.x86.tileloadd64.internal`, with their
`x86_amx` values) would leave the register choice and `ldtilecfg` to LLVM, which then
configures the tiles at every function entry; kiln configures them once per parallel
tile instead (kiln.kernels.gemm.bf16), which the intrinsics cannot express. Every
statement is `asm sideeffect` with a memory clobber, so LLVM keeps them in order and
around the kernel's own loads and stores of the buffers.
"""

from __future__ import annotations

from llvmlite import ir

from kiln.ir import amx

I8, I32, I64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
PTR = ir.PointerType()
VOID = ir.VoidType()
#: Bytes of one int32 or float32 element.
_WORD = 4
_PALETTE = "__kiln_amx_palette"


def _palette(module: ir.Module) -> ir.GlobalVariable:
    """The 64-byte tile configuration: palette 1, every tile 16 rows of 64 bytes."""
    if _PALETTE in module.globals:
        found = module.globals[_PALETTE]
        assert isinstance(found, ir.GlobalVariable)
        return found
    data = bytearray(64)
    data[0] = 1  # palette 1
    for t in range(8):
        data[16 + 2 * t] = amx.TILE_WORDS * _WORD  # colsb, little-endian uint16
        data[48 + t] = amx.TILE_ROWS  # rows
    ty = ir.ArrayType(I8, 64)
    glob = ir.GlobalVariable(module, ty, _PALETTE)
    glob.linkage = "private"
    glob.global_constant = True
    glob.align = 64
    glob.initializer = ir.Constant(ty, data)
    return glob


def _asm(b: ir.IRBuilder, text: str, args: list[ir.Value]) -> None:
    """`text` as one side-effecting asm statement reading `args` from registers."""
    ftype = ir.FunctionType(VOID, [a.type for a in args])
    constraints = ",".join(["r"] * len(args) + ["~{memory}"])
    b.call(ir.InlineAsm(ftype, text, constraints, side_effect=True), args)


def _function(module: ir.Module, name: str, args: list[ir.Type]) -> tuple[ir.Function,
                                                                           ir.IRBuilder]:
    fn = ir.Function(module, ir.FunctionType(I32, args), name)
    fn.linkage = "private"
    fn.attributes.add("alwaysinline")
    fn.attributes.add("nounwind")
    return fn, ir.IRBuilder(fn.append_basic_block("entry"))


def _config(module: ir.Module, name: str) -> ir.Function:
    fn, b = _function(module, name, [])
    if name == amx.AMX_TILE_CONFIG:
        _asm(b, "ldtilecfg ($0)", [b.bitcast(_palette(module), PTR)])
    else:
        _asm(b, "tilerelease", [])
    b.ret(ir.Constant(I32, 0))
    return fn


def _at(b: ir.IRBuilder, base: ir.Value, words: ir.Value) -> ir.Value:
    """`base` advanced by `words` 4-byte elements."""
    return b.gep(base, [b.mul(words, ir.Constant(I64, _WORD))], source_etype=I8)


def _block(module: ir.Module, name: str, tm: int, tn: int) -> ir.Function:
    """`amx_bf16_block(tm, tn)`: tilezero the accumulators, one asm statement per step
    of 16 words (the A and B tile loads, then every tdpbf16ps), then tilestored."""
    fn, b = _function(module, name, [PTR, PTR, PTR, I64, I64, I64, I64, I64, I64])
    c, a_base, bm, a_offset, b_offset, steps, lda, ldb, ldc = fn.args
    acc = [[i * tn + j for j in range(tn)] for i in range(tm)]
    a_reg = [tm * tn + i for i in range(tm)]
    b_reg = [tm * tn + tm + j for j in range(tn)]
    for row in acc:
        for t in row:
            _asm(b, f"tilezero %tmm{t}", [])
    words = ir.Constant(I64, amx.TILE_WORDS)
    four = ir.Constant(I64, _WORD)
    a_stride, b_stride = b.mul(lda, four), b.mul(ldb, four)
    a, b_base = _at(b, a_base, a_offset), _at(b, bm, b_offset)
    head, body, done = (fn.append_basic_block(x) for x in ("step", "body", "done"))
    entry = b.block
    b.branch(head)
    b.position_at_end(head)
    s = b.phi(I64, "s")
    s.add_incoming(ir.Constant(I64, 0), entry)
    b.cbranch(b.icmp_signed("<", s, steps), body, done)
    b.position_at_end(body)
    k0 = b.mul(s, words)  # the step's first word
    pa = [_at(b, a, b.add(b.mul(ir.Constant(I64, i * amx.TILE_ROWS), lda), k0))
          for i in range(tm)]
    pb = [_at(b, b_base, b.add(b.mul(k0, ldb), ir.Constant(I64, j * amx.TILE_WORDS)))
          for j in range(tn)]
    lines = [f"tileloadd (${i},${tm + tn},1), %tmm{a_reg[i]}" for i in range(tm)]
    lines += [f"tileloadd (${tm + j},${tm + tn + 1},1), %tmm{b_reg[j]}" for j in range(tn)]
    lines += [f"tdpbf16ps %tmm{b_reg[j]}, %tmm{a_reg[i]}, %tmm{acc[i][j]}"
              for i in range(tm) for j in range(tn)]
    _asm(b, "\n\t".join(lines), [*pa, *pb, a_stride, b_stride])
    s.add_incoming(b.add(s, ir.Constant(I64, 1)), body)
    b.branch(head)
    b.position_at_end(done)
    c_stride = b.mul(ldc, four)
    for i in range(tm):
        for j in range(tn):
            at = b.add(b.mul(ir.Constant(I64, i * amx.TILE_ROWS), ldc),
                       ir.Constant(I64, j * amx.TILE_WORDS))
            _asm(b, f"tilestored %tmm{acc[i][j]}, ($0,$1,1)", [_at(b, c, at), c_stride])
    b.ret(ir.Constant(I32, 0))
    return fn


def amx_helper(module: ir.Module, name: str) -> ir.Function:
    """The module's definition of the AMX call `name` (kiln.ir.amx), made on first use."""
    if name in module.globals:
        found = module.globals[name]
        assert isinstance(found, ir.Function)
        return found
    shape = amx.block_shape(name)
    if shape is not None:
        return _block(module, name, *shape)
    return _config(module, name)
