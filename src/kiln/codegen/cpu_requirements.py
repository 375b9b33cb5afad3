"""The CPU features a library's native code may use, asked of LLVM itself.

The features a target enables are the feature bits of LLVM's subtarget for
(triple, mcpu, mattr): what `mcpu` implies (APX and AVX10 on `diamondrapids`,
which no curated list or older GCC knows), plus `+` features, minus `-` ones,
as `kiln.target.llvm_features.implied_features` asks LLVM's inliner for them
(the same probe the ISA object, kiln.target.isa, is built from).

Candidates are the features the running CPU can be checked for
(kiln.runtime.cpu_features.TABLES: an ISA extension with a cpuid or hwcap bit;
tuning flags are not candidates), and on a build machine of the target's
architecture every key of LLVM's host feature map: one the table cannot decide
that the target enables is a CompileError, not a silent gap at load time.
Recorded are the implied ones except the table's `system` rows (OS and
intrinsic-only instructions kiln's code never contains, which hypervisors often
hide).
"""

from __future__ import annotations

from kiln.errors import CompileError
from kiln.runtime.cpu_features import CPUFeature, table_arch, table_for
from kiln.target.llvm_features import implied_features, llvm_binding


def _candidates(triple: str) -> tuple[str, ...]:
    """Feature names to probe: the table's, and when the build machine has the target's
    architecture every key of LLVM's host feature map (the ISA extensions LLVM detects)."""
    names = set(table_for(triple))
    llvm = llvm_binding()
    if table_arch(str(llvm.get_process_triple())) == table_arch(triple):
        names |= set(dict(llvm.get_host_cpu_features()))
    return tuple(sorted(names))


def required_features(triple: str, cpu: str, features: str) -> list[str]:
    """LLVM names of the checkable CPU features the code for (triple, cpu, features)
    may use, sorted; [] for a triple kiln cannot check (kiln.runtime.cpu_features).
    CompileError when the target enables an ISA extension the table cannot decide."""
    table = table_for(triple)
    if not table:
        return []
    implied = implied_features(triple, cpu, features, _candidates(triple))
    unknown = sorted(implied - set(table))
    if unknown:
        raise CompileError(
            f"the target (triple {triple}, cpu {cpu!r}) enables CPU features kiln cannot "
            f"check on the machine that loads the library: {', '.join(unknown)}; add them "
            "to kiln.runtime.cpu_features.TABLES (cpuid/hwcap bits, as LLVM's "
            "sys::getHostCPUFeatures detects them), or disable them with mattr "
            f"({', '.join('-' + f for f in unknown)})")
    return sorted(f for f in implied if not table[f].system)


def feature_rows(triple: str, names: list[str] | tuple[str, ...]) -> list[CPUFeature]:
    """The table rows of `names` (a `requires_features` list) for host.c's check."""
    table = table_for(triple)
    unknown = sorted(set(names) - set(table))
    if unknown:
        raise CompileError(f"cannot check CPU features {', '.join(unknown)} for {triple}: "
                           "kiln.runtime.cpu_features.TABLES does not describe them")
    return [table[name] for name in sorted(set(names))]


__all__ = ["feature_rows", "implied_features", "required_features"]
