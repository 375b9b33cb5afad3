"""The target kinds kiln ships: their attribute schemas and canonicalizers.

Only attributes that change the generated code are declared (Apache TVM's target RFC:
"would this option change the contents of the generated module?"). Thread
counts, device ids, linker and loader settings belong to the runtime or to
export, and are rejected with an explanation (see `attrs.NOT_TARGET_ATTRS`).
"""

from __future__ import annotations

import re
from typing import Any

from kiln.errors import TargetError
from kiln.target.attrs import AttrSpec, canonical_features
from kiln.target.host import check_triple, host_triple, triple_arch
from kiln.target.kind import TargetKind
from kiln.target.llvm_names import check_cpu_names
from kiln.target.precision import check_precision

_FLOAT_ABIS = ("hard", "soft", "softfp")
#: The values of the CPU kinds' `precision` attribute (kiln.target.precision).
PRECISIONS = ("f32", "bf16", "f16")
_CUDA_ARCH = re.compile(r"sm_[1-9][0-9]{1,2}[af]?")
_AMDGPU_CPU = re.compile(r"gfx[0-9a-f]{3,4}")


def _cpu_options(triple_doc: str) -> dict[str, AttrSpec]:
    """Attributes shared by the CPU kinds (llvm, llvmjit, c)."""
    return {
        "mtriple": AttrSpec(str, doc=triple_doc),
        "mcpu": AttrSpec(str, doc="CPU to select and schedule for, e.g. 'neoverse-v1'"),
        "mattr": AttrSpec(
            list[str], (), doc="features to add (+x) or remove (-x), e.g. ['+neon']"
        ),
        "mabi": AttrSpec(str, doc="ABI name, e.g. 'lp64d' (RISC-V) or 'aapcs' (Arm)"),
        "mfloat-abi": AttrSpec(
            str, choices=_FLOAT_ABIS, doc="Arm float ABI: how floats are passed"
        ),
        "opt-level": AttrSpec(int, 3, min=0, max=3, doc="optimisation level"),
        "fast-math": AttrSpec(bool, False, doc="allow reassociation and approximations"),
        "vector-width": AttrSpec(
            int, min=8, doc="preferred vector width in bits; default: from mcpu/mattr"
        ),
        "int8-pairs": AttrSpec(
            str, choices=("exact", "saturate"),
            doc="u8 x s8 products: ONNX's exact sums (default) or, with 'saturate', "
                "onnxruntime's AVX2 ones (pairs of products summed into a saturating int16)",
        ),
        "winograd": AttrSpec(
            bool,
            doc="run 3x3 stride-1 float32 convolutions of 32+ channels (8x8+ outputs) by "
                "Winograd's F(4x4) or F(2x2): 2.25-4x fewer multiplies, sums rounded differently "
                "from a direct convolution's (about 1e-5 of the largest output); absent: "
                "on, but off for a bare-metal triple (firmware: 4x the weights, and "
                "workspace); false: direct convolutions only",
        ),
        "precision": AttrSpec(
            str, choices=PRECISIONS,
            doc="the arithmetic of float32 GEMMs: 'f32' (absent: the default), or 'bf16': "
                "weights stored in bfloat16 and products of bfloat16 values summed in "
                "float32 (AVX512-BF16 vdpbf16ps), float32 inputs and outputs; or 'f16': "
                "GEMM weights stored in float16, widened as loaded (F16C vcvtph2ps) and "
                "summed in float32 (docs/targets.md)",
        ),
    }


def _gpu_options(max_threads: int, warp: int, shared: int | None) -> dict[str, AttrSpec]:
    """Launch limits every GPU kind declares."""
    return {
        "max_threads_per_block": AttrSpec(
            int, max_threads, min=1, doc="most threads in one block / workgroup"
        ),
        "thread_warp_size": AttrSpec(int, warp, min=1, doc="threads per warp / wavefront"),
        "max_shared_memory_per_block": AttrSpec(
            int, shared, min=0, doc="shared (workgroup) memory one block may use, bytes"
        ),
    }


def _check_cpu_attrs(attrs: dict[str, Any], kind: str) -> dict[str, Any]:
    where = f"attribute 'mattr' of target kind '{kind}'"
    attrs["mattr"] = canonical_features(attrs["mattr"], where)
    triple = attrs.get("mtriple")
    if attrs.get("mfloat-abi") is not None and triple is not None:
        arch = triple_arch(triple)
        if not arch.startswith(("arm", "thumb")):
            raise TargetError(
                f"attribute 'mfloat-abi' of target kind '{kind}' applies to Arm triples "
                f"(arm*, thumb*) only, but mtriple is '{triple}'"
            )
    return check_precision(attrs, kind)


