"""From a kiln Target to an LLVM TargetMachine; verify, optimise and emit.

The target's attributes (kiln/target/builtin_kinds.py) map to LLVM as follows:

- `mtriple`: the triple. An Arm triple gets its float ABI from `mfloat-abi`:
  `hard` selects the `...eabihf` environment, `soft` adds `+soft-float`
  (no FPU instructions at all), `softfp` keeps the triple (FPU instructions,
  integer-register calling convention);
- `mcpu` / `mattr`: CPU name and feature string (`"+neon,-sve"`);
- `mabi`: the ABI name (RISC-V `lp64d`, ...); for RISC-V it defaults to the
  hard-float ABI the features allow, as GCC does;
- `opt-level`: both the middle-end pipeline (new pass manager) and codegen;
- `fast-math`: fast-math flags on float instructions (not nnan/ninf);
- `vector-width`: the `prefer-vector-width` attribute on x86.

Relocation model: position independent for hosted targets (the object goes
into a shared library), static for bare-metal (`-none-`/unknown OS) and wasm.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kiln.codegen.cpu_requirements import required_features
from kiln.errors import CompileError, TargetError
from kiln.target.llvm_features import llvm_binding

# 64-bit ABIs that keep 32-bit integers sign-extended in registers.
_SEXT_INT32_ARCHES = ("riscv64", "mips64", "mips64el", "loongarch64", "ppc64", "ppc64le")


@dataclass(frozen=True)
class MachineConfig:
    """Everything that decides the machine code: one per target."""

    triple: str
    cpu: str = ""
    features: str = ""
    abi: str = ""
    opt_level: int = 3
    fast_math: bool = False
    vector_width: int | None = None
    reloc: str = "pic"
    codemodel: str = "default"

    @property
    def arch(self) -> str:
        return self.triple.split("-", 1)[0]

    @property
    def sext_int32(self) -> bool:
        return self.arch in _SEXT_INT32_ARCHES

    @property
    def native_roundeven(self) -> bool:
        """Whether llvm.roundeven is one instruction here (else lower `round` to rint)."""
        return self.arch in ("x86_64", "i686", "aarch64", "arm64")

    @property
    def no_slp(self) -> bool:
        """Whether kernels marked `kiln.no_slp` are lowered with `noimplicitfloat`: on
        x86-64, where it was measured and leaves their explicit vector code alone. On
        wasm32 with SIMD, LLVM's instruction selection failed an assertion on a vector
        type under it ("Unexpected illegal type!"); other targets keep SLP."""
        return self.arch == "x86_64"

    def function_attrs(self) -> tuple[tuple[str, str], ...]:
        """LLVM string attributes recorded on every kernel (self-describing bitcode)."""
        attrs: list[tuple[str, str]] = []
        if self.cpu:
            attrs.append(("target-cpu", self.cpu))
        if self.features:
            attrs.append(("target-features", self.features))
        if self.vector_width and self.arch in ("x86_64", "i686"):
            attrs.append(("prefer-vector-width", str(self.vector_width)))
        return tuple(attrs)

    def to_json(self) -> dict[str, Any]:
        return {"triple": self.triple, "cpu": self.cpu, "features": self.features,
                "requires_features": required_features(self.triple, self.cpu, self.features),
                "abi": self.abi, "opt_level": self.opt_level, "reloc": self.reloc,
                "codemodel": self.codemodel}

    def target_machine(self) -> Any:
        """The llvmlite TargetMachine for this configuration."""
        llvm = llvm_binding()
        try:
            target = llvm.Target.from_triple(self.triple)
        except RuntimeError as err:
            raise CompileError(f"LLVM has no backend for triple {self.triple!r}: {err}") from None
        return target.create_target_machine(
            cpu=self.cpu, features=self.features, opt=self.opt_level, reloc=self.reloc,
            codemodel=self.codemodel, abiname=self.abi)


def _get(target: Any, name: str, default: Any = None) -> Any:
    """`target.get(name)`, tolerating kinds that do not declare `name`."""
    try:
        value = target.get(name, default)
    except TargetError:  # a kind that does not declare `name`
        return default
    return default if value is None else value


def machine_config(target: Any, *, jit: bool = False) -> MachineConfig:
    """The MachineConfig of a kiln Target of kind llvm/llvmjit (or anything with `.get`)."""
    llvm = llvm_binding()
    triple = str(_get(target, "mtriple") or llvm.get_process_triple())
    cpu = str(_get(target, "mcpu", "") or "")
    mattr = [str(f) for f in (_get(target, "mattr", ()) or ())]
    abi = str(_get(target, "mabi", "") or "")
    float_abi = _get(target, "mfloat-abi")
    parts = llvm.get_triple_parts(triple)
    arch = parts.Arch
    if float_abi is not None and arch.startswith(("arm", "thumb")):
        triple, mattr = _arm_float_abi(triple, parts, float_abi, mattr)
    if not abi and arch.startswith("riscv"):
        abi = _riscv_default_abi(arch, mattr)
    bare = parts.OS in ("unknown", "none") or "-none-" in triple
    wasm = arch.startswith("wasm")
    if jit:
        reloc, codemodel = "default", "jitdefault"
    else:
        reloc, codemodel = ("static" if bare or wasm else "pic"), "default"
    width = _get(target, "vector-width")
    return MachineConfig(
        triple=triple, cpu=cpu, features=",".join(mattr), abi=abi,
        opt_level=int(_get(target, "opt-level", 3)), fast_math=bool(_get(target, "fast-math")),
        vector_width=int(width) if width else None, reloc=reloc, codemodel=codemodel)


def _arm_float_abi(triple: str, parts: Any, float_abi: str,
                   mattr: list[str]) -> tuple[str, list[str]]:
    env = parts.Env
    if float_abi == "hard" and not env.endswith("hf"):
        env = env + "hf" if env.startswith(("eabi", "gnueabi", "musleabi")) else "eabihf"
    elif float_abi in ("soft", "softfp") and env.endswith("hf"):
        env = env[:-2]
    if float_abi == "soft" and "+soft-float" not in mattr:
        mattr = [*mattr, "+soft-float"]
    os_name = "none" if "-none-" in triple or triple.endswith("-none") else parts.OS
    # Four components: LLVM misreads 3-part triples such as thumbv7em-none-eabihf.
    return f"{parts.Arch}{parts.SubArch}-{parts.Vendor}-{os_name}-{env}", mattr


def _riscv_default_abi(arch: str, mattr: list[str]) -> str:
    base = "lp64" if arch == "riscv64" else "ilp32"
    if "+d" in mattr:
        return base + "d"
    if "+f" in mattr:
        return base + "f"
    return base


def parse_and_verify(llvm_ir: str, where: str = "kiln kernels", context: Any = None) -> Any:
    """Parse LLVM IR text (into `context`, default the global one) and run LLVM's
    verifier; CompileError quotes the failure."""
    llvm = llvm_binding()
    try:
        mod = llvm.parse_assembly(llvm_ir, context)
        mod.verify()
    except RuntimeError as err:
        raise CompileError(
            f"LLVM rejected the IR generated for {where} (a bug in kiln's llvm backend):\n"
            f"{err}\n--- IR ---\n{_excerpt(llvm_ir)}") from None
    return mod


def _excerpt(text: str, limit: int = 200) -> str:
    lines = text.splitlines()
    if len(lines) <= limit:
        return text
    return "\n".join(lines[:limit]) + f"\n... ({len(lines) - limit} more lines)"


def pipeline(tm: Any, opt_level: int) -> Any:
    """The pass builder of LLVM's default module pipeline at `opt_level` (new pass manager)."""
    llvm = llvm_binding()
    pto = llvm.create_pipeline_tuning_options(speed_level=opt_level)
    vectorize = opt_level >= 2
    pto.loop_vectorization = vectorize
    pto.slp_vectorization = vectorize
    pto.loop_interleaving = vectorize
    pto.loop_unrolling = opt_level >= 1
    return llvm.create_pass_builder(tm, pto)


def optimize(mod: Any, tm: Any, opt_level: int) -> None:
    """Run LLVM's default module pipeline at `opt_level` (new pass manager)."""
    pb = pipeline(tm, opt_level)
    pb.getModulePassManager().run(mod, pb)
