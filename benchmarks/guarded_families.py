"""Guarded and windowed reductions: automatic against the best manual schedule, per family
(issue 33, item 2; docs/schedules.md, Guards out of vector loops).

    python benchmarks/guarded_families.py [--rounds 5] [--only depthwise,prefix] [--quick]

Families: causal (masked) attention, padded and strided depthwise convolution, max and
average pooling, transposed convolution, triangular (prefix) sums, batched trace; each a
generated set of sizes, strides and paddings. Every case is one `tc.compare` (interleaved
rounds, medians) of the automatic schedule against the manual knob sets of `MANUAL`; the
ratio printed is best manual time / automatic time (>= 1: automatic is at least as fast).
Say the machine's load (`uptime`) beside any figure.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import tclang as tc  # noqa: E402

MANUAL = ("fusion=min", "vectorize=off", "fusion=min,vectorize=off", "tile=off",
          "fusion=max")


def _window(name: str, op: str, init: str, stride: int, pad: int, k: int, body: str,
            channels: bool) -> str:
    """A windowed reduction `O(n,c,h,w) op= ...` over a k x k window, stride, padding."""
    y, x = f"{stride}*h+kh-{pad}", f"{stride}*w+kw-{pad}"
    inside = f"{y} >= 0 && {y} < H && {x} >= 0 && {x} < W"
    out = f"(H+2*{pad}-{k})/{stride}+1", f"(W+2*{pad}-{k})/{stride}+1"
    weight = ", float(C,KH,KW) Wt" if channels else ""
    value = body.format(y=y, x=x)
    return (f"def {name}(float(N,C,H,W) I{weight}) -> (O) {{\n"
            f"  O(n,c,h,w) {op}=! ({inside}) ? {value} : {init}\n"
            f"    where h in 0:{out[0]}, w in 0:{out[1]}, kh in 0:{k}, kw in 0:{k}\n}}")


def depthwise(stride: int, pad: int) -> str:
    return _window("depthwise", "+", "0.0", stride, pad, 3,
                   "I(n,c,{y},{x}) * Wt(c,kh,kw)", True)


def max_pool(stride: int, pad: int, k: int) -> str:
    return _window("max_pool", "max", "-3.0e38", stride, pad, k, "I(n,c,{y},{x})", False)


def avg_pool(stride: int, pad: int, k: int) -> str:
    return _window("avg_pool", "+", "0.0", stride, pad, k,
                   f"I(n,c,{{y}},{{x}}) / {float(k * k)}", False)


TRANSPOSED = """def transposed(float(N,C,H,W) I, float(C,M,KH,KW) Wt) -> (O) {
  O(n,m,y,x) +=! ((y - kh) % S == 0 && (x - kw) % S == 0 && (y - kh) / S >= 0 &&
                  (y - kh) / S < H && (x - kw) / S >= 0 && (x - kw) / S < W)
                 ? I(n,c,(y - kh) / S,(x - kw) / S) * Wt(c,m,kh,kw) : 0.0
    where y in 0:S*(H-1)+KH, x in 0:S*(W-1)+KW, kh in 0:KH, kw in 0:KW
}"""
PREFIX = """def prefix(float(N,M) A) -> (O) {
  O(i,j) +=! (k <= j) ? A(i,k) : 0.0 where j in 0:M, k in 0:M
}"""
TRACE = "def trace(float(B,N,N) A) -> (T) { T(b) +=! A(b,i,i) }"
CAUSAL = """def causal(float(S,D) Q, float(S,D) K, float(S,D) V) -> (O) {
  L(s,t) +=! (t <= s) ? Q(s,d) * K(t,d) : 0.0 where s in 0:S, t in 0:S
  Mx(s) max=! (t <= s) ? L(s,t) : -3.0e38 where s in 0:S, t in 0:S
  E(s,t) = (t <= s) ? exp(L(s,t) - Mx(s)) : 0.0 where s in 0:S, t in 0:S
  Z(s) +=! E(s,t)
  O(s,d) +=! E(s,t) * V(t,d) / Z(s)
}"""


def families(quick: bool):
    """(family, label, source, entry, input shapes) for each generated case."""
    n, c, hw = (1, 16, 33) if quick else (2, 64, 57)
    for stride, pad in ((1, 1), (2, 1), (2, 0), (1, 2)):
        yield ("depthwise", f"s{stride} p{pad} {c}x{hw}x{hw}", depthwise(stride, pad),
               "depthwise", [(n, c, hw, hw), (c, 3, 3)])
    for stride, pad, k in ((2, 1, 3), (2, 0, 2), (1, 1, 3)):
        for fam, make in (("max pool", max_pool), ("avg pool", avg_pool)):
            yield (fam, f"k{k} s{stride} p{pad}", make(stride, pad, k),
                   fam.replace(" ", "_"), [(n, c, hw, hw)])
    for stride in (2, 3):
        src = TRANSPOSED.replace("S", str(stride))
        yield ("transposed conv", f"s{stride}", src, "transposed",
               [(n, 8, hw // 2, hw // 2), (8, 8, 3, 3)])
    for rows, m in ((64, 257), (16, 1000) if not quick else (16, 300)):
        yield "prefix sum", f"{rows}x{m}", PREFIX, "prefix", [(rows, m)]
    for b, m in ((64, 301), (7, 1024) if not quick else (7, 200)):
        yield "batched trace", f"{b}x{m}x{m}", TRACE, "trace", [(b, m, m)]
    for s, d in ((127, 64), (256, 32) if quick else (509, 64)):
        yield "causal attention", f"S={s} D={d}", CAUSAL, "causal", [(s, d)] * 3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only", help="comma-separated parts of family names")
    ap.add_argument("--quick", action="store_true", help="smaller sizes")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    ratios: dict[str, list[float]] = {}
    print(f"load: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}")
    for family, label, source, entry, shapes in families(args.quick):
        if args.only and not any(w in family for w in args.only.split(",")):
            continue
        kernel = tc.define(source)[entry]
        inputs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        result = tc.compare(kernel, *inputs, manual=list(MANUAL), peers=(), rounds=args.rounds,
                            limits=False, progress=False)
        auto = result.row("automatic").seconds
        timed = [r for r in result.rows if r.kind == "manual" and r.seconds]
        best = min(timed, key=lambda r: r.seconds)
        ratio = best.seconds / auto
        ratios.setdefault(family, []).append(ratio)
        print(f"{family:17s} {label:22s} auto {auto * 1e3:8.3f} ms  best manual "
              f"{best.seconds * 1e3:8.3f} ms ({best.label})  auto/best {ratio:.2f}x",
              flush=True)
    print(f"load: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}")
    for family, rs in ratios.items():
        geo = math.exp(sum(math.log(r) for r in rs) / len(rs))
        print(f"{family:17s} geomean {geo:.2f}x  worst {min(rs):.2f}x  ({len(rs)} cases)")


if __name__ == "__main__":
    main()
