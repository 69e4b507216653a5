"""Peers recognised from a definition's structure (tclang.peers), never from its name:
several spellings of each operator give the same library call, and that call computes
what the kernel computes."""

from __future__ import annotations

import numpy as np
import pytest

import tclang as tc
from tclang.peers import recognise


def _check(source: str, sizes: dict, expected: str, entry: str | None = None):
    """Recognise, then run the NumPy (and PyTorch) call and the kernel on random inputs:
    they agree."""
    mod = tc.define(source)
    kernel = mod[entry or mod.names[0]]
    op = recognise(kernel.definition, sizes)
    assert op is not None, f"not recognised: {source}"
    assert expected in op.name, op.name
    rng = np.random.default_rng(0)
    from tclang.tools.inputs import random_inputs
    inputs = random_inputs(kernel.definition, sizes, rng)
    got = kernel(*inputs)
    want = op.numpy([a.astype(np.float64) for a in inputs])
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)
    try:
        import torch as T
    except ImportError:
        return op
    with T.no_grad():
        peer = op.torch([T.from_numpy(a) for a in inputs]).numpy()
    np.testing.assert_allclose(got, peer, rtol=2e-4, atol=2e-4)
    return op


EINSUMS = [
    ("def f(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }",
     dict(M=5, K=7, N=3), "'ij,jk->ik'"),
    ("def f(float(M,K) A, float(K,N) B) -> (C) { C(i,j) +=! B(k,j) * A(i,k) }",
     dict(M=5, K=7, N=3), "einsum"),
    ("def f(float(M,K) A, float(K,N) B) -> (C) {\n T(i,k) = A(i,k)\n"
     " C(i,j) +=! T(i,k) * B(k,j)\n}", dict(M=5, K=7, N=3), "einsum"),
    ("def f(float(I,C,D) A, float(C,D,J) B) -> (O) { O(a,b) +=! A(a,c,d) * B(c,d,b) }",
     dict(I=4, C=3, D=5, J=6), "'ijk,jkl->il'"),
    ("def f(float(B,K,M) A, float(B,N,K) C) -> (O) { O(b,i,j) +=! A(b,k,i) * C(b,j,k) }",
     dict(B=2, K=3, M=4, N=5), "einsum"),
    ("def f(float(M,K) A) -> (G) { G(i,j) +=! A(i,k) * A(j,k) }", dict(M=4, K=6),
     "'ij,kj->ik'"),
]


@pytest.mark.parametrize("source,sizes,expected", EINSUMS)
def test_contractions_are_einsums_however_spelled(source, sizes, expected):
    op = _check(source, sizes, expected)
    assert "optimize=True" in op.numpy_text and op.torch_text.startswith("torch.einsum")


CONVOLUTIONS = [
    ("def c(float(N,C,H,W) I, float(M,C,KH,KW) Wt) -> (O) {\n"
     " O(n,m,h,w) +=! I(n,c,h+kh,w+kw) * Wt(m,c,kh,kw)\n}",
     dict(N=2, C=3, H=7, W=6, M=4, KH=3, KW=2), "conv2d"),
    ("def c(float(N,C,H,W) I, float(M,C,3,3) Wt) -> (O) {\n"
     " O(n,m,h,w) +=! (2*h + kh >= 1 && 2*h + kh <= H && 2*w + kw >= 1 && 2*w + kw <= W)"
     " ? Wt(m,c,kh,kw) * I(n,c,2*h+kh-1,2*w+kw-1) : 0\n"
     " where h in 0:(H+1)/2, w in 0:(W+1)/2, n in 0:N, m in 0:M, c in 0:C,"
     " kh in 0:3, kw in 0:3\n}",
     dict(N=2, C=3, H=8, W=7, M=4), "conv2d, stride 2, padding 1"),
    ("def c(float(N,H,W,C) I, float(KH,KW,C,M) Wt) -> (O) {\n"
     " O(n,y,x,m) +=! I(n,y+a,x+b,c) * Wt(a,b,c,m)\n}",
     dict(N=2, H=6, W=5, C=3, KH=2, KW=3, M=4), "conv2d"),
    ("def c(float(N,G,C,H,W) I, float(G,M,C,KH,KW) Wt) -> (O) {\n"
     " O(n,g,m,h,w) +=! I(n,g,c,h+kh,w+kw) * Wt(g,m,c,kh,kw)\n}",
     dict(N=2, G=2, C=3, H=6, W=6, M=2, KH=3, KW=3), "2 groups"),
    ("def c(float(N,C,H,W) I, float(C,KH,KW) Wt) -> (O) {\n"
     " O(n,c,h,w) +=! I(n,c,h+kh,w+kw) * Wt(c,kh,kw)\n}",
     dict(N=2, C=3, H=6, W=6, KH=3, KW=3), "3 groups"),
    ("def c(float(N,C,L) I, float(M,C,K) Wt) -> (O) {\n"
     " O(n,m,l) +=! I(n,c,l+2*k) * Wt(m,c,k)\n}", dict(N=2, C=3, L=11, M=4, K=3),
     "conv1d, dilation 2"),
]


