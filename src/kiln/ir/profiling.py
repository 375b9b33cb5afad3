"""The timer sites of a module `profile-kernel-calls` instrumented.

The pass (kiln.transform.profile, `ProfileKernelCalls`) numbers its timer sites
across the module and records them in the module attribute `kiln.profile_sites`: one
`(function, kernel)` pair per site, kernel None for a function's whole call. The
backends read them here (host.c's counters, the library metadata's "profile").
"""

from __future__ import annotations

from kiln.ir.attrs import ATTR_PROFILE_SITES
from kiln.ir.module import IRModule

# (function, kernel it calls) of one timer site; kernel None: the function's whole call.
ProfileSite = tuple[str, str | None]


def profile_sites(mod: IRModule) -> tuple[ProfileSite, ...]:
    """The sites ProfileKernelCalls recorded on `mod` (empty when it did not run)."""
    sites: tuple[ProfileSite, ...] = tuple(mod.attrs.get(ATTR_PROFILE_SITES, ()))
    return sites


__all__ = ["ProfileSite", "profile_sites"]
