"""The operators the benchmarks time, in one place (sources and their sizes)."""

MATMUL = "def matmul(float(M,K) A, float(K,N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }"

MLP_LAYER = """def mlp_layer(float(B,I) X, float(O,I) W, float(O) b) -> (Y) {
    Y(n, o) +=! X(n, i) * W(o, i)
    Y(n, o)  = fmax(Y(n, o) + b(o), 0)
}"""

MLP3 = """def mlp3(float(B,I) X, float(H,I) W1, float(H) b1, float(H,H) W2, float(H) b2,
          float(O,H) W3, float(O) b3) -> (Y) {
    H1(n, h) +=! X(n, i) * W1(h, i)
    H1(n, h)  = fmax(H1(n, h) + b1(h), 0)
    H2(n, g) +=! H1(n, h) * W2(g, h)
    H2(n, g)  = fmax(H2(n, g) + b2(g), 0)
    Y(n, o)  +=! H2(n, g) * W3(o, g)
    Y(n, o)   = fmax(Y(n, o) + b3(o), 0)
}"""

CHAIN = "def chain(float(N) X, float(N) Y) -> (Z) { Z(i) = exp(X(i)) * Y(i) + X(i) }"

SOFTMAX = """def softmax(float(N, D) X) -> (Y) {
    m(n) max=! X(n, d)
    s(n) +=! exp(X(n, d) - m(n))
    Y(n, d) = exp(X(n, d) - m(n)) / s(n)
}"""

LAYERNORM = """def layernorm(float(N, D) X, float(D) gamma, float(D) beta) -> (Y) {
    mean(n) +=! X(n, d) / D
    var(n) +=! (X(n, d) - mean(n)) * (X(n, d) - mean(n)) / D
    Y(n, d) = (X(n, d) - mean(n)) * rsqrt(var(n) + 1e-5) * gamma(d) + beta(d)
}"""

CONV2D = """def conv2d(float(N, C, H, W) I, float(M, C, KH, KW) Wt) -> (O) {
    O(n, m, h, w) +=! I(n, c, h + kh, w + kw) * Wt(m, c, kh, kw)
}"""

BMM = """def bmm(float(B, N, M) X, float(B, M, K) Y) -> (Z) {
    Z(b, n, k) +=! X(b, n, m) * Y(b, m, k)
}"""

MATMUL_TRANSPOSED_A = """def matmul_ta(float(K,M) At, float(K,N) B) -> (C) {
    C(m, n) +=! At(k, m) * B(k, n)
}"""

CONV2D_1X1 = """def conv1x1(float(N, C, H, W) I, float(M, C) Wt) -> (O) {
    O(n, m, h, w) +=! I(n, c, h, w) * Wt(m, c)
}"""

ATTENTION = """def attention(float(S, D) Q, float(T, D) K, float(T, E) V) -> (O) {
    Sc(s, t) +=! Q(s, d) * K(t, d) * 0.125
    Mx(s) max=! Sc(s, t)
    Ex(s, t) = exp(Sc(s, t) - Mx(s))
    Sm(s) +=! Ex(s, t)
    O(s, e) +=! Ex(s, t) * V(t, e) / Sm(s)
}"""

RMSNORM = """def rmsnorm(float(N, D) X, float(D) gamma) -> (Y) {
    ms(n) +=! X(n, d) * X(n, d) / D
    Y(n, d) = X(n, d) * rsqrt(ms(n) + 1e-5) * gamma(d)
}"""

BIAS_GELU = """def bias_gelu(float(N, D) X, float(D) b) -> (Y) {
    Y(n, d) = 0.5 * (X(n, d) + b(d)) * (1 + tanh(0.7978845608 * ((X(n, d) + b(d))
              + 0.044715 * (X(n, d) + b(d)) * (X(n, d) + b(d)) * (X(n, d) + b(d)))))
}"""
