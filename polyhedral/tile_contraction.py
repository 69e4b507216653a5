"""Contractions on the GPU as tuned GEMMs compute them: one tile of the result per block.

A band whose work is one sum of products (`C(...) +=! A(...) * B(...)`, its init, and no
other statement) is a matrix product in disguise, whatever its layouts: each index of the
left side is read by the left operand only (a row index, `m`), by the right one only (a
column index, `n`) or by both (a batch index, `b`), and each reduction index by both (`k`).
Several indices of one kind are one flattened dimension, row-major (a convolution's
`n, h, w` are its rows, its `c, kh, kw` the depth), so matmul, a transposed operand, a
batched product, an MLP layer and a direct convolution are one kernel: an implicit GEMM.

The isl mapping (polyhedral/gpu.py) gives such a band a thread per point and a 4x4
register tile at best; tuned SGEMMs take 8x8 per thread and feed the tensor cores where the
operands are half. The launch built here is one `L.TileContraction` node whose semantics
are the sum itself (the loop IR's contract), with the tile shape chosen from the sizes and
the device; the backend lays out shared memory, loads (vectors where the run-time strides
allow), and multiplies (backends/cuda/codegen.py). The elementwise statements of the next
band that read the sum only at their own point (a bias and an activation, the rounding of a
half result to half) run in the same launch, on the tile each block just wrote.

Only for specialized sizes (the tile choice and the grid need them), for statements over
their whole box (no guard in the domain), affine subscripts, and float32 (CUDA cores) or
float16 and bfloat16 (tensor cores; bfloat16 from sm_80) operands; a manual GPU schedule (tile, block or grid options) keeps
the isl mapping, as do `shared_memory=False`, `private_memory=False` and bounds checking.
"""

from __future__ import annotations

import islpy as isl

from polyhedral import loop_ir as L
from polyhedral.isl_callbacks import sets
from polyhedral.reductions import _domain_guard
from polyhedral.scop import Scop, ScopStatement
from polyhedral.subscripts import affine_index, size_index
from tclang.dtypes import DType
from tclang.lang import program as P
from tclang.lang.affine import Affine
from tclang.options import Options
from tclang.target import Target

MIN_BLOCKS = 264  # two blocks for each of an H100's 132 multiprocessors
MIN_POINTS = 64 * 64  # smaller products keep the isl mapping (a launch of a few blocks)
MIN_DEPTH = 16
# (rows, cols) of a block's tile, best first: the first with enough blocks is taken
TILES = ((128, 128), (128, 64), (64, 128), (64, 64))
SIMT_DEPTH = 8  # a tile's depth: 8 x (128 + 128) floats a stage
MMA_DEPTH = 32  # two 16-deep steps of the tensor cores a stage
MMA_DTYPES = (DType.FLOAT16, DType.BFLOAT16)
STAGES = 3