def _canonicalize_llvm(attrs: dict[str, Any]) -> dict[str, Any]:
    """Fill `mtriple` from this machine, check LLVM knows it, canonicalise `mattr`."""
    if attrs.get("mtriple") is None:
        attrs["mtriple"] = host_triple()
    check_triple(attrs["mtriple"], "attribute 'mtriple' of target kind 'llvm'")
    attrs = _check_cpu_attrs(attrs, "llvm")
    check_cpu_names(attrs["mtriple"], attrs.get("mcpu"), attrs["mattr"], "llvm")
    return attrs


def _canonicalize_llvmjit(attrs: dict[str, Any]) -> dict[str, Any]:
    """Like llvm, but the code runs in this process, so the triple must be the host's."""
    host = host_triple()
    if attrs.get("mtriple") is None:
        attrs["mtriple"] = host
    if triple_arch(attrs["mtriple"]) != triple_arch(host):
        raise TargetError(
            f"attribute 'mtriple' of target kind 'llvmjit' is '{attrs['mtriple']}', but "
            f"llvmjit runs code in this process ({host}); use kind 'llvm' to cross-compile"
        )
    attrs = _check_cpu_attrs(attrs, "llvmjit")
    check_cpu_names(attrs["mtriple"], attrs.get("mcpu"), attrs["mattr"], "llvmjit")
    return attrs


def _canonicalize_c(attrs: dict[str, Any]) -> dict[str, Any]:
    """Canonicalise `mattr`; an absent `mtriple` means the system C compiler's own.

    `mcpu` and `mattr` are LLVM's names, as for `llvm` (kiln reads the CPU's registers and
    instructions from LLVM's description of it, kiln.target.isa), except `mcpu=native`:
    this machine's CPU, for a build by the system C compiler only."""
    attrs = _check_cpu_attrs(attrs, "c")
    triple = attrs.get("mtriple")
    mcpu = attrs.get("mcpu")
    if mcpu == "native":
        if triple is not None and triple_arch(triple) != triple_arch(host_triple()):
            raise TargetError(f"attribute 'mcpu' of target kind 'c' is 'native' (this "
                              f"machine's CPU), but mtriple '{triple}' is another "
                              "architecture: name the CPU of the device")
        mcpu = None
    check_cpu_names(triple or host_triple(), mcpu, attrs["mattr"], "c")
    return attrs


def _canonicalize_cuda(attrs: dict[str, Any]) -> dict[str, Any]:
    """Check `arch` looks like 'sm_NN' and the shared memory limits agree."""
    arch = attrs.get("arch")
    if arch is not None and not _CUDA_ARCH.fullmatch(arch):
        raise TargetError(
            f"attribute 'arch' of target kind 'cuda' must look like 'sm_NN' "
            f"(e.g. 'sm_80', 'sm_90a'), got '{arch}'"
        )
    optin = attrs.get("max_shared_memory_per_block_optin")
    static = attrs["max_shared_memory_per_block"]
    if optin is not None and optin < static:
        raise TargetError(
            f"attribute 'max_shared_memory_per_block_optin' of target kind 'cuda' ({optin}) "
            f"is smaller than max_shared_memory_per_block ({static})"
        )
    return attrs


def _canonicalize_nvptx(attrs: dict[str, Any]) -> dict[str, Any]:
    """Check `mcpu` is an 'sm_NN' name; canonicalise `mattr`."""
    mcpu = attrs.get("mcpu")
    if mcpu is not None and not _CUDA_ARCH.fullmatch(mcpu):
        raise TargetError(
            f"attribute 'mcpu' of target kind 'nvptx' must look like 'sm_NN' "
            f"(e.g. 'sm_80'), got '{mcpu}'"
        )
    attrs["mattr"] = canonical_features(attrs["mattr"], "attribute 'mattr' of target kind 'nvptx'")
    return attrs


def _canonicalize_rocm(attrs: dict[str, Any]) -> dict[str, Any]:
    """Check `mcpu` is a 'gfxNNN' name; canonicalise `mattr`."""
    mcpu = attrs.get("mcpu")
    if mcpu is not None and not _AMDGPU_CPU.fullmatch(mcpu):
        raise TargetError(
            f"attribute 'mcpu' of target kind 'rocm' must look like 'gfxNNN' "
            f"(e.g. 'gfx90a', 'gfx942', 'gfx1100'), got '{mcpu}'"
        )
    attrs["mattr"] = canonical_features(attrs["mattr"], "attribute 'mattr' of target kind 'rocm'")
    return attrs


def _canonicalize_composite(attrs: dict[str, Any]) -> dict[str, Any]:
    """A composite needs at least one device, and devices are not composites."""
    devices = attrs.get("devices") or ()
    if not devices:
        raise TargetError(
            "target kind 'composite' needs 'devices': a non-empty list of targets, "
            "e.g. {'kind': 'composite', 'devices': ['cuda', 'llvm']}"
        )
    for index, device in enumerate(devices):
        if device.kind.name == "composite":
            raise TargetError(
                f"device {index} of a composite target is itself composite; "
                "list its devices directly"
            )
    return attrs


