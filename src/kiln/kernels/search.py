"""The search space kiln.tuning measures for one kernel call, as params:

- `{"tile": [...]}`: the family's register tile (its `candidates`);
- `{"tile": [...], "split": S}`: the rule's tile with the parallel split S
  (kiln.kernels.tiles.PARALLEL_SPLITS: one thread, or the tile loop split over
  threads in the other order, or parallel below the work threshold);
- `{"tile": [...], "kblock": true}`: the rule's tile with the sums blocked along K
  for the ISA's caches (kiln.kernels.gemm.knobs.KBlocking; the GEMM kernels, where K
  is deeper than one block: off by rule, since on average it does not pay);
- `{"tile": [...], "ksegment": C}`: the blocked direct convolution (`conv_direct`)
  with its sums K-blocked in segments of C input channels (0: unblocked; 16, 32, 64
  where they divide the group's channels in two or more: `legal_segments`), other
  than its rule's (kiln.kernels.conv.direct.choose_k_blocking);
- `{"tile": [...], "unroll": U}`: the rule's tile with the K (reduction) loop of the
  register tile unrolled by U (2, 4, 8 up to a static K: the GEMM kernels' K, the
  blocked direct convolution's input channels per group; `unrolls`), the sums in the
  rule's order (kiln.kernels.gemm.micro_kernel.reduction_loop; the rule leaves it to LLVM);
- `{"family": F, "tile": [...]}`: another convolution algorithm F (`conv_direct`,
  `conv_rows`, `conv_gemm`, `conv_grouped`, `conv_winograd`) with its rule's tile (or
  the tiles it offers: `offered_tiles`), where F computes the call (`computes`);
- a `KernelChoice`'s own params, asked by the pass that makes the choice, not by a
  family's `pack`: `{"library": "cblas" | "own"}` of kiln.ops.cblas.LIBRARY_CHOICE
  (a float32 product calls CBLAS or kiln's GEMM, where the target's `libs` allow it).

Every variant is legal by construction: tiles come from the ISA object (the families'
`candidates`), a split only reorders independent tiles, and an algorithm is offered
only for the calls its kernel computes, K blocking computes the same sums in
another order, an unroll the same sums in the same order. `variants` lists them most
promising first (the Winograd kernel where it computes the call, splits, K blocking,
unrolls and the other algorithms, then tiles nearest the rule's), the order `kiln tune`
tries them in; `pack_params` packs a call with one (what a tuned compile does), after
checking it is one of the call's variants: a tile must be the rule's or one the family
lists (`legal_tiles`), so a database edited by hand cannot make a kernel of any other
tile. `check_database` checks, before a compile, that every record names a known
kernel and only the parameters that kernel takes (`kernel_parameters`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, cast, runtime_checkable

from kiln.errors import UsageError, shown
from kiln.ir import graph as g
from kiln.ir.types import TensorType
from kiln.kernels.gemm.knobs import TUNED_UNROLLS, GemmTiling, choose_k_blocking
from kiln.kernels.parallel_work import worth_parallel
from kiln.kernels.registry import KBLOCK, KERNELS, SPLIT, UNROLL, KernelFamily
from kiln.kernels.tiles import PARALLEL_SPLITS, tile_lanes
from kiln.ops.cblas import LIBRARY, LIBRARY_CHOICE
from kiln.ops.conv_direct import KSEGMENT, legal_segments
from kiln.ops.conv_geometry import conv_call_shape
from kiln.ops.nn import b_shape
from kiln.ops.packed_attrs import TILE
from kiln.ops.winograd import eligible
from kiln.target.isa import ISA
from kiln.tuning.apply import MODEL_KNOBS, NCHWC_REGION, PARALLEL_THRESHOLD, Session, signature

#: The convolution families an ungrouped or grouped float32 `conv2d` may take.
CONV_ALGORITHMS = ("conv_direct", "conv_rows", "conv_gemm", "conv_grouped", "conv_winograd")
#: The Winograd family (not the default rule's; offered first where it computes a call).
WINOGRAD = "conv_winograd"
#: Families whose parallel loop is a tile loop the split reorders (the depthwise
#: kernel's rows are split by the `parallelize` pass instead).
SPLIT_FAMILIES = ("gemm", "gemm_tiled", "conv_direct", "conv_rows", "conv_gemm",
                  "conv_grouped")
#: Families whose kernel is kiln.kernels.gemm.loop_nest.gemm_body (K blocking applies).
KBLOCK_FAMILIES = ("gemm", "gemm_tiled", "conv_gemm", "conv_grouped")
#: Families whose K (reduction) loop may be unrolled (`{"unroll": U}`).
UNROLL_FAMILIES = (*KBLOCK_FAMILIES, "conv_direct")
#: The GEMM convolution families (one product per image, or per image and group).
CONV_GEMMS = ("conv_gemm", "conv_grouped")
#: The parameters a kernel family's variant may hold.
FAMILY_PARAMS = ("tile", SPLIT, KBLOCK, KSEGMENT, UNROLL, "family")
#: Tiles an error lists before it says how many more there are.
SHOWN_TILES = 12

Params = dict[str, Any]


@runtime_checkable
class KernelChoice(Protocol):
    """A kernel-level choice other than a family's variants (kiln.ops.cblas's library
    choice): tuning records it as the pseudo-kernel `name`, the pass that makes the
    choice asks the tuning session for it with this object as the family."""

    name: str

    def rule_params(self, call: g.Call, isa: ISA) -> Params:
        """The rule's choice for `call`."""
        ...

    def other_params(self, call: g.Call, isa: ISA) -> list[Params]:
        """The other legal choices for `call` (they compute the same result)."""
        ...

    def kernel_params(self, call: g.Call, isa: ISA) -> Params:
        """The choice that leaves `call` to kiln's kernel families, whose own variants
        tuning then records and builds (kiln.tuning.apply's `Recorder`, `Forced`)."""
        ...


