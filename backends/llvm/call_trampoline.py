"""A native entry for kernel calls: Python calls it as a builtin function (CPython's
METH_FASTCALL convention), and it calls the kernel with the arrays' data pointers.

Why: a tiny kernel's call through ctypes costs ~2 µs (argument conversion, a fresh error
record, the foreign call), more than NumPy spends adding 16 floats; issue 12 asks a hot
call for at most 2 µs over `np.add`. This entry takes the NumPy arrays themselves, reads
each data pointer at the field offset that backends/llvm/pointers.py verified, lets other
Python threads run while the kernel runs (as ctypes does), and returns 0, or the kernel's
error record as bytes when an access fell out of bounds.

It serves specialized kernels (sizes and strides are constants in their code, so a call
passes only data pointers), through their `tclang_packed` entry (the pointers as one
array: one entry for every arity), and kernels that read sizes or strides at run time
bound to one call's: the state's "bound_sizes" and "bound_strides" (else "unused") are what the
kernel gets, which only a signature that fixes the shapes and strides makes right. Either the runtime checked every
array before (the hot path's key), or the entry has a *signature*: the type, dtype, shape
and strides that the first arrays (the inputs) must have, compared here in a few
nanoseconds; arrays that differ get MISMATCH back and nothing runs, so the runtime's
fastest path is one call of this entry for the most recent kind of call. Its per-kernel state is a ctypes
array (fields STATE) that the builtin holds as `self`, whose data pointer it reads at
SELF_DATA_OFFSET (fast_calls.py verifies that offset before any entry is made): the
kernel, parallel_for, the C-API functions it calls and the arrays' data-pointer offset.

The IR is text appended to the thread pool's module (threads.runtime_object), so the disk
cache's copy of that module carries it and loading it needs no LLVM.
"""

from __future__ import annotations

SELF_DATA_OFFSET = 16  # where a ctypes array object keeps its data pointer (CPython, 64-bit)
# the state array's fields, in order
STATE = ("kernel", "parallel_for", "unused", "save_thread", "restore_thread", "from_long",
         "from_bytes", "data_offset", "signature", "n_buffers", "bound_sizes", "bound_strides")
# ndarray fields (CPython 64-bit, NumPy 1.x and 2.x: PyArrayObject_fields), verified by
# pointers.py before any signature is used
TYPE_AT, ND_AT, DIMS_AT, STRIDES_AT, DESCR_AT = 8, 24, 32, 40, 56
MISMATCH = 1


def trampoline_ir(err_fields: int) -> str:
    """The function `tclang_call(self, args, nargs)` as LLVM IR text (typed-pointer
    syntax, like the module it is appended to). It calls the kernel's `tclang_packed`
    entry (kernel_module.py), which takes the data pointers as one array."""
    lines = [
        "define i8* @tclang_call(i8* %self, i8** %args, i64 %nargs) {",
        "entry:",
        f"  %sp.addr = getelementptr i8, i8* %self, i64 {SELF_DATA_OFFSET}",
        "  %sp.cast = bitcast i8* %sp.addr to i64**",
        "  %s = load i64*, i64** %sp.cast",
    ]
    for k, name in enumerate(STATE):
        lines += [f"  %{name}.p = getelementptr i64, i64* %s, i64 {k}",
                  f"  %{name}.i = load i64, i64* %{name}.p"]
    lines += [
        "  %bsizes = inttoptr i64 %bound_sizes.i to i8*",
        "  %bstrides = inttoptr i64 %bound_strides.i to i8*",
        "  %pf = inttoptr i64 %parallel_for.i to i8*",
        f"  %err = alloca [{err_fields} x i64], align 8",
        f"  store [{err_fields} x i64] zeroinitializer, [{err_fields} x i64]* %err",
        f"  %errp = bitcast [{err_fields} x i64]* %err to i8*",
        "  %save = inttoptr i64 %save_thread.i to i8* ()*",
        "  %restore = inttoptr i64 %restore_thread.i to void (i8*)*",
        "  %fromlong = inttoptr i64 %from_long.i to i8* (i64)*",
        "  %frombytes = inttoptr i64 %from_bytes.i to i8* (i8*, i64)*",
        "  %kernel = inttoptr i64 %kernel.i to i32 (i8**, i8*, i8*, i8*, i8*)*",
        "  %ptrs = alloca i8*, i64 %nargs",
        "  %fits = icmp eq i64 %nargs, %n_buffers.i",  # the kernel's own count, exactly
        "  br i1 %fits, label %check, label %mismatch",
    ]
    lines += _signature_check()
    lines += [
        "dispatch:",
        "  br label %ptr.loop",
        "ptr.loop:",
        "  %q = phi i64 [ 0, %dispatch ], [ %q.next, %ptr.body ]",
        "  %q.more = icmp ult i64 %q, %nargs",
        "  br i1 %q.more, label %ptr.body, label %run",
        "ptr.body:",
        "  %o.p = getelementptr i8*, i8** %args, i64 %q",
        "  %o = load i8*, i8** %o.p",
        "  %dp.a = getelementptr i8, i8* %o, i64 %data_offset.i",
        "  %dp.c = bitcast i8* %dp.a to i8**",
        "  %dp = load i8*, i8** %dp.c",
        "  %slot = getelementptr i8*, i8** %ptrs, i64 %q",
        "  store i8* %dp, i8** %slot",
        "  %q.next = add i64 %q, 1",
        "  br label %ptr.loop",
        "run:",
        "  %ts = call i8* %save()",
        "  %r = call i32 %kernel(i8** %ptrs, i8* %bsizes, i8* %bstrides, i8* %errp, i8* %pf)",
        "  call void %restore(i8* %ts)",
        "  %ok = icmp eq i32 %r, 0",
        "  br i1 %ok, label %zero, label %failed",
        "zero:",
        "  %z = call i8* %fromlong(i64 0)",
        "  ret i8* %z",
        "failed:",
        f"  %b = call i8* %frombytes(i8* %errp, i64 {8 * err_fields})",
        "  ret i8* %b",
        "mismatch:",
        f"  %mm = call i8* %fromlong(i64 {MISMATCH})",
        "  ret i8* %mm",
        "}",
    ]
    return "\n".join(lines) + "\n"