LAYERS = [
    ("def l(float(B,I) X, float(O,I) W, float(O) bias) -> (Y) {\n"
     " Y(b,o) +=! X(b,i) * W(o,i)\n Y(b,o) = fmax(Y(b,o) + bias(o), 0)\n}",
     dict(B=5, I=7, O=3), "einsum 'ij,kj->ik' + bias, then ReLU"),
    ("def l(float(B,I) X, float(I,O) W, float(O) c) -> (Y) {\n"
     " T(b,o) +=! W(i,o) * X(b,i)\n Y(b,o) = max(0.0, c(o) + T(b,o))\n}",
     dict(B=5, I=7, O=3), "+ bias, then ReLU"),
    ("def c(float(N,C,H,W) I, float(M,C,KH,KW) W1, float(M) B) -> (O) {\n"
     " O(n,m,h,w) +=! I(n,c,h+kh,w+kw) * W1(m,c,kh,kw)\n O(n,m,h,w) = O(n,m,h,w) + B(m)\n}",
     dict(N=2, C=3, H=6, W=5, M=4, KH=3, KW=2), "conv2d + bias"),
    ("def c(float(N,G,C,H,W) I, float(G,F,C,KH,KW) W1, float(G,F) B) -> (O) {\n"
     " O(n,g,f,h,w) +=! I(n,g,c,h+kh,w+kw) * W1(g,f,c,kh,kw)\n"
     " O(n,g,f,h,w) = O(n,g,f,h,w) + B(g,f)\n}",
     dict(N=1, G=2, C=2, H=3, W=7, F=3, KH=2, KW=3), "2 groups + bias"),
]


@pytest.mark.parametrize("source,sizes,expected", LAYERS)
def test_layers_with_a_bias_and_relu(source, sizes, expected):
    _check(source, sizes, expected)


@pytest.mark.parametrize("source,sizes,expected", CONVOLUTIONS)
def test_convolutions_are_recognised_in_any_layout(source, sizes, expected):
    _check(source, sizes, expected)


POOLS = [
    ("def p(float(N,C,H,W) I) -> (O) {\n"
     " O(n,c,h,w) max=! I(n,c,2*h+kh,2*w+kw) where kh in 0:2, kw in 0:2\n}",
     dict(N=2, C=3, H=6, W=8), "max_pool2d, window 2"),
    ("def p(float(N,H,W,C) I) -> (O) {\n"
     " O(n,h,w,c) max=! I(n,2*h+a,2*w+b,c) where a in 0:3, b in 0:3\n}",
     dict(N=2, H=7, W=9, C=3), "max_pool2d, window 3, stride 2"),
    ("def p(float(N,C,H,W) I) -> (O) {\n"
     " O(n,c,h,w) +=! (h+kh >= 1 && h+kh <= H && w+kw >= 1 && w+kw <= W) ?"
     " I(n,c,h+kh-1,w+kw-1) / 9.0 : 0\n"
     " where kh in 0:3, kw in 0:3, h in 0:H, w in 0:W, n in 0:N, c in 0:C\n}",
     dict(N=1, C=2, H=5, W=6), "avg_pool2d, window 3, stride 1, padding 1"),
    ("def p(float(B,L) X) -> (O) {\n S(b,i) +=! X(b,2*i+k) where k in 0:2\n"
     " O(b,i) = S(b,i) * 0.5\n}", dict(B=3, L=10), "avg_pool1d, window 2"),
]


