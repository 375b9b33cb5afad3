"""Which CPU features LLVM's subtarget for (triple, mcpu, mattr) has, asked of LLVM.

llvmlite does not list a subtarget's features, but LLVM's inliner can tell: it
inlines a callee into a caller only when the target says the two are compatible,
and on x86 and AArch64 that means the callee's feature bits are a subset of the
caller's. So one module holds a caller with the target's CPU and features and,
per candidate feature `f`, a small callee with the same CPU and features plus
`+f`; after LLVM's O2 pipeline, the callees that were inlined are exactly the
candidates the target already has. (The callees are not `alwaysinline`: the
always-inliner ignores target compatibility.) This is how `mcpu` is expanded
(APX and AVX10 on `diamondrapids`, which no curated list knows) and how `mattr`
is applied in LLVM's own order.

llvmlite is imported on the first call only: a deploy host never calls this.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

from kiln.errors import CompileError

_PROBE = threading.Lock()


@functools.cache
def llvm_binding() -> Any:
    """llvmlite.binding with every target and asm printer initialised (once)."""
    import llvmlite.binding as llvm  # optional: llvmlite (the compiler extra)

    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    llvm.initialize_native_asmparser()
    return llvm


def _probe_ir(triple: str, cpu: str, features: str, candidates: list[str]) -> str:
    """The module of the inlining probe (see the module docstring)."""
    def attrs(extra: str) -> str:
        fs = ",".join(f for f in (features, extra) if f)
        out = [f'"target-cpu"="{cpu}"'] if cpu else []
        return " ".join([*out, f'"target-features"="{fs}"'])

    lines = [f'target triple = "{triple}"', "declare void @sink(i32)"]
    for i in range(len(candidates)):
        lines += [f"define internal void @f{i}() #{i + 1} {{",
                  f"  call void @sink(i32 {i})", "  ret void", "}"]
    lines += ["define void @caller() #0 {",
              *(f"  call void @f{i}()" for i in range(len(candidates))), "  ret void", "}",
              f"attributes #0 = {{ {attrs('')} }}"]
    lines += [f"attributes #{i + 1} = {{ {attrs('+' + f)} }}" for i, f in enumerate(candidates)]
    return "\n".join(lines) + "\n"


# (triple, cpu, features) -> [(candidates, the implied ones among them)], by _PROBE
_ANSWERS: dict[tuple[str, str, str], list[tuple[frozenset[str], frozenset[str]]]] = {}


def implied_features(triple: str, cpu: str, features: str,
                     candidates: tuple[str, ...]) -> frozenset[str]:
    """The names of `candidates` LLVM's subtarget for (triple, cpu, features) has.

    Asked of LLVM once a process per subtarget and candidates: a caller that asks while
    another thread's probe runs waits for that probe (the code generator's preparation
    asks beside the passes, kiln.codegen.llvm.codegen.prepare_llvm), and one answered for
    a superset of `candidates` answers them."""
    if not candidates:
        return frozenset()
    wanted = frozenset(candidates)
    with _PROBE:  # one probe at a time: each builds its own context and pass manager
        answers = _ANSWERS.setdefault((triple, cpu, features), [])
        for asked, found in answers:
            if wanted <= asked:
                return found & wanted
        found = _probe(triple, cpu, features, list(candidates))
        answers.append((wanted, found))
    return found


def _probe(triple: str, cpu: str, features: str, candidates: list[str]) -> frozenset[str]:
    """Run the inlining probe (see the module docstring); the caller holds _PROBE."""
    llvm = llvm_binding()
    text = _probe_ir(triple, cpu, features, candidates)
    try:
        tm = llvm.Target.from_triple(triple).create_target_machine(
            cpu=cpu, features=features, opt=2)
        mod = llvm.parse_assembly(text, llvm.create_context())
    except RuntimeError as err:
        raise CompileError(f"cannot ask LLVM which CPU features {triple} "
                           f"(cpu {cpu!r}, features {features!r}) has: {err}") from None
    pb = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(speed_level=2))
    pb.getModulePassManager().run(mod, pb)
    left = {fn.name for fn in mod.functions}
    return frozenset(f for i, f in enumerate(candidates) if f"f{i}" not in left)
