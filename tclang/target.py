"""The frozen description of a compilation target.

The polyhedral layer reads only these capabilities (how to map parallelism, vector width,
cache sizes, GPU limits); it never asks which backend it serves. Each backend builds its
Target from the machine it runs on.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from tclang.machine import (available_cores, bounds_checking, cache_sizes,  # noqa: F401
                            cpu_from_os, vector_bytes)


@dataclass(frozen=True)
class Target:
    name: str  # the backend: "cpu", "cuda", "cuda-emulated", "interpreter"
    mapping: str  # "threads": parallel loops on CPU threads; "grid": GPU blocks and threads
    arch: str = ""  # CPU name and features, or the GPU's compute capability
    cores: int = 1
    vector_bytes: int = 32  # SIMD register width
    l1_bytes: int = 32 * 1024
    l2_bytes: int = 512 * 1024
    max_threads_per_block: int = 1024
    max_block: tuple[int, int, int] = (1024, 1024, 64)
    max_grid: tuple[int, int, int] = (2**31 - 1, 65535, 65535)
    shared_bytes: int = 48 * 1024
    warp: int = 32
    bounds_checked: bool = False  # every access checked at run time (TCLANG_CHECK_BOUNDS)

    @property
    def is_grid(self) -> bool:
        return self.mapping == "grid"

    @property
    def vector_registers(self) -> int:
        """Vector registers of the CPU's ISA (x86-64: 32 with AVX-512, else 16): what the
        register tiles and the tuner's space of them are sized by."""
        return 32 if self.vector_bytes >= 64 else 16

    def key(self) -> tuple:
        """Every field: each one may change the code (cores, for one, changes tiling)."""
        return tuple((f.name, getattr(self, f.name)) for f in fields(self))


def reference_target() -> Target:
    """The target the reference interpreter uses: a plain sequential CPU."""
    return Target(name="interpreter", mapping="threads", arch="python", cores=1)
