"""Static memory planning: place intermediate buffers in one workspace arena.

Each buffer is a `Block` with a size in bytes and a live range `[start, end]`
of step indices (inclusive: defined at `start`, last read at `end`). Two
blocks whose live ranges overlap must not share bytes; blocks that are never
live at the same time may reuse the same bytes. The plan gives every block an
offset aligned to `alignment`, and the arena size (`total`) is the end of the
highest block, rounded up to the alignment.

Strategies (both place each block at the lowest aligned offset that fits
between the already placed blocks it conflicts with):
- "greedy-by-size": largest blocks first; usually the smallest arena.
- "first-fit": blocks in order of definition.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from kiln.errors import CompileError
from kiln.ir.dtype import INDEX_DTYPE
from kiln.ir.shape_expr import (
    dim_at_least,
    dim_text,
    dim_vars,
    eval_dim,
    monomial,
    simplify_dim,
)
from kiln.ir.tensor import BinaryOp, as_expr
from kiln.ir.types import Dim

STRATEGIES = ("greedy-by-size", "first-fit")
DEFAULT_ALIGNMENT = 64
# Largest block or arena: byte sizes and offsets are int64 in every backend (the
# code generators check the target's own, possibly 32-bit, limit: kiln.codegen.sizes).
MAX_BYTES = (1 << 63) - 1


def _label(key: Hashable) -> str:
    """How errors name a block: its `name` (graph values have one), else its key."""
    name = getattr(key, "name", None)
    if not isinstance(name, str):
        return f"block {key!r}"
    ty = getattr(key, "type", None)
    return f"tensor {name!r}" + (f" ({ty})" if ty is not None else "")


@dataclass(frozen=True, slots=True)
class Block:
    """A buffer to place: `size` bytes, live from step `start` to step `end` inclusive."""

    key: Hashable
    size: int
    start: int
    end: int

    def __post_init__(self) -> None:
        if self.size < 0:
            raise CompileError(f"{_label(self.key)}: negative size {self.size}")
        if self.size > MAX_BYTES:
            raise CompileError(f"{_label(self.key)} needs {self.size} bytes, more than any "
                               f"target can address in one object ({MAX_BYTES} bytes)")
        if self.end < self.start:
            raise CompileError(
                f"block {self.key!r}: live range ends ({self.end}) before it starts ({self.start})")

    def overlaps_in_time(self, other: Block) -> bool:
        return self.start <= other.end and other.start <= self.end


@dataclass(frozen=True)
class MemoryPlan:
    """Offsets (bytes into the arena) by block key, and the arena size."""

    offsets: Mapping[Hashable, int]
    total: int
    alignment: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "offsets", MappingProxyType(dict(self.offsets)))


def align_up(n: int, alignment: int) -> int:
    """`n` rounded up to a multiple of `alignment`."""
    return -(-n // alignment) * alignment


def plan_memory(blocks: Iterable[Block], *, alignment: int = DEFAULT_ALIGNMENT,
                strategy: str = "greedy-by-size") -> MemoryPlan:
    """Assign non-conflicting aligned offsets to `blocks` (see the module docstring)."""
    if alignment < 1 or alignment & (alignment - 1):
        raise CompileError(f"memory plan alignment must be a power of two, got {alignment}")
    if strategy not in STRATEGIES:
        raise CompileError(f"unknown memory plan strategy {strategy!r}; known: {STRATEGIES}")
    items = list(blocks)
    keys = [b.key for b in items]
    if len(set(keys)) != len(keys):
        raise CompileError("memory plan: block keys must be unique")
    order = list(range(len(items)))
    if strategy == "greedy-by-size":
        order.sort(key=lambda i: (-items[i].size, items[i].start, i))
    else:
        order.sort(key=lambda i: (items[i].start, i))
    placed = _PlacedBlocks()
    offsets: dict[Hashable, int] = {}
    for i in order:
        block = items[i]
        offset = _lowest_fit(block, placed.busy(block), alignment)
        offsets[block.key] = offset
        placed.add(block, offset)
    total = max((align_up(offsets[b.key] + b.size, alignment) for b in items), default=0)
    if total > MAX_BYTES:
        largest = max(items, key=lambda b: b.size)
        raise CompileError(
            f"the workspace arena needs {total} bytes, more than any target can address in "
            f"one object ({MAX_BYTES} bytes); its largest value is {_label(largest.key)} "
            f"({largest.size} bytes)")
    return MemoryPlan(offsets, total, alignment)


class _PlacedBlocks:
    """Placed blocks filed by time bucket, so a new block's conflicts are looked for
    among the blocks live near its own steps, not among all of them: planning a
    model whose values live a few steps each takes time linear in their number."""

    BUCKET_STEPS = 32

    def __init__(self) -> None:
        self.buckets: dict[int, list[tuple[Block, int]]] = {}

    def _keys(self, block: Block) -> range:
        return range(block.start // self.BUCKET_STEPS, block.end // self.BUCKET_STEPS + 1)

    def add(self, block: Block, offset: int) -> None:
        if block.size > 0:
            for k in self._keys(block):
                self.buckets.setdefault(k, []).append((block, offset))

    def busy(self, block: Block) -> list[tuple[int, int]]:
        """Sorted byte ranges of the placed blocks live at some step `block` is."""
        if block.size == 0:
            return []
        found: dict[int, tuple[int, int]] = {}
        for k in self._keys(block):
            for other, off in self.buckets.get(k, ()):
                if other.overlaps_in_time(block):
                    found[id(other)] = (off, off + other.size)
        return sorted(found.values())


def _lowest_fit(block: Block, busy: list[tuple[int, int]], alignment: int) -> int:
    """The lowest aligned offset where `block` clashes with none of the `busy` ranges."""
    if block.size == 0:
        return 0
    candidate = 0
    for lo, hi in busy:
        if candidate + block.size <= lo:
            break
        candidate = max(candidate, align_up(hi, alignment))
    return candidate


def check_plan(blocks: Iterable[Block], plan: MemoryPlan) -> None:
    """Raise CompileError if two simultaneously live blocks share bytes (a planner bug)."""
    items = list(blocks)
    for block in items:
        off = plan.offsets[block.key]
        if off % plan.alignment:
            raise CompileError(f"block {block.key!r} at offset {off} is not aligned")
        if off + block.size > plan.total:
            raise CompileError(f"block {block.key!r} ends past the arena ({plan.total} bytes)")
    for i, a in enumerate(items):
        for b in items[i + 1:]:
            if not a.overlaps_in_time(b) or a.size == 0 or b.size == 0:
                continue
            oa, ob = plan.offsets[a.key], plan.offsets[b.key]
            if oa < ob + b.size and ob < oa + a.size:
                raise CompileError(
                    f"blocks {a.key!r} [{oa}, {oa + a.size}) and {b.key!r} [{ob}, {ob + b.size}) "
                    f"overlap while both are live")


def live_ranges(defs: Mapping[Hashable, int],
                uses: Mapping[Hashable, Iterable[int]]) -> dict[Hashable, tuple[int, int]]:
    """Live range `(def step, last use step)` of each defined value.

    A value never used stays live at its defining step only (it is still written).
    """
    out: dict[Hashable, tuple[int, int]] = {}
    for key, start in defs.items():
        last = max(uses.get(key, ()), default=start)
        out[key] = (start, max(start, last))
    return out


# --------------------------------------------------------------------------- symbolic sizes


@dataclass
class _Slot:
    """Bytes shared by symbolic blocks that are never live together: as large as the
    largest of them (`sizes` keeps those no other one is known to cover)."""

    sizes: list[Dim]
    free_after: int


def plan_symbolic(blocks: Sequence[tuple[Hashable, Dim, int, int]], base: int, *,
                  alignment: int = DEFAULT_ALIGNMENT) -> tuple[dict[Hashable, Dim], Dim]:
    """Offsets of blocks whose sizes are expressions of dimension variables, and the end.

    `blocks` are `(key, size, start, end)` (live range as for `Block`), placed from byte
    `base` on (after the static plan). Blocks whose sizes are multiples of one product
    of variables get the static plan of the multiples, scaled by the product. The
    others are taken in definition order: each joins a slot no block of which is
    still live, preferring one at least as large for every value of the variables
    (`dim_at_least`), else the one it grows least at typical sizes, else a new slot.
    Classes and slots are laid end to end; offsets and the end are expressions the
    function evaluates once at entry (docs/dynamic-shapes.md, "Memory").
    """
    offset: Dim = align_up(base, alignment)
    offsets: dict[Hashable, Dim] = {}
    # Blocks whose sizes are multiples of one product of variables (every value of a
    # CNN with a symbolic batch; the `batch*seq` rows of a transformer): the static
    # plan of their multiples, scaled by the product, holds for every value of it.
    classes: dict[str, list[tuple[Hashable, int, int, int, Dim]]] = {}
    rest = []
    for key, size, start, end in blocks:
        factored = monomial(size)
        if factored is None:
            rest.append((key, size, start, end))
        else:
            classes.setdefault(dim_text(factored[1]), []).append(
                (key, factored[0], start, end, factored[1]))
    for members in classes.values():
        scale = members[0][4]
        # offsets in units of `scale` bytes: aligned as far as every size is (an offset of
        # 64 units for 16-byte multiples would waste 4x), at most to `alignment`
        common = math.gcd(*(c for _, c, _, _, _ in members))
        unit_alignment = min(alignment, common & -common)
        plan = plan_memory([Block(k, c, a, b) for k, c, a, b, _ in members],
                           alignment=unit_alignment)
        for key, _, _, _, _ in members:
            offsets[key] = simplify_dim(offset + plan.offsets[key] * as_expr(scale, INDEX_DTYPE))
        offset = simplify_dim(offset + plan.total * as_expr(scale, INDEX_DTYPE))
    slots: list[_Slot] = []
    member: dict[Hashable, int] = {}
    for key, size, start, end in sorted(rest, key=lambda b: (b[2], b[3])):
        free = [i for i, s in enumerate(slots) if s.free_after < start]
        covering = [i for i in free if any(dim_at_least(d, size) for d in slots[i].sizes)]
        here = _typical(size)
        # the free slot this block grows least at typical sizes (the smallest that covers)
        pick = min(covering or free or [len(slots)], key=lambda i: (
            i == len(slots), max(0, here - _typical_slot(slots[i])) if i < len(slots) else 0,
            _typical_slot(slots[i]) if i < len(slots) else 0))
        if pick == len(slots):
            slots.append(_Slot([], -1))
        slot = slots[pick]
        if not covering:
            slot.sizes = [d for d in slot.sizes if not dim_at_least(size, d)] + [size]
        slot.free_after = end
        member[key] = pick
    starts: list[Dim] = []
    for slot in slots:
        starts.append(offset)
        # the largest of multiples of `alignment` is one
        offset = simplify_dim(offset + _largest([_aligned(d, alignment) for d in slot.sizes]))
    offsets.update({key: starts[i] for key, i in member.items()})
    return offsets, offset


# The size a dimension variable is taken to have when choosing between slots (only for
# the choice: every offset holds for every size).
TYPICAL_DIM = 64


def _typical(size: Dim) -> int:
    return eval_dim(size, {v.name: TYPICAL_DIM for v in dim_vars(size)})


def _typical_slot(slot: _Slot) -> int:
    return max(_typical(d) for d in slot.sizes)


def _largest(sizes: Sequence[Dim]) -> Dim:
    out = sizes[0]
    for d in sizes[1:]:
        out = BinaryOp("max", as_expr(out, INDEX_DTYPE), as_expr(d, INDEX_DTYPE))
    return simplify_dim(out)


def _aligned(size: Dim, alignment: int) -> Dim:
    """`size` rounded up to a multiple of `alignment` (as is when every term is one)."""
    if simplify_dim(BinaryOp("floormod", as_expr(size, INDEX_DTYPE),
                             as_expr(alignment, INDEX_DTYPE))) == 0:
        return size
    return simplify_dim((as_expr(size, INDEX_DTYPE) + (alignment - 1)) // alignment
                        * alignment)