@pytest.mark.parametrize("source,sizes,expected", POOLS)
def test_pooling_is_recognised(source, sizes, expected):
    _check(source, sizes, expected)


CUMSUMS = [
    ("def s(float(N) X) -> (O) { O(i) +=! (j <= i) ? X(j) : 0 where j in 0:N, i in 0:N }",
     dict(N=9), "cumsum over axis 0"),
    ("def s(float(B,N) X) -> (O) {\n"
     " O(b,i) +=! (i >= j) ? X(b,j) : 0 where j in 0:N, i in 0:N, b in 0:B\n}",
     dict(B=3, N=7), "cumsum over axis 1"),
    ("def s(float(N,B) X) -> (O) {\n"
     " O(i,b) +=! (j < i + 1) ? X(j,b) : 0 where j in 0:N, i in 0:N, b in 0:B\n}",
     dict(B=3, N=7), "cumsum over axis 0"),
]


@pytest.mark.parametrize("source,sizes,expected", CUMSUMS)
def test_prefix_sums_are_cumsum(source, sizes, expected):
    _check(source, sizes, expected)


SOFTMAXES = [
    ("def s(float(N,D) X) -> (Y) {\n rowmax(n) max=! X(n,d)\n"
     " rowsum(n) +=! exp(X(n,d) - rowmax(n))\n Y(n,d) = exp(X(n,d) - rowmax(n)) / rowsum(n)\n}",
     dict(N=4, D=6), "softmax over axis 1"),
    ("def s(float(N,D) X) -> (Y) {\n E(n,d) = exp(X(n,d))\n S(n) +=! E(n,d)\n"
     " Y(n,d) = E(n,d) / S(n)\n}", dict(N=4, D=6), "softmax over axis 1"),
    ("def s(float(N,D) X) -> (Y) {\n m(a) max=! X(a,b)\n e(a,b) = exp(X(a,b) - m(a))\n"
     " t(a) +=! e(a,b)\n r(a) = 1.0 / t(a)\n Y(a,b) = e(a,b) * r(a)\n}",
     dict(N=4, D=6), "softmax over axis 1"),
    ("def s(float(N,D) X) -> (Y) {\n m(d) max=! X(n,d)\n t(d) +=! exp(X(n,d) - m(d))\n"
     " Y(n,d) = exp(X(n,d) - m(d)) / t(d)\n}", dict(N=4, D=6), "softmax over axis 0"),
    ("def s(float(B,H,D) X) -> (Y) {\n t(b,h) +=! exp(X(b,h,d) * 0.5)\n"
     " Y(b,h,d) = exp(X(b,h,d) * 0.5) / t(b,h)\n}", dict(B=2, H=3, D=5),
     "softmax over axis 2 of 0.5"),
]


@pytest.mark.parametrize("source,sizes,expected", SOFTMAXES)
def test_softmax_is_recognised_however_split(source, sizes, expected):
    _check(source, sizes, expected)


LAYERNORMS = [
    ("def l(float(N,D) X, float(D) g, float(D) b) -> (Y) {\n mean(n) +=! X(n,d) / D\n"
     " var(n) +=! (X(n,d) - mean(n)) * (X(n,d) - mean(n)) / D\n"
     " Y(n,d) = (X(n,d) - mean(n)) / sqrt(var(n) + 1e-5) * g(d) + b(d)\n}",
     dict(N=4, D=8), "layer_norm over axis 1, eps 1e-05, with scale and shift"),
    ("def l(float(N,D) X, float(D) gamma, float(D) beta) -> (Y) {\n s(n) +=! X(n,d)\n"
     " q(n) +=! X(n,d) * X(n,d)\n mu(n) = s(n) / D\n"
     " r(n) = rsqrt(q(n) / D - mu(n) * mu(n) + 1e-3)\n"
     " Y(n,d) = beta(d) + gamma(d) * ((X(n,d) - mu(n)) * r(n))\n}",
     dict(N=4, D=8), "eps 0.001, with scale and shift"),
    ("def l(float(N,D) X) -> (Y) {\n m(n) +=! X(n,d) / D\n"
     " v(n) +=! pow(X(n,d) - m(n), 2) / D\n Y(n,d) = (X(n,d) - m(n)) / sqrt(v(n) + 1e-5)\n}",
     dict(N=4, D=8), "layer_norm over axis 1, eps 1e-05"),
]


