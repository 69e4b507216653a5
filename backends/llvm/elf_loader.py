"""Link a relocatable x86-64 ELF object (what our target machine emits) into this process,
without LLVM.

Why: loading object code through llvmlite means importing llvmlite.binding (~27 ms here)
and creating an MCJIT engine per kernel; a kernel that the disk cache holds must start in
a few milliseconds (issue 12's target for a disk hit is 20 ms, import of LLVM included).
The objects we load are narrow: our own target machine's output with `reloc="pic"` and the
JIT's default (large) code model, so every reference is a 64-bit GOT-relative or absolute
one, and the disk cache authenticates each object before it gets here. This module handles
exactly that shape and refuses anything else with `Unsupported`, after which the caller
loads the same bytes with MCJIT (jit.py): another architecture, an unknown relocation, a
symbol the process cannot resolve, memory that cannot be made executable.

What it does, as a static linker plus a loader would: lay the allocated sections out in
one anonymous mapping (code and read-only data first, then a GOT, then writable data and
zeroed .bss on pages of their own), apply the relocations, then make the code pages
read+execute. Unwind tables (.eh_frame) are not registered: generated kernels never
unwind (no C++ exceptions pass through them). The mapping lives as long as the returned
`LoadedObject`.
"""

from __future__ import annotations

import ctypes
import os
import struct
import weakref
from typing import Callable

EM_X86_64 = 62
SHT_NOBITS, SHT_RELA, SHT_SYMTAB, SHT_X86_64_UNWIND = 8, 4, 2, 0x70000001
SHF_WRITE, SHF_ALLOC, SHF_EXECINSTR = 0x1, 0x2, 0x4
SHN_UNDEF, SHN_ABS, SHN_COMMON = 0, 0xFFF1, 0xFFF2
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
PROT_READ, PROT_WRITE, PROT_EXEC = 1, 2, 4
MAP_PRIVATE, MAP_ANONYMOUS = 0x02, 0x20

# x86-64 relocation types (System V psABI, table 4.9)
R_64, R_PC32, R_PLT32, R_GOTPCREL, R_32, R_32S = 1, 2, 4, 9, 10, 11
R_PC64, R_GOTOFF64, R_GOTPC32, R_GOT64, R_GOTPCREL64, R_GOTPC64 = 24, 25, 26, 27, 28, 29
R_PLTOFF64, R_GOTPCRELX, R_REX_GOTPCRELX = 31, 41, 42
_GOT_RELATIVE = (R_GOTPCREL, R_GOT64, R_GOTPCREL64, R_GOTPCRELX, R_REX_GOTPCRELX)


class Unsupported(Exception):
    """This object is not one this loader links (the caller uses MCJIT instead)."""


def supported_host() -> bool:
    return os.uname().machine == "x86_64" and _libc is not None


try:
    _libc = ctypes.CDLL(None, use_errno=True)
    _mmap = _libc.mmap
    _mmap.restype = ctypes.c_void_p
    _mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                      ctypes.c_int, ctypes.c_long]
    _mprotect = _libc.mprotect
    _mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    _munmap = _libc.munmap
    _munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
except (OSError, AttributeError):  # not a POSIX libc
    _libc = None


def process_symbol(name: str) -> int:
    """The address of a function or variable the process has loaded (libc, libm, ...)."""
    try:
        return ctypes.cast(getattr(_libc, name), ctypes.c_void_p).value or 0
    except AttributeError:
        return 0


class LoadedObject:
    """One linked object: `symbols` maps each defined global symbol to its address."""

    def __init__(self, base: int, size: int, symbols: dict[str, int]):
        self.symbols = symbols
        weakref.finalize(self, _munmap, base, size).atexit = False

    def address(self, name: str) -> int:
        return self.symbols.get(name, 0)


def load_object(data: bytes, resolve: Callable[[str], int] = process_symbol) -> LoadedObject:
    """Link `data` (a relocatable ELF64 x86-64 object) into the process; `resolve` gives the
    address of each undefined symbol (0: unknown, then Unsupported)."""
    if not supported_host():
        raise Unsupported("not an x86-64 host with a POSIX libc")
    sections = _sections(data)
    placed, got_at, size, writable_at = _layout(sections, data)
    symbols = _symbols(data, sections)
    base = _map(size)
    try:
        addresses = {k: base + off for k, off in placed.items()}
        values, names = _symbol_values(symbols, addresses, resolve)
        for k, sec in enumerate(sections):  # section contents
            if k in placed and sec["type"] != SHT_NOBITS and sec["size"]:
                chunk = data[sec["offset"]:sec["offset"] + sec["size"]]
                ctypes.memmove(addresses[k], chunk, len(chunk))
        got = _GlobalOffsetTable(base + got_at)
        stubs = _Stubs(base + got_at + 8 * _got_slots(data, sections))
        for k, sec in enumerate(sections):
            if sec["type"] == SHT_RELA and sec["info"] in placed and _loaded(sections[sec["info"]]):
                _relocate(data, sec, addresses[sec["info"]], values, got, stubs)
        if writable_at and _mprotect(base, writable_at, PROT_READ | PROT_EXEC) != 0:
            raise Unsupported(f"mprotect refused executable pages (errno {ctypes.get_errno()})")
    except BaseException:
        _munmap(base, size)
        raise
    return LoadedObject(base, size, names)