LLVM = TargetKind(
    "llvm",
    _cpu_options("LLVM target triple; defaults to this machine's triple"),
    ("cpu",),
    _canonicalize_llvm,
    doc="CPU code through LLVM, compiled to an object file and linked",
)

LLVMJIT = TargetKind(
    "llvmjit",
    _cpu_options("LLVM target triple; must be this machine's (the default)"),
    ("cpu",),
    _canonicalize_llvmjit,
    doc="CPU code through LLVM, JIT-compiled in this process (in-memory only)",
)

C = TargetKind(
    "c",
    _cpu_options("triple selecting the cross C compiler; default: the system C compiler"),
    ("cpu",),
    _canonicalize_c,
    doc="C source compiled by the system (or a cross) C compiler; microcontrollers",
)

CUDA = TargetKind(
    "cuda",
    {
        "arch": AttrSpec(str, doc="compute capability to compile for, e.g. 'sm_80'"),
        **_gpu_options(1024, 32, 49152),
        "max_shared_memory_per_block_optin": AttrSpec(
            int, min=0, doc="shared memory a kernel may opt in to beyond the 48 KB, bytes"
        ),
        "registers_per_block": AttrSpec(int, 65536, min=1, doc="32-bit registers per block"),
        "l2_cache_size_bytes": AttrSpec(int, min=0, doc="L2 cache size, bytes"),
    },
    ("cuda", "gpu"),
    _canonicalize_cuda,
    doc="NVIDIA GPUs through CUDA C++ and NVRTC/nvcc",
)

NVPTX = TargetKind(
    "nvptx",
    {
        "mtriple": AttrSpec(str, "nvptx64-nvidia-cuda", doc="LLVM triple of the PTX backend"),
        "mcpu": AttrSpec(str, doc="compute capability, e.g. 'sm_80'"),
        "mattr": AttrSpec(list[str], (), doc="PTX features, e.g. ['+ptx80']"),
        **_gpu_options(1024, 32, 49152),
    },
    ("cuda", "gpu"),
    _canonicalize_nvptx,
    doc="NVIDIA GPUs through LLVM's NVPTX backend (PTX text)",
)

ROCM = TargetKind(
    "rocm",
    {
        "mtriple": AttrSpec(str, "amdgcn-amd-amdhsa", doc="LLVM triple of the AMDGPU backend"),
        "mcpu": AttrSpec(str, doc="GPU name, e.g. 'gfx942'"),
        "mattr": AttrSpec(list[str], (), doc="GPU features, e.g. ['+wavefrontsize64']"),
        **_gpu_options(256, 64, 65536),
    },
    ("rocm", "gpu"),
    _canonicalize_rocm,
    doc="AMD GPUs through LLVM's AMDGPU backend",
)

VULKAN = TargetKind(
    "vulkan",
    {
        **_gpu_options(256, 1, 16384),
        "supports_float16": AttrSpec(bool, False, doc="shaderFloat16 is available"),
        "supports_float64": AttrSpec(bool, False, doc="shaderFloat64 is available"),
        "supports_int8": AttrSpec(bool, False, doc="shaderInt8 is available"),
        "supports_int64": AttrSpec(bool, False, doc="shaderInt64 is available"),
    },
    ("vulkan", "gpu"),
    doc="GPUs through Vulkan compute shaders (SPIR-V)",
)

METAL = TargetKind(
    "metal",
    {
        **_gpu_options(256, 32, 32768),
        "max_function_args": AttrSpec(int, 31, min=1, doc="buffer arguments per kernel"),
    },
    ("metal", "gpu"),
    doc="Apple GPUs through Metal Shading Language",
)

OPENCL = TargetKind(
    "opencl",
    {
        **_gpu_options(256, 1, None),
        "supports_float16": AttrSpec(bool, False, doc="cl_khr_fp16 is available"),
        "supports_float64": AttrSpec(bool, False, doc="cl_khr_fp64 is available"),
    },
    ("opencl", "gpu"),
    doc="GPUs and accelerators through OpenCL C",
)

WEBGPU = TargetKind(
    "webgpu",
    {
        **_gpu_options(256, 1, 16384),
        "supports_float16": AttrSpec(bool, False, doc="the 'shader-f16' feature is enabled"),
    },
    ("webgpu", "gpu"),
    doc="GPUs in the browser through WebGPU (WGSL); pair with a wasm32 llvm host",
)

EXT_DEV = TargetKind(
    "ext_dev",
    {},
    ("ext_dev",),
    doc="an external device whose codegen a plug-in registers",
)

COMPOSITE = TargetKind(
    "composite",
    {"devices": AttrSpec("list[target]", doc="the device targets, in priority order")},
    (),
    _canonicalize_composite,
    doc="several device targets compiled together (heterogeneous execution)",
)

BUILTIN_KINDS: tuple[TargetKind, ...] = (
    LLVM, LLVMJIT, C, CUDA, NVPTX, ROCM, VULKAN, METAL, OPENCL, WEBGPU, EXT_DEV, COMPOSITE,
)