def computes(name: str, call: g.Call, isa: ISA) -> bool:
    """Whether the convolution family `name` computes `call` (not: whether its rule
    picks it): the blocked kernel any float32 conv the families take, the GEMM one any
    ungrouped one, the grouped GEMM one any grouped one but a depthwise, the Winograd one
    a 3x3 ungrouped one of stride and dilation 1, the row-tiled
    one an ungrouped one with rows of at least a vector."""

    shape = conv_call_shape(call)
    if shape is None or name not in CONV_ALGORITHMS:
        return False
    if name == "conv_direct":
        return True
    if name == WINOGRAD:  # 3x3, stride and dilation 1, ungrouped (any padding)

        return eligible(shape)
    if name == "conv_grouped":
        return shape.groups != 1 and not shape.depthwise
    if shape.groups != 1:
        return False
    return name == "conv_gemm" or shape.out_w >= tile_lanes(isa)


def default_params(family: KernelFamily | KernelChoice, call: g.Call, isa: ISA) -> Params:
    """The rule's variant: its tile (a `KernelChoice`'s: its rule's params)."""
    if isinstance(family, KernelChoice):
        return family.rule_params(call, isa)
    tile = family.pack(call, isa).attrs[TILE]
    assert isinstance(tile, tuple)
    return {"tile": list(tile)}


def _work(family: KernelFamily, call: g.Call) -> int | None:
    """Multiply-adds of a call whose kernel goes parallel only above the work
    threshold (the GEMM families), None for the others (always parallel)."""
    if family.name in CONV_GEMMS:
        s = conv_call_shape(call)
        assert s is not None
        n = s.n if isinstance(s.n, int) else 1
        return n * s.c_out * s.ci_group * s.kh * s.kw * s.out_h * s.out_w
    if family.name in ("gemm", "gemm_tiled"):
        a, b = (x.type for x in call.args)
        assert isinstance(a, TensorType) and isinstance(b, TensorType)
        work = int(b_shape(cast(Sequence[int], b.shape), call.attrs)[-1])  # N
        for d in a.shape:  # batch x M x K (a symbolic size counts as 1)
            work *= d if isinstance(d, int) else 1
        return work
    return None


