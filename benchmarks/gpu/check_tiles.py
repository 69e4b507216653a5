import sys, numpy as np, tclang as tc
from benchmarks import kernels as K
backend = sys.argv[1] if len(sys.argv) > 1 else "cuda-emulated"
rng = np.random.default_rng(0)
def r(*s, dt=np.float32): return rng.standard_normal(s).astype(dt)
cases = [
 ("mm", K.MATMUL, "matmul", lambda: (r(67, 45), r(45, 131)), lambda a, b: a @ b),
 ("mm1", K.MATMUL, "matmul", lambda: (r(1, 45), r(45, 5000)), lambda a, b: a @ b),
 ("mmT", K.MATMUL_TRANSPOSED_A, "matmul_ta", lambda: (r(37, 129), r(37, 70)), lambda a, b: a.T @ b),
 ("mlp", K.MLP_LAYER, "mlp_layer", lambda: (r(97, 33), r(71, 33), r(71)), lambda x, w, b: np.maximum(x @ w.T + b, 0)),
 ("bmm", K.BMM, "bmm", lambda: (r(3, 65, 17), r(3, 17, 66)), lambda x, y: x @ y),
 ("conv", K.CONV2D, "conv2d", lambda: (r(2, 5, 13, 11), r(7, 5, 3, 3)), None),
 ("hmm", K.MATMUL.replace("float", "half"), "matmul", lambda: (r(67, 45, dt=np.float16), r(45, 131, dt=np.float16)), lambda a, b: (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16)),
 ("hmm3", K.MATMUL.replace("float", "half"), "matmul", lambda: (r(67, 200, dt=np.float16), r(200, 131, dt=np.float16)), lambda a, b: (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16)),
 ("hmmT", "def mt(half(K,M) A, half(N,K) B) -> (C) { C(m,n) +=! A(k,m) * B(n,k) }", "mt", lambda: (r(300, 130, dt=np.float16), r(129, 300, dt=np.float16)), lambda a, b: (a.astype(np.float32).T @ b.astype(np.float32).T).astype(np.float16)),
 ("hmm2", K.MATMUL.replace("float", "half"), "matmul", lambda: (r(128, 64, dt=np.float16), r(64, 256, dt=np.float16)), lambda a, b: (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16)),
]
def conv_ref(I, W):
    N, C, H, Wd = I.shape; M, _, KH, KW = W.shape
    O = np.zeros((N, M, H - KH + 1, Wd - KW + 1), np.float64)
    for kh in range(KH):
        for kw in range(KW):
            O += np.einsum("nchw,mc->nmhw", I[:, :, kh:kh + H - KH + 1, kw:kw + Wd - KW + 1].astype(np.float64), W[:, :, kh, kw].astype(np.float64))
    return O
only = sys.argv[2:] 
for name, src, entry, mk, ref in cases:
    if only and name not in only: continue
    args = mk()
    k = getattr(tc.define(src, backend=backend), entry)
    out = k(*args)
    exp = conv_ref(*args) if ref is None else ref(*args)
    err = np.abs(out.astype(np.float64) - exp).max() / max(1e-30, np.abs(exp).max())
    plan = "tile" if "tile of the sum" in k.compile(*args).loops else "isl"
    print(f"{name:6s} {str(out.shape):18s} rel.err {err:.2e} {plan}", "OK" if err < (2e-3 if out.dtype == np.float16 else 1e-5) else "BAD")