def undefined_symbols(data: bytes) -> list[str]:
    """The names an ELF object needs from outside itself (none for another format): MCJIT
    leaves one it cannot resolve as address 0 and says nothing, so codegen.MCJITCode asks
    first."""
    try:
        sections = _sections(data)
        symbols = _symbols(data, sections)
    except Unsupported:
        return []
    return sorted({name for name, _binding, shndx, _value in symbols
                   if shndx == SHN_UNDEF and name and name != "_GLOBAL_OFFSET_TABLE_"})


def _sections(data: bytes) -> list[dict]:
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise Unsupported("not a little-endian ELF64 object")
    e_type, machine = struct.unpack_from("<HH", data, 16)
    if e_type != 1 or machine != EM_X86_64:
        raise Unsupported("not a relocatable x86-64 object")
    shoff, = struct.unpack_from("<Q", data, 40)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 58)
    if shentsize != 64 or shoff + 64 * shnum > len(data) or shstrndx >= shnum:
        raise Unsupported("the section table lies outside the object")
    sections = []
    for k in range(shnum):
        (name, kind, flags, _addr, offset, size, link, info, align,
         entsize) = struct.unpack_from("<IIQQQQIIQQ", data, shoff + 64 * k)
        if kind != SHT_NOBITS and offset + size > len(data):
            raise Unsupported("a section lies outside the object")
        sections.append(dict(name=name, type=kind, flags=flags, offset=offset, size=size,
                             link=link, info=info, align=max(1, align), entsize=entsize))
    return sections


def _loaded(sec: dict) -> bool:
    return bool(sec["flags"] & SHF_ALLOC) and sec["type"] != SHT_X86_64_UNWIND