def _gemm_m_k(name: str, call: g.Call) -> tuple[object, object]:
    """M and K (ints, or symbolic) of the product the GEMM family `name` computes for
    `call` (per image, or per image and group)."""
    m: object
    k: object
    if name in CONV_GEMMS:
        s = conv_call_shape(call)
        assert s is not None
        m, k = s.c_out // s.groups, s.ci_group * s.kh * s.kw
    else:
        a, b = (x.type for x in call.args)
        assert isinstance(a, TensorType) and isinstance(b, TensorType)
        m, k = a.shape[-2], b_shape(cast(Sequence[int], b.shape), call.attrs)[-2]
    return m, k


def blocks_k(family: KernelFamily, call: g.Call, isa: ISA, tile: Sequence[int]) -> bool:
    """Whether K blocking changes the kernel of `call` with `tile`: a GEMM family, static
    M and K, and K deeper than one block (kiln.kernels.gemm.knobs.choose_k_blocking)."""

    if family.name not in KBLOCK_FAMILIES:
        return False
    m, k = _gemm_m_k(family.name, call)
    if not isinstance(m, int) or not isinstance(k, int):
        return False
    return choose_k_blocking(m, k, GemmTiling(tile[0], tile[1]), isa.l1d_bytes,
                             isa.l2_bytes) is not None


def unrolls(name: str, call: g.Call) -> list[int]:
    """The K unroll factors the family `name` may take for `call`
    (kiln.kernels.gemm.knobs.TUNED_UNROLLS no larger than a static K: the GEMM kernels'
    K, the blocked direct kernel's input channels per group where its taps are 1x1;
    none for the other families, or a symbolic K). A KxK layer's channel loop is not
    unrolled: U copies of its tap loops do not pay at any U (docs/tuning.md)."""

    if name not in UNROLL_FAMILIES:
        return []
    if name == "conv_direct":
        shape = conv_call_shape(call)
        k: object = (shape.ci_group if shape is not None and (shape.kh, shape.kw) == (1, 1)
                     else None)
    else:
        k = _gemm_m_k(name, call)[1]
    return [u for u in TUNED_UNROLLS if isinstance(k, int) and u <= k]


def _legal_segments(call: g.Call) -> list[int]:
    shape = conv_call_shape(call)
    return [] if shape is None else legal_segments(shape)


def segments(call: g.Call, isa: ISA, tile: Sequence[int]) -> list[int]:
    """The K-blocking segments (input channels, 0: unblocked) the blocked direct
    kernel may take for `call` with `tile`, other than its rule's."""

    shape = conv_call_shape(call)
    assert shape is not None
    # the blocked family's rule, asked by name (kiln.kernels.conv.direct: ops import no
    # kernels)
    family: Any = KERNELS.get("conv_direct")
    rule = family.rule_segment(shape, tuple(tile), isa)
    return [k for k in _legal_segments(call) if k != rule]