def plan_tile_contraction(node: isl.ScheduleNode, scop: Scop, options: Options,
                          target: Target, next_statements: list[str] = ()):
    """(body, grid, block, absorbed statement ids) of a launch computing the band's
    contraction a tile per block, or None where the band is not one (or it does not pay)."""
    if scop.sizes is None or options.block or options.grid or options.tile is not None or \
            options.shared_memory is False or options.private_memory is False or \
            options.check_bounds or target.bounds_checked:
        return None
    names = [s.get_tuple_name() for s in sets(node.get_domain())]
    statements = [scop.statement(n) for n in names]
    updates = [st for st in statements if st.kind == "reduce"]
    if len(updates) != 1:
        return None
    st = updates[0]
    s = st.source
    inits = [x for x in statements if x.kind == "init"]
    if inits and inits[0].source is not s or len(inits) > 1:
        return None
    # assignments fused into the band after the sum (a bias and an activation): followers
    own = sorted((x for x in statements if x.kind == "assign"), key=lambda x: x.source.position)
    if any(x.source.position < s.position for x in own):
        return None
    if s.op != "+" or not s.reduction_indices or s.condition is not None or \
            _domain_guard(scop, st) is not None:
        return None
    if scop.definition.tensor(s.target).dtype != DType.FLOAT32:
        return None
    operands = _product_of_reads(s.rhs)
    if operands is None:
        return None
    left, right = operands
    if left.dtype != right.dtype:
        return None
    if left.dtype == DType.FLOAT32:
        engine = "simt"
    elif left.dtype in MMA_DTYPES and _has_tensor_cores(target, left.dtype):
        engine = "mma"
    else:
        return None
    roles = _roles(s, left, right)
    if roles is None:
        return None
    rows_ix, cols_ix, depth_ix, batch_ix = roles
    if not rows_ix or not cols_ix:
        return None
    sizes = scop.sizes
    extent = {i: max(0, s.range_of(i).extent.evaluate(sizes)) for i in s.all_indices}
    rows, cols = _volume(rows_ix, extent), _volume(cols_ix, extent)
    depth, batch = _volume(depth_ix, extent), _volume(batch_ix, extent)
    if rows * cols < MIN_POINTS or depth < MIN_DEPTH or batch > target.max_grid[2]:
        return None
    tile = _choose_tile(rows, cols, batch, target)
    if tile is None:
        return None
    bm, bn = tile
    values = {}
    values.update(_flattened(L.Var(L.TILE_M), rows_ix, s, extent, sizes))
    values.update(_flattened(L.Var(L.TILE_N), cols_ix, s, extent, sizes))
    values.update(_flattened(L.Var(L.TILE_K), depth_ix, s, extent, sizes))
    values.update(_flattened(L.Var(L.TILE_B), batch_ix, s, extent, sizes))
    a = _operand(left, values, scop, {"m": rows_ix, "k": depth_ix})
    b = _operand(right, values, scop, {"k": depth_ix, "n": cols_ix})
    mine = [x.id for x in own]
    followers = _followers(mine + list(next_statements), st, scop) or \
        _followers(mine, st, scop)
    if len(followers) < len(own):
        return None  # the band's own assignments cannot follow the tile: not this launch
    # a follower's indices are, position by position, the sum's left side (_followers)
    at_point = tuple(values[i] for i in s.indices)
    follower_runs = tuple(L.Run(f.id, at_point) for f in followers)
    depth_tile = MMA_DEPTH if engine == "mma" else SIMT_DEPTH
    warp_tile = _warp_tile(bm, bn) if engine == "mma" else (0, 0)
    body = L.TileContraction(
        a, b, s.target, DType.FLOAT32, at_point, None if inits else "+",
        L.Int(rows), L.Int(cols), L.Int(depth), L.Int(batch), (bm, bn, depth_tile), engine,
        warp_tile, follower_runs, _stages(engine, depth, depth_tile, target))
    grid = (L.Int(-(-cols // bn)), L.Int(-(-rows // bm)), L.Int(batch))
    return body, grid, (tile_threads(body),), tuple(f.id for f in followers[len(own):])


def tile_threads(n: L.TileContraction) -> int:
    """The threads of a block: a warp per warp tile (tensor cores), or one per 8 x 8
    register tile (CUDA cores)."""
    bm, bn, _ = n.tile
    if n.engine == "mma":
        wm, wn = n.warp_tile
        return 32 * (bm // wm) * (bn // wn)
    return (bm // 8) * (bn // 8)


def _warp_tile(bm: int, bn: int) -> tuple[int, int]:
    """64 x 32 points per warp (4 x 2 fragments of 16 x 16) in a 128 x 128 tile: each
    fragment of the left operand feeds two products, each of the right four; 32 x 32 in
    the smaller tiles, so that a block still has four to eight warps."""
    return (64, 32) if (bm, bn) == (128, 128) else (32, 32)


def _choose_tile(rows: int, cols: int, batch: int, target: Target):
    """The largest tile that leaves enough blocks to fill the device (and does not overhang
    a small dimension by more than it covers), else the one with the most blocks."""
    fitting = [(bm, bn) for bm, bn in TILES
               if (bm <= max(64, rows) and bn <= max(64, cols))
               and -(-rows // bm) <= target.max_grid[1]]
    if not fitting:
        return None
    for bm, bn in fitting:
        if -(-rows // bm) * -(-cols // bn) * batch >= MIN_BLOCKS:
            return bm, bn
    return max(fitting, key=lambda t: -(-rows // t[0]) * -(-cols // t[1]))


def _stages(engine: str, depth: int, depth_tile: int, target: Target) -> int:
    """Slices in shared memory: STAGES on the tensor cores of sm_80 and later (whose
    asynchronous copies keep them in flight; over 48 KB a block, dynamic shared memory),
    two elsewhere and where the depth has fewer slices."""
    if engine != "mma" or _compute_capability(target) < 80:
        return 2
    return max(2, min(STAGES, -(-depth // depth_tile)))


def _compute_capability(target: Target) -> int:
    if target.name == "cuda-emulated":
        return 90
    for word in target.arch.split():
        if word.startswith("sm_") and word[3:].isdigit():
            return int(word[3:])
    return 0


def _has_tensor_cores(target: Target, dtype: DType) -> bool:
    """WMMA's half fragments from sm_70, bfloat16's from sm_80; the CPU emulation of them."""
    return _compute_capability(target) >= (80 if dtype is DType.BFLOAT16 else 70)


def _strip_casts(e: P.Expr) -> P.Expr:
    """A read under casts that widen it exactly to float32 (a half, a bfloat16, a float)."""
    while type(e) is P.Cast and e.dtype == DType.FLOAT32 and \
            e.operand.dtype in (DType.FLOAT16, DType.BFLOAT16, DType.FLOAT32):
        e = e.operand
    return e


def _product_of_reads(rhs: P.Expr):
    """(left read, right read) if the value is their product (under exact widenings)."""
    e = _strip_casts(rhs)
    if type(e) is not P.Binary or e.op != "mul":
        return None
    if e.dtype not in (DType.FLOAT32, DType.FLOAT16, DType.BFLOAT16):
        return None
    pair = (_strip_casts(e.lhs), _strip_casts(e.rhs))
    for r in pair:
        if type(r) is not P.Read or r.is_gather or r.guard is not None or \
                any(a is None for a in r.affine):
            return None
    if e.dtype.is_narrow_float and any(r.dtype != e.dtype for r in pair):
        return None
    return pair


def _roles(s: P.Statement, left: P.Read, right: P.Read):
    """(row, column, depth, batch) indices in order, or None if a reduction index is not
    read by both operands (a sum of one operand along it: no product to tile)."""
    def used(r: P.Read) -> set[str]:
        return set().union(*(a.indices() for a in r.affine)) if r.affine else set()

    in_a, in_b = used(left), used(right)
    rows = [i for i in s.indices if i in in_a and i not in in_b]
    cols = [i for i in s.indices if i in in_b and i not in in_a]
    batch = [i for i in s.indices if i not in rows and i not in cols]
    depth = list(s.reduction_indices)
    if any(k not in in_a or k not in in_b for k in depth):
        return None
    return rows, cols, depth, batch


def _volume(indices, extent) -> int:
    out = 1
    for i in indices:
        out *= extent[i]
    return out


def _flattened(flat: L.IExpr, indices, s: P.Statement, extent, sizes) -> dict:
    """Each index's value from the flattened coordinate `flat` (row-major in `indices`),
    offset by the index's lower bound."""
    values = {}
    rest = flat
    for k in reversed(range(len(indices))):
        name = indices[k]
        here = L.Op("rem", (rest, L.Int(extent[name]))) if k > 0 else rest
        lo = size_index(s.range_of(name).lo, sizes)
        values[name] = L.add(lo, here)
        rest = L.Op("div_nonneg", (rest, L.Int(extent[name])))
    return values


def _operand(read: P.Read, values: dict, scop: Scop, groups: dict) -> L.TileOperand:
    bindings = {L.index_var(i).name: v for i, v in values.items()}
    index = tuple(L.substitute(affine_index(a, scop.sizes), bindings) for a in read.affine)
    linear = all(a.is_linear for a in read.affine) and \
        all(len(ix) <= 1 for ix in groups.values())
    fast = ""
    last = read.affine[-1] if read.affine else None
    if last is not None:
        for var, ix in groups.items():
            if len(ix) == 1 and last.coefficient(ix[-1]) == 1 and \
                    all(last.coefficient(j) == 0 for other in groups.values()
                        for j in other if j != ix[-1]):
                fast = var
    tensor = scop.definition.tensor(read.tensor)
    return L.TileOperand(read.tensor, tensor.dtype, index, linear, fast)


def _followers(names, st: ScopStatement, scop: Scop) -> list[ScopStatement]:
    """The next band's statements if each point's can run right after the block wrote its
    sum: assignments over exactly the contraction's left side (the same ranges, position
    by position), over their whole box, reading the contraction's result and anything a
    follower writes only at their own point."""
    if not names:
        return []
    s = st.source
    followers = [scop.statement(n) for n in names]
    written = {f.source.target for f in followers} | {s.target}
    for f in followers:
        fs = f.source
        if f.kind != "assign" or fs.reduction_indices or fs.condition is not None or \
                len(fs.indices) != len(s.indices) or _domain_guard(scop, f) is not None:
            return []
        for mine, theirs in zip(fs.indices, s.indices):
            a, b = fs.range_of(mine), s.range_of(theirs)
            if (a.lo, a.hi) != (b.lo, b.hi):
                return []
        own = tuple(Affine.index(i) for i in fs.indices)
        for read in [r for e in (fs.rhs, *fs.exists) for r in P.reads_of(e)]:
            if read.tensor in written and (read.is_gather or read.affine != own):
                return []
        if fs.target in {r.tensor for r in _reads(s)}:
            return []
    return followers


def _reads(s: P.Statement) -> list[P.Read]:
    return [r for e in (s.rhs, *s.exists) for r in P.reads_of(e)]
