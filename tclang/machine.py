"""What this machine and process offer a compile, read from the OS: the cores this process
may use, the data caches' sizes, the bounds-check switch. Apart from `target.py` (which
builds the frozen Target from them) because a disk-cache hit reads them too, before any
Target exists (tclang/driver/call_records.py)."""

from __future__ import annotations

import hashlib
import os
from functools import lru_cache

from tclang.environment import switch, whole_number


def available_cores() -> int:
    """CPU cores this process may use (`TCLANG_NUM_THREADS` overrides the affinity mask)."""
    configured = whole_number("TCLANG_NUM_THREADS", None)
    if configured is not None:
        return configured
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


_CACHE_SIZES: dict[str, int] | None = None


def cache_sizes(root: str = "/sys/devices/system/cpu/cpu0/cache") -> dict[str, int]:
    """This machine's data caches, {"l1_bytes": ..., "l2_bytes": ...}, read from the OS
    (Linux sysfs) once per process; the keys it cannot read are left out (the Target's
    defaults stay: 32 KiB and 512 KiB)."""
    global _CACHE_SIZES
    if _CACHE_SIZES is not None and root == "/sys/devices/system/cpu/cpu0/cache":
        return dict(_CACHE_SIZES)
    found: dict[str, int] = {}
    try:
        entries = sorted(os.listdir(root))
    except OSError:
        entries = []
    for entry in entries:
        if not entry.startswith("index"):
            continue
        try:
            with open(os.path.join(root, entry, "level")) as f:
                level = int(f.read())
            with open(os.path.join(root, entry, "type")) as f:
                kind = f.read().strip()
            with open(os.path.join(root, entry, "size")) as f:
                size = _bytes(f.read().strip())
        except (OSError, ValueError):
            continue
        if kind in ("Data", "Unified") and level in (1, 2) and size > 0:
            found.setdefault(f"l{level}_bytes", size)
    if root == "/sys/devices/system/cpu/cpu0/cache":
        _CACHE_SIZES = dict(found)
    return found


def _bytes(text: str) -> int:
    """"32K" -> 32768, "1M" -> 1048576, "512" -> 512."""
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
    return int(text[:-1] if scale > 1 else text) * scale


_PROCESSOR: str | None = None


def processor() -> str:
    """The CPU as /proc/cpuinfo describes its first processor (what LLVM's host CPU name
    and features come from: vendor, family, model, stepping, flags), without the lines
    that change while it runs; `platform.processor()` where there is no /proc/cpuinfo."""
    global _PROCESSOR
    if _PROCESSOR is None:
        _PROCESSOR = _read_processor()
    return _PROCESSOR


def _read_processor() -> str:
    try:
        with open("/proc/cpuinfo", "rb") as f:
            first = f.read(16384).split(b"\n\n", 1)[0].decode(errors="replace")
    except OSError:
        import platform
        return platform.processor() or "unknown"
    kept = ("vendor_id", "cpu family", "model", "model name", "stepping", "flags",
            "Features", "CPU implementer", "CPU part", "CPU variant")
    return "\n".join(line for line in first.splitlines()
                     if line.split(":", 1)[0].strip() in kept)


@lru_cache(maxsize=1)
def cpu_from_os() -> tuple[str, frozenset[str]] | None:
    """(a description of the CPU, its feature flags) as the OS reports them, or None where
    it reports no flags (then ask LLVM). The CPU backend's Target is made from this: a
    compile's cache key then needs no LLVM, whose import (~25 ms) a cold compile leaves
    to the optimizer process. Flags are what LLVM's host detection reads too (CPUID, less
    what the kernel disabled), so equal descriptions mean equal LLVM host features."""
    text = processor()
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    flags = fields.get("flags") or fields.get("Features")
    if not flags:
        return None
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    name = fields.get("model name") or fields.get("CPU part") or "unknown CPU"
    return f"{os.uname().machine}, {name} (cpuinfo {digest})", frozenset(flags.split())


def vector_bytes(flags) -> int:
    """The widest SIMD registers a CPU with these feature flags has (OS or LLVM names)."""
    flags = {f.lstrip("+") for f in flags}
    if "avx512f" in flags:
        return 64
    if "avx" in flags:
        return 32
    return 16


def bounds_checking(options=None) -> bool:
    """Whether every array access is checked: `Options(check_bounds=True)` or
    TCLANG_CHECK_BOUNDS=1."""
    if options is not None and options.check_bounds is not None:
        return bool(options.check_bounds)
    return switch("TCLANG_CHECK_BOUNDS", False)