@pytest.mark.parametrize("source,sizes,expected", LAYERNORMS)
def test_layernorm_is_recognised_however_the_moments_are_spelled(source, sizes, expected):
    _check(source, sizes, expected)


ATTENTIONS = [
    ("def a(float(S,D) Q, float(S,D) K, float(S,E) V) -> (O) {\n"
     " s(i,j) +=! Q(i,d) * K(j,d) * 0.25\n m(i) max=! s(i,j)\n"
     " e(i,j) = exp(s(i,j) - m(i))\n t(i) +=! e(i,j)\n O(i,c) +=! e(i,j) * V(j,c) / t(i)\n}",
     dict(S=6, D=4, E=3), "attention, scale 0.25"),
    ("def a(float(S,D) Q, float(S,D) K, float(S,E) V) -> (O) {\n"
     " s(i,j) +=! Q(i,d) * K(j,d)\n"
     " z(i,j) = (j <= i) ? s(i,j) * 0.5 : -1e30 where i in 0:S, j in 0:S\n m(i) max=! z(i,j)\n"
     " t(i) +=! exp(z(i,j) - m(i))\n O(i,c) +=! exp(z(i,j) - m(i)) / t(i) * V(j,c)\n}",
     dict(S=6, D=4, E=3), "attention, scale 0.5, causal mask"),
    ("def a(float(B,S,D) Q, float(B,S,D) K, float(B,S,E) V) -> (O) {\n"
     " s(b,i,j) +=! Q(b,i,d) * K(b,j,d)\n"
     " e(b,i,j) = (i >= j) ? exp(s(b,i,j) * 0.5) : 0 where b in 0:B, i in 0:S, j in 0:S\n"
     " t(b,i) +=! e(b,i,j)\n"
     " p(b,i,j) = e(b,i,j) / t(b,i)\n O(b,i,c) +=! p(b,i,j) * V(b,j,c)\n}",
     dict(B=2, S=5, D=4, E=3), "causal mask"),
]


@pytest.mark.parametrize("source,sizes,expected", ATTENTIONS)
def test_attention_is_recognised_with_and_without_a_causal_mask(source, sizes, expected):
    _check(source, sizes, expected)


@pytest.mark.parametrize("source,sizes", [
    # named like library operators, computing something else: no peer
    ("def conv2d(float(N) X) -> (Y) { Y(i) = X(i) * 2 }", dict(N=4)),
    ("def softmax(float(N,D) X) -> (Y) {\n s(n) +=! X(n,d)\n Y(n,d) = X(n,d) / s(n)\n}",
     dict(N=3, D=4)),
    ("def layernorm(float(N,D) X, float(D) g) -> (Y) {\n ms(n) +=! X(n,d) * X(n,d) / D\n"
     " Y(n,d) = X(n,d) / sqrt(ms(n) + 1e-5) * g(d)\n}", dict(N=3, D=4)),
    ("def cumsum(float(N) X) -> (O) { O(i) +=! (j < i) ? X(j) : 0 where j in 0:N, i in 0:N }",
     dict(N=5)),
    ("def embedding(float(E,D) T, int32(B) Ids) -> (O) { O(b,d) = T(Ids(b),d) }",
     dict(E=4, D=3, B=2)),
])
def test_names_prove_nothing(source, sizes):
    mod = tc.define(source)
    assert recognise(mod[mod.names[0]].definition, sizes) is None