def variants(family: KernelFamily | KernelChoice, call: g.Call, isa: ISA) -> list[Params]:
    """The legal variants of `call` other than the rule's (`default_params`), most
    promising first (see the module docstring)."""
    if isinstance(family, KernelChoice):
        return family.other_params(call, isa)
    rule = default_params(family, call, isa)
    out: list[Params] = []
    algorithms: list[Params] = []
    if call.op == "conv2d":
        for name in CONV_ALGORITHMS:
            other = KERNELS.get(name)
            if name != family.name and computes(name, call, isa):
                # a family may offer more than its rule's tile (Winograd: both tile sizes)
                offered = getattr(other, "offered_tiles", None)
                algorithms += ([{"family": name, "tile": list(t)} for t in offered(call, isa)]
                               if callable(offered) else
                               [{"family": name, **default_params(other, call, isa)}])
    # Winograd first: 4x fewer multiplies (F(4x4)), the likeliest gain of a 3x3 layer
    out += [p for p in algorithms if p["family"] == WINOGRAD]
    if family.name in SPLIT_FAMILIES:
        work = _work(family, call)
        rule_split = ("serial" if work is not None and not worth_parallel(work, "madd", isa)
                      else "outer")
        out += [{**rule, SPLIT: s} for s in PARALLEL_SPLITS if s != rule_split]
    if family.name == "conv_direct":
        out += [{**rule, KSEGMENT: k} for k in segments(call, isa, rule["tile"])]
    if blocks_k(family, call, isa, rule["tile"]):
        out.append({**rule, KBLOCK: True})
    out += [{**rule, UNROLL: u} for u in unrolls(family.name, call)]
    out += [p for p in algorithms if p["family"] != WINOGRAD]
    candidates = getattr(family, "candidates", None)
    if callable(candidates):
        out += [{"tile": list(t)} for t in candidates(call, isa)]
    return out


def pack_params(family: KernelFamily, call: g.Call, isa: ISA, params: Mapping[str, Any]
                ) -> g.Call:
    """`call` packed as `params` says: by `params["family"]` (default: `family`), with its
    tile and, when given, the parallel split recorded in the `split` attribute."""
    name = params.get("family", family.name)
    if name != family.name and not computes(name, call, isa):
        raise UsageError(f"the {name!r} kernel does not compute {call.op} calls like this "
                         f"one (the {family.name!r} family's)")
    split = params.get("split")
    if split is not None and (split not in PARALLEL_SPLITS or name not in SPLIT_FAMILIES):
        raise UsageError(f"split {split!r} is not one of the {name!r} kernel's "
                         f"({', '.join(PARALLEL_SPLITS) if name in SPLIT_FAMILIES else 'none'})")
    kblock = params.get(KBLOCK, False)
    if not isinstance(kblock, bool) or (kblock and name not in KBLOCK_FAMILIES):
        raise UsageError(f"kblock {kblock!r}: only true or false, and true only for the "
                         f"GEMM kernels ({', '.join(KBLOCK_FAMILIES)}), not {name!r}")
    segment = params.get(KSEGMENT)
    if segment is not None and (name != "conv_direct" or isinstance(segment, bool)
                                or segment not in _legal_segments(call)):
        raise UsageError(f"ksegment {segment!r}: only the 'conv_direct' kernel takes it, "
                         "0 or input channels per segment dividing the group's")
    unroll = params.get(UNROLL)
    if unroll is not None and (isinstance(unroll, bool) or unroll not in unrolls(name, call)):
        raise UsageError(f"unroll {unroll!r}: only the kernels {', '.join(UNROLL_FAMILIES)} "
                         f"take it, one of {', '.join(map(str, unrolls(name, call))) or 'none'}"
                         f" for this {name!r} call (no larger than its K)")
    chosen = KERNELS.get(name) if name != family.name else family
    packed = _packed_with_tile(chosen, call, isa, params.get("tile"))
    extra = {**({SPLIT: split} if split is not None else {}),
             **({KBLOCK: True} if kblock else {}),
             **({KSEGMENT: segment} if segment is not None else {}),
             **({UNROLL: unroll} if unroll is not None else {})}
    if not extra:
        return packed
    return g.Call(packed.op, packed.args, g.freeze_attrs({**packed.attrs, **extra}),
                  packed.ret_type)


def legal_tiles(family: KernelFamily, call: g.Call, isa: ISA) -> list[tuple[int, ...]]:
    """The tiles `family` lists for `call` on `isa` other than its rule's: its
    `candidates` and, where it has them, its `offered_tiles` (none for a family without
    a tile to tune)."""
    out: list[tuple[int, ...]] = []
    for method in ("candidates", "offered_tiles"):
        listed = getattr(family, method, None)
        if callable(listed):
            out += [tuple(t) for t in listed(call, isa) if tuple(t) not in out]
    return out


