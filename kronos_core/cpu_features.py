"""What this machine's CPU computes fast, read from its flags: native bf16, AMX int8, the vector width, cores.

`features_from_flags` is a pure function of the flag names (as /proc/cpuinfo's "flags" line, or an Arm
"Features" line, spells them), so tests fake a CPU by its flags; `detect_cpu_features` reads this machine's.
Native bf16 means a bf16 matrix unit or dot-product instruction (Intel AMX-BF16, AVX512-BF16, Arm's BF16):
without one, torch emulates bf16 through float32 conversions and a bf16 run is slower than float32.
No torch import: light commands (monitor, report) show these figures.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

CPUINFO = Path("/proc/cpuinfo")
NO_NATIVE_BF16 = "this CPU has no native bf16 (no AMX or AVX512-BF16): bf16 would be emulated and slower"


@dataclass(frozen=True)
class CpuFeatures:
    """The CPU's model name and the capabilities that decide its fast precisions."""

    model: str | None
    cores: int  # logical CPUs this process may run on
    amx_bf16: bool
    amx_int8: bool
    avx512_bf16: bool
    avx512: bool  # AVX-512 Foundation
    avx2: bool
    arm_bf16: bool = False  # Arm's BF16 extension ("bf16" in an aarch64 Features line)
    torch_capability: str | None = None  # torch.backends.cpu.get_cpu_capability(), when torch is loaded

    @property
    def native_bf16(self) -> bool:
        return self.amx_bf16 or self.avx512_bf16 or self.arm_bf16

    @property
    def vector_width(self) -> str:
        return "AVX-512" if self.avx512 else "AVX2" if self.avx2 else "no AVX2"

    def bf16_units(self) -> str:
        units = [name for name, present in (("AMX-BF16", self.amx_bf16), ("AVX512-BF16", self.avx512_bf16),
                                            ("Arm BF16", self.arm_bf16)) if present]
        return " + ".join(units)

    def summary(self) -> str:
        """One line: e.g. 'AMD EPYC 7B13, 2 cores, AVX2, bf16 emulated (no AMX or AVX512-BF16), no AMX int8'."""
        bf16 = f"native bf16 ({self.bf16_units()})" if self.native_bf16 else "bf16 emulated (no AMX or AVX512-BF16)"
        int8 = "AMX int8" if self.amx_int8 else "no AMX int8"
        model = f"{self.model}, " if self.model else ""
        return f"{model}{self.cores} cores, {self.vector_width}, {bf16}, {int8}"

    def brief(self) -> str:
        """For a status line: e.g. 'CPU AVX2, bf16 emulated' or 'CPU AVX-512, bf16 AMX-BF16 + AVX512-BF16, AMX int8'."""
        bf16 = f"bf16 {self.bf16_units()}" if self.native_bf16 else "bf16 emulated"
        return f"CPU {self.vector_width}, {bf16}" + (", AMX int8" if self.amx_int8 else "")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "native_bf16": self.native_bf16, "vector_width": self.vector_width}


def features_from_flags(flags: Iterable[str], cores: int, model: str | None = None,
                        torch_capability: str | None = None) -> CpuFeatures:
    """The capabilities a set of flag names declares (pure: no machine is read)."""
    present = {flag.strip().lower() for flag in flags}
    return CpuFeatures(model=model, cores=cores, amx_bf16="amx_bf16" in present, amx_int8="amx_int8" in present,
                       avx512_bf16="avx512_bf16" in present, avx512="avx512f" in present, avx2="avx2" in present,
                       arm_bf16="bf16" in present, torch_capability=torch_capability)


def parse_cpuinfo(text: str) -> tuple[list[str], str | None]:
    """(flags, model name) of the first processor in a /proc/cpuinfo text (x86 "flags", Arm "Features")."""
    flags: list[str] = []
    model = None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("flags", "features") and not flags:
            flags = value.split()
        elif key in ("model name", "cpu model") and model is None:
            model = value.strip() or None
    return flags, model


def usable_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def detect_cpu_features() -> CpuFeatures:
    """This machine's CPU (Linux: /proc/cpuinfo; elsewhere no flags are known, so bf16 counts as emulated).
    torch's own reading of the vector unit is added when torch is already loaded (never imported here)."""
    text = CPUINFO.read_text(errors="replace") if sys.platform.startswith("linux") and CPUINFO.exists() else ""
    flags, model = parse_cpuinfo(text)
    torch = sys.modules.get("torch")
    capability = torch.backends.cpu.get_cpu_capability() if torch is not None else None
    return features_from_flags(flags, usable_cores(), model, capability)


__all__ = ["CpuFeatures", "NO_NATIVE_BF16", "detect_cpu_features", "features_from_flags", "parse_cpuinfo"]
