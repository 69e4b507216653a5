"""The loop IR as JSON: what the disk cache keeps so that a kernel loaded from it has its
loop IR without isl or a second run of the pipeline.

Every node is a frozen dataclass of the loop IR or of the checked program's typed
expressions it embeds (statement values), written as {"@": tag, field: value, ...} with
tuples as lists, `DType` by its value and a `Span` as its four numbers, under a format
number. Reading builds only the classes listed here, field by field: the data is checked,
never executed (the entry was authenticated too). The loop IR holds no `Affine` or
`SizeExpr` (polyhedral/subscripts.py lowered them), so neither can be read back.
"""

from __future__ import annotations

import dataclasses
import json

from polyhedral import loop_ir as L
from tclang.lang import program as P
from tclang.dtypes import DType
from tclang.errors import Span


def _classes() -> dict[str, type]:
    found: dict[str, type] = {}
    for prefix, module in (("L", L), ("P", P)):
        for name, value in vars(module).items():
            if isinstance(value, type) and dataclasses.is_dataclass(value) and \
                    value.__module__ == module.__name__:
                found[f"{prefix}.{name}"] = value
    return found


#: bumped when the loop IR's form changes (2: subscripts as index expressions; 3: the
#: temporaries' plans, contracted ones in `Scratch` buffers; 4: scatters' subscripts)
FORMAT = 4

_BY_TAG = _classes()
_TAG = {cls: tag for tag, cls in _BY_TAG.items()}
_FIELDS = {cls: tuple(f.name for f in dataclasses.fields(cls)) for cls in _BY_TAG.values()}


def to_data(value):
    """JSON-ready data for a loop-IR value (a Kernel, a node, an expression)."""
    if isinstance(value, DType):
        return {"@": "DType", "value": value.value}
    if isinstance(value, Span):  # a named tuple
        return {"@": "Span", "at": list(value)}
    cls = type(value)
    if cls in _TAG:
        data = {"@": _TAG[cls]}
        for name in _FIELDS[cls]:
            data[name] = to_data(getattr(value, name))
        return data
    if isinstance(value, tuple):
        return [to_data(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"no serialized form for {cls.__name__}")


def from_data(data):
    """The value `to_data` wrote; ValueError on anything else."""
    if isinstance(data, list):
        return tuple(from_data(v) for v in data)
    if isinstance(data, dict):
        tag = data.get("@")
        if tag == "DType":
            return DType(data["value"])
        if tag == "Span":
            return Span(*(int(x) for x in data["at"]))
        cls = _BY_TAG.get(tag)
        if cls is None:
            raise ValueError(f"unknown loop-IR node {tag!r}")
        names = _FIELDS[cls]
        if set(data) != {"@", *names}:
            raise ValueError(f"{tag} with fields {sorted(set(data) - {'@'})}")
        return cls(**{name: from_data(data[name]) for name in names})
    if data is None or isinstance(data, (bool, int, float, str)):
        return data
    raise ValueError(f"not loop-IR data: {type(data).__name__}")


def kernel_to_json(kernel: L.Kernel) -> bytes:
    data = {"format": FORMAT, "kernel": to_data(kernel)}
    return json.dumps(data, separators=(",", ":")).encode()


def kernel_from_json(blob: bytes) -> L.Kernel:
    data = json.loads(blob.decode())
    if not isinstance(data, dict) or set(data) != {"format", "kernel"} or \
            data["format"] != FORMAT:
        raise ValueError(f"a stored loop IR not in format {FORMAT}")
    kernel = from_data(data["kernel"])
    if not isinstance(kernel, L.Kernel):
        raise ValueError(f"a stored loop IR holds a {type(kernel).__name__}, not a Kernel")
    return kernel