def _packed_with_tile(family: KernelFamily, call: g.Call, isa: ISA, tile: Any) -> g.Call:
    """`call` packed by `family` with `tile` (None: the rule's); UsageError listing the
    legal tiles when `tile` is neither the rule's nor one of `legal_tiles`."""
    if tile is None:
        return family.pack(call, isa)
    wanted = tuple(tile) if isinstance(tile, list | tuple) else None
    legal = legal_tiles(family, call, isa)
    pack_tile = getattr(family, "pack_tile", None)
    if wanted in legal and callable(pack_tile):
        return cast(g.Call, pack_tile(call, isa, wanted))
    packed = family.pack(call, isa)  # the rule's tile is legal too
    recorded = packed.attrs.get(TILE)
    rule = tuple(recorded) if isinstance(recorded, tuple | list) else None
    if rule is not None and rule == wanted:
        return packed
    choices = [*([list(rule)] if rule is not None else []), *map(list, legal)]
    listed = ", ".join(map(str, choices[:SHOWN_TILES])) or "none (it takes no tile)"
    more = f" and {len(choices) - SHOWN_TILES} more" if len(choices) > SHOWN_TILES else ""
    raise UsageError(f"tile {shown(tile)} is not a tile the {family.name!r} kernel takes for "
                     f"this call on this CPU; its tiles: {listed}{more} (the rule's first)")


def kernel_parameters(kernel: str) -> tuple[str, ...] | None:
    """The parameters a tuning record of `kernel` may hold: a kernel family's
    (`FAMILY_PARAMS`), a choice's (kiln.ops.cblas: `library`), a model-level knob's
    (kiln.tuning.apply.MODEL_KNOBS); None for a name that is none of them."""

    if kernel in KERNELS.names():
        return FAMILY_PARAMS
    return {LIBRARY_CHOICE.name: (LIBRARY,), NCHWC_REGION: ("layout",),
            PARALLEL_THRESHOLD: ("min_ns",)}.get(kernel)


def check_params(kernel: str, params: Mapping[str, Any], where: str) -> None:
    """UsageError naming `where` (a record) when `kernel` is not a kernel kiln knows or
    `params` hold a parameter it does not take."""

    known = kernel_parameters(kernel)
    if known is None:
        names = sorted([*KERNELS.names(), LIBRARY_CHOICE.name, *MODEL_KNOBS])
        raise UsageError(f"{where}: unknown kernel {shown(kernel)}; the kernels: "
                         f"{', '.join(names)}")
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise UsageError(f"{where}: the {kernel!r} kernel takes no parameter "
                         f"{', '.join(shown(k) for k in unknown[:4])}; it takes "
                         f"{', '.join(known)}")


def check_database(db: Any) -> None:
    """`check_params` of every record and verdict of the tuning database `db`
    (kiln.tuning.TuningDatabase), each named by its key, before a compile applies it."""
    for r in db.records():
        where = f"{db.source}: the record of kernel {shown(r.kernel)}, signature " \
                f"{shown(r.signature)}"
        for m in (r.default, *r.candidates):
            check_params(r.kernel, m.params, where)
    for v in db.verdicts():
        for c in (*v.accepted, *v.rejected):
            check_params(c.kernel, c.params, f"{db.source}: the verdict of model "
                         f"{shown(v.model)}, kernel {shown(c.kernel)}, signature "
                         f"{shown(c.signature)}")


def pack(family: KernelFamily, call: g.Call, isa: ISA, session: Session | None) -> g.Call:
    """`call` packed by `family` as the tuning session `session` says (kiln.tuning.apply;
    None, or no params for the call: the rule's `pack`); a UsageError about the params
    names where the session took them from (a database's record)."""

    params = session.params_for(family, call, isa) if session is not None else None
    if params is None:
        return family.pack(call, isa)
    try:
        return pack_params(family, call, isa, params)
    except UsageError as exc:
        assert session is not None
        raise UsageError(f"{session.describe(family.name, signature(call))}: {exc}") from None