def _signature_check() -> list[str]:
    """With a signature (state field "signature": 0 for none), the first arrays must look
    exactly like it, else the entry returns MISMATCH without running anything. Layout, in
    int64s: the count of arrays checked, then per array its type, its dtype object, ndim,
    the extents and the strides (bytes), all compared with the object's own fields."""
    def field(obj: str, at: int, name: str, kind: str = "i64") -> list[str]:
        return [f"  %{name}.a = getelementptr i8, i8* {obj}, i64 {at}",
                f"  %{name}.c = bitcast i8* %{name}.a to {kind}*",
                f"  %{name} = load {kind}, {kind}* %{name}.c"]

    def sig(index: str, name: str) -> list[str]:
        return [f"  %{name}.p = getelementptr i64, i64* %sig, i64 {index}",
                f"  %{name} = load i64, i64* %{name}.p"]

    return [
        "check:",
        "  %has.sig = icmp ne i64 %signature.i, 0",
        "  br i1 %has.sig, label %sig.start, label %dispatch",
        "sig.start:",
        "  %sig = inttoptr i64 %signature.i to i64*",
        "  %n.checked = load i64, i64* %sig",
        "  %enough = icmp ule i64 %n.checked, %nargs",
        "  br i1 %enough, label %arr.loop, label %mismatch",
        "arr.loop:",
        "  %k = phi i64 [ 0, %sig.start ], [ %k.next, %dim.done ]",
        "  %pos = phi i64 [ 1, %sig.start ], [ %pos.next, %dim.done ]",
        "  %more = icmp ult i64 %k, %n.checked",
        "  br i1 %more, label %arr.body, label %dispatch",
        "arr.body:",
        "  %obj.p = getelementptr i8*, i8** %args, i64 %k",
        "  %obj = load i8*, i8** %obj.p",
        *field("%obj", TYPE_AT, "ty"),
        *sig("%pos", "want.ty"),
        "  %ty.ok = icmp eq i64 %ty, %want.ty",
        "  br i1 %ty.ok, label %arr.fields, label %mismatch",
        "arr.fields:",
        *field("%obj", DESCR_AT, "descr"),
        "  %pos1 = add i64 %pos, 1",
        *sig("%pos1", "want.descr"),
        *field("%obj", ND_AT, "nd32", "i32"),
        "  %nd = sext i32 %nd32 to i64",
        "  %pos2 = add i64 %pos, 2",
        *sig("%pos2", "want.nd"),
        "  %descr.ok = icmp eq i64 %descr, %want.descr",
        "  %nd.ok = icmp eq i64 %nd, %want.nd",
        "  %both.ok = and i1 %descr.ok, %nd.ok",
        "  br i1 %both.ok, label %arr.dims, label %mismatch",
        "arr.dims:",
        *field("%obj", DIMS_AT, "dims.i"),
        *field("%obj", STRIDES_AT, "strides.i"),
        "  %dims = inttoptr i64 %dims.i to i64*",
        "  %strides = inttoptr i64 %strides.i to i64*",
        "  %first.dim = add i64 %pos, 3",
        "  br label %dim.loop",
        "dim.loop:",
        "  %j = phi i64 [ 0, %arr.dims ], [ %j.next, %dim.body ]",
        "  %dim.more = icmp ult i64 %j, %nd",
        "  br i1 %dim.more, label %dim.body0, label %dim.done",
        "dim.body0:",
        "  %dim.p = getelementptr i64, i64* %dims, i64 %j",
        "  %dim = load i64, i64* %dim.p",
        "  %stride.p = getelementptr i64, i64* %strides, i64 %j",
        "  %stride = load i64, i64* %stride.p",
        "  %at.dim = add i64 %first.dim, %j",
        *sig("%at.dim", "want.dim"),
        "  %at.stride = add i64 %at.dim, %nd",
        *sig("%at.stride", "want.stride"),
        "  %dim.ok = icmp eq i64 %dim, %want.dim",
        "  %stride.ok = icmp eq i64 %stride, %want.stride",
        "  %ds.ok = and i1 %dim.ok, %stride.ok",
        "  br i1 %ds.ok, label %dim.body, label %mismatch",
        "dim.body:",
        "  %j.next = add i64 %j, 1",
        "  br label %dim.loop",
        "dim.done:",
        "  %k.next = add i64 %k, 1",
        "  %twice = shl i64 %nd, 1",
        "  %skip = add i64 %twice, 3",
        "  %pos.next = add i64 %pos, %skip",
        "  br label %arr.loop",
    ]
