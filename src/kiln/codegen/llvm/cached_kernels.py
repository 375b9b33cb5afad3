"""The kernels of one build found in the kernel cache before their lowering.

kiln.codegen.llvm.kernel_keys keys a kernel group before the lowering; this is the
build's side of it: `reuse` answers the lowering (the index entry and the part's object
are both in the kernel cache: the group is declared, not lowered), `codes` gives the
parts' code as kiln.codegen.llvm.parts would have (content names, the model's
declarations and aliases), and `record` writes the index entries of the groups this
build lowered and compiled in a part of their own.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

from kiln.codegen import kernel_cache
from kiln.codegen.llvm import part_names
from kiln.codegen.llvm.kernel_keys import KernelGroup, entry_for, entry_symbols
from kiln.codegen.llvm.lower_to_llvm import LoweredModule
from kiln.codegen.llvm.parts import PartCode
from kiln.codegen.llvm.split import Part
from kiln.codegen.naming import kernel_symbol


class CachedKernels:
    """The kernel groups of one build (symbol prefix `prefix`) the kernel cache holds."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.found: dict[str, PartCode] = {}  # group key -> its part's code

    def symbol(self, name: str) -> str:
        return kernel_symbol(self.prefix, name)

    def reuse(self, group: KernelGroup) -> bool:
        """Whether the code of `group` is in the kernel cache (then kept for `codes`)."""
        entry = kernel_cache.lookup_index(group.key)
        if entry is None:
            return False
        symbols = entry_symbols(entry, group.functions, self.symbol)
        key = entry.get("key")
        if symbols is None or not isinstance(key, str):
            warnings.warn("kiln kernel cache: an index entry does not fit its kernel; "
                          "lowering it", kernel_cache.KernelCacheWarning, stacklevel=2)
            return False
        found = kernel_cache.lookup(key)
        if found is None:
            return False
        obj, bitcode, declared = found
        names = {part_names.content_name(key, i): symbol
                 for i, (symbol, _) in enumerate(symbols)}
        aliases = {symbol: part_names.content_name(key, i)
                   for i, (symbol, aliased) in enumerate(symbols) if aliased}
        declared = part_names.model_declarations(declared, names)
        self.found[group.key] = PartCode(obj, bitcode, declared, names, aliases, key)
        return True

    def codes(self, groups: Sequence[KernelGroup]) -> list[PartCode]:
        """The code of each of `groups` (each one `reuse` took)."""
        return [self.found[group.key] for group in groups]

    def record(self, lowered: LoweredModule, parts: Sequence[Part],
               codes: Sequence[PartCode]) -> None:
        """Write the index entry of each group `lowered` keyed and lowered that was
        compiled as a part of its own, named by its content."""
        reused = {group.key for group in lowered.reused}
        owner = {name: (part, code) for part, code in zip(parts, codes)
                 for name in part.functions}
        for group in lowered.keyed:
            if group.key in reused:
                continue
            part, code = owner.get(self.symbol(group.functions[0]), (None, None))
            if part is None or code is None or not code.names:
                continue
            entry = entry_for(group.functions, part.functions, self.symbol,
                              set(code.aliases), code.key)
            if entry is not None:
                kernel_cache.store_index(group.key, entry)


__all__ = ["CachedKernels"]