def _layout(sections: list[dict], data: bytes):
    """{section index: offset} in the mapping: executable and read-only sections, then
    the GOT and the call stubs, then (page-aligned) the writable ones. Also the GOT's
    offset, the mapping's size and where the writable pages start."""
    placed: dict[int, int] = {}
    at = 0
    for writable in (False, True):
        if writable:
            got_at = at = _align(at, 16)
            at += 8 * _got_slots(data, sections) + 16 * _stub_slots(data, sections)
            writable_at = at = _align(at, PAGE)
        for k, sec in enumerate(sections):
            if _loaded(sec) and bool(sec["flags"] & SHF_WRITE) == writable:
                at = _align(at, sec["align"])
                placed[k] = at
                at += sec["size"]
    return placed, got_at, _align(max(at, 1), PAGE), writable_at


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def _relocations(data: bytes, sections: list[dict]):
    for sec in sections:
        if sec["type"] != SHT_RELA or sec["info"] >= len(sections) \
                or not _loaded(sections[sec["info"]]):
            continue
        for r in range(sec["size"] // 24):
            yield struct.unpack_from("<QQq", data, sec["offset"] + 24 * r)


def _got_slots(data: bytes, sections: list[dict]) -> int:
    """An upper bound: one slot per GOT-relative relocation (slots are shared per symbol)."""
    return sum(1 for _, info, _ in _relocations(data, sections)
               if info & 0xFFFFFFFF in _GOT_RELATIVE)


def _stub_slots(data: bytes, sections: list[dict]) -> int:
    return sum(1 for _, info, _ in _relocations(data, sections)
               if info & 0xFFFFFFFF in (R_PLT32, R_PLTOFF64))


def _symbols(data: bytes, sections: list[dict]) -> list[tuple[str, int, int, int]]:
    """(name, binding, section index, value) per symbol table entry."""
    table = next((s for s in sections if s["type"] == SHT_SYMTAB), None)
    if table is None:
        return []
    strings = sections[table["link"]]
    out = []
    for k in range(table["size"] // 24):
        name_at, info, _other, shndx, value, _size = struct.unpack_from(
            "<IBBHQQ", data, table["offset"] + 24 * k)
        start = strings["offset"] + name_at
        end = data.find(b"\0", start, strings["offset"] + strings["size"])
        if end < 0:
            raise Unsupported("a symbol name runs past its string table")
        out.append((data[start:end].decode("latin-1"), info >> 4, shndx, value))
    return out


def _symbol_values(symbols, addresses: dict[int, int], resolve):
    """Each symbol's address, and the defined globals by name."""
    values, names = [], {}
    for name, binding, shndx, value in symbols:
        if shndx == SHN_UNDEF:
            address = 0
            if name and name != "_GLOBAL_OFFSET_TABLE_":
                address = resolve(name)
                if not address:
                    raise Unsupported(f"the process has no symbol {name}")
        elif shndx == SHN_ABS:
            address = value
        elif shndx in addresses:
            address = addresses[shndx] + value
            if binding != 0 and name:  # global or weak
                names[name] = address
        elif shndx == SHN_COMMON:
            raise Unsupported(f"common symbol {name}")
        else:
            address = 0  # a section we do not load (debug info, unwind tables)
        values.append(address)
    return values, names


class _GlobalOffsetTable:
    def __init__(self, base: int):
        self.base = base
        self.slots: dict[int, int] = {}  # address -> slot offset

    def slot(self, address: int) -> int:
        if address not in self.slots:
            offset = 8 * len(self.slots)
            ctypes.c_uint64.from_address(self.base + offset).value = address
            self.slots[address] = offset
        return self.slots[address]


class _Stubs:
    """`jmp *0(%rip); .quad target` per far call target: a 32-bit call can reach it."""

    def __init__(self, base: int):
        self.base = base
        self.stubs: dict[int, int] = {}

    def stub(self, target: int) -> int:
        if target not in self.stubs:
            at = self.base + 16 * len(self.stubs)
            ctypes.memmove(at, b"\xff\x25\x00\x00\x00\x00" + struct.pack("<Q", target), 14)
            self.stubs[target] = at
        return self.stubs[target]


def _relocate(data: bytes, rela: dict, section_at: int, values: list[int],
              got: _GlobalOffsetTable, stubs: _Stubs) -> None:
    for r in range(rela["size"] // 24):
        offset, info, addend = struct.unpack_from("<QQq", data, rela["offset"] + 24 * r)
        kind, index = info & 0xFFFFFFFF, info >> 32
        if index >= len(values):
            raise Unsupported("a relocation names no symbol")
        s, p, g0 = values[index], section_at + offset, got.base
        if kind == R_64:
            _put64(p, s + addend)
        elif kind == R_PC64:
            _put64(p, s + addend - p)
        elif kind == R_GOTOFF64:
            _put64(p, s + addend - g0)
        elif kind == R_GOTPC64:
            _put64(p, g0 + addend - p)
        elif kind == R_GOT64:
            _put64(p, got.slot(s) + addend)
        elif kind == R_GOTPCREL64:
            _put64(p, g0 + got.slot(s) + addend - p)
        elif kind == R_PLTOFF64:
            _put64(p, stubs.stub(s) - g0 + addend)
        elif kind in (R_PC32, R_PLT32):
            value = s + addend - p
            if kind == R_PLT32 and not -2**31 <= value < 2**31:
                value = stubs.stub(s) + addend - p
            _put32(p, value, signed=True)
        elif kind in (R_GOTPCREL, R_GOTPCRELX, R_REX_GOTPCRELX):
            _put32(p, g0 + got.slot(s) + addend - p, signed=True)
        elif kind == R_GOTPC32:
            _put32(p, g0 + addend - p, signed=True)
        elif kind == R_32:
            _put32(p, s + addend, signed=False)
        elif kind == R_32S:
            _put32(p, s + addend, signed=True)
        else:
            raise Unsupported(f"relocation type {kind}")


def _put64(place: int, value: int) -> None:
    ctypes.c_uint64.from_address(place).value = value & 0xFFFFFFFFFFFFFFFF


def _put32(place: int, value: int, signed: bool) -> None:
    if not (-2**31 <= value < 2**31 if signed else 0 <= value < 2**32):
        raise Unsupported("a 32-bit relocation does not reach its target")
    ctypes.c_uint32.from_address(place).value = value & 0xFFFFFFFF


def _map(size: int) -> int:
    address = _mmap(None, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
    if address in (None, ctypes.c_void_p(-1).value):
        raise Unsupported(f"mmap of {size} bytes failed (errno {ctypes.get_errno()})")
    return address
