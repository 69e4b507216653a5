"""Einsum-based layers, tensor networks and other operators from public model code for
the generality benchmark (the comment above each names the model and layer), written in
tclang for this benchmark. `big`: sizes of a few to tens of ms in NumPy; else small odd
extents.
"""

from __future__ import annotations

import numpy as np

from benchmarks.generality_cases import einsum_reference, model_case
from benchmarks.generality_models import GELU, _gelu
from benchmarks.generality_windows import F, torch

f64 = np.float64


def mixer_tokens(big):
    # google-research vision_transformer models_mixer.py, MixerBlock token mixing:
    # MlpBlock's first Dense along the patches (x transposed), then gelu
    b, t, s, c = (8, 196, 256, 512) if big else (1, 5, 3, 2)
    src = ("def mixer(float(B,T,C) X, float(S,T) W, float(S) Bs) -> (Y) {\n"
           "    A(b,s,c) +=! W(s,t) * X(b,t,c)\n"
           f"    Y(b,s,c) = {GELU.format(y='(A(b,s,c) + Bs(s))')}\n}}")
    return model_case(f"MLP-Mixer token mixing B={b} T={t} S={s} C={c}",
                  "MLP-Mixer MixerBlock token_mixing", src, "mixer",
                  [(b, t, c), (s, t), (s,)],
                  lambda x, w, bs: _gelu(np.einsum("st,btc->bsc", w, x.astype(f64))
                                         + bs[:, None]),
                  torch=lambda x, w, bs: F.gelu(torch.einsum("st,btc->bsc", w, x)
                                                + bs[:, None], approximate="tanh"),
                  torch_text="gelu(einsum)")


def lora(big):
    # huggingface peft tuners/lora/layer.py, Linear.forward:
    # base_layer(x) + lora_B(lora_A(x)) * scaling (rank 16, scaling 2)
    n, i, o, r = (512, 1024, 1024, 16) if big else (3, 5, 4, 1)
    src = ("def lora(float(N,I) X, float(O,I) W, float(R,I) A, float(O,R) Bm) -> (Y) {\n"
           "    T(n,r) +=! X(n,i) * A(r,i)\n    Y(n,o) +=! X(n,i) * W(o,i)\n"
           "    Y(n,o) += T(n,r) * Bm(o,r) * 2.0\n}")
    return model_case(f"LoRA linear {n}x{i}x{o} rank {r}", "PEFT LoRA Linear.forward", src,
                  "lora", [(n, i), (o, i), (r, i), (o, r)],
                  lambda x, w, a, b: x.astype(f64) @ w.T + (x.astype(f64) @ a.T) @ b.T * 2,
                  torch=lambda x, w, a, b: F.linear(x, w) + F.linear(F.linear(x, a), b) * 2,
                  torch_text="linear + 2*linear(linear)")


def bilinear(big):
    # torch.nn.Bilinear (as in e.g. the biaffine parser's scorer): x1^T W x2 + b
    n, i, j, o = (256, 64, 64, 64) if big else (3, 2, 4, 1)
    spec = "ni,oij,nj->no"
    src = ("def bil(float(N,I) X1, float(O,I,J) W, float(N,J) X2, float(O) Bs) -> (Y) {\n"
           "    Y(n,o) +=! X1(n,i) * W(o,i,j) * X2(n,j)\n    Y(n,o) = Y(n,o) + Bs(o)\n}")
    return model_case(f"bilinear {n}x{i}x{j}->{o}", "torch.nn.Bilinear", src, "bil",
                  [(n, i), (o, i, j), (n, j), (o,)],
                  lambda x1, w, x2, b: np.einsum(spec, x1.astype(f64), w, x2) + b,
                  torch=lambda x1, w, x2, b: F.bilinear(x1, x2, w, b), torch_text="bilinear")


def tt_layer(big):
    # Tensorizing Neural Networks (Novikov et al.; t3nsor TTMatrix @ x): a TT-matrix with
    # two cores applied to a batch, contracted core by core as the reference code does
    b, i, k, o, p, r = (256, 32, 32, 32, 32, 16) if big else (2, 3, 2, 3, 1, 2)
    src = ("def tt(float(B,I,K) X, float(I,O,R) G1, float(R,K,P) G2) -> (Y) {\n"
           "    T(b,k,o,r) +=! X(b,i,k) * G1(i,o,r)\n"
           "    Y(b,o,p) +=! T(b,k,o,r) * G2(r,k,p)\n}")
    spec = "bik,ior,rkp->bop"
    return model_case(f"TT layer B={b} {i}x{k}->{o}x{p} rank {r}", "TT-layer (t3nsor)", src,
                  "tt", [(b, i, k), (i, o, r), (r, k, p)], einsum_reference(spec), einsum=spec)


def mps_step(big):
    # quimb / TensorNetwork MPS expectation: the environment E(a, b) absorbs one site of
    # the ket A(a, s, c) and of the bra B(b, s, d)
    d, s = (256, 32) if big else (3, 2)
    src = ("def mps(float(D,D) E, float(D,S,D) A, float(D,S,D) Bk) -> (E2) {\n"
           "    T(b,s,c) +=! E(a,b) * A(a,s,c)\n    E2(c,d) +=! T(b,s,c) * Bk(b,s,d)\n}")
    spec = "ab,asc,bsd->cd"
    return model_case(f"MPS environment step chi={d} d={s}", "quimb MPS transfer step", src,
                  "mps", [(d, d), (d, s, d), (d, s, d)], einsum_reference(spec), einsum=spec)


def dlrm_interaction(big):
    # facebookresearch/dlrm dlrm_s_pytorch.py, interact_features ("dot"): bmm(T, T^T)
    b, f, d = (2048, 27, 64) if big else (2, 3, 1)
    spec = "bid,bjd->bij"
    return model_case(f"DLRM dot interaction B={b} F={f} D={d}",
                  "DLRM interact_features (dot)",
                  "def dlrm(float(B,F,D) T) -> (Z) {\n    Z(b,i,j) +=! T(b,i,d) * T(b,j,d)\n}",
                  "dlrm", [(b, f, d)],
                  lambda t: np.einsum(spec, t.astype(f64), t),
                  numpy=lambda t, out: np.matmul(t, t.transpose(0, 2, 1), out=out),
                  torch=lambda t: torch.bmm(t, t.transpose(1, 2)), torch_text="bmm")


def linear_attention_state(big):
    # idiap/fast-transformers attention/linear_attention.py:
    # KV = torch.einsum("nshd,nshm->nhmd", K, values)
    n, s, h, d = (4, 1024, 8, 64) if big else (1, 5, 2, 3)
    spec = "nshd,nshm->nhmd"
    return model_case(f"linear attention KV state N={n} S={s} H={h} D={d}",
                  "fast-transformers LinearAttention (KV)",
                  "def kv(float(N,S,H,D) K, float(N,S,H,M) V) -> (KV) {\n"
                  "    KV(n,h,m,d) +=! K(n,s,h,d) * V(n,s,h,m)\n}", "kv",
                  [(n, s, h, d), (n, s, h, d)], einsum_reference(spec), einsum=spec)


def position_ids(big):
    # transformers modeling_roberta.py, create_position_ids_from_input_ids:
    # cumsum(mask, dim=1) * mask (as floats here)
    b, n = (256, 512) if big else (2, 1)
    src = ("def pos(float(B,N) M) -> (P) {\n"
           "    C(b,i) +=! (j <= i) ? M(b,j) : 0 where b in 0:B, i in 0:N, j in 0:N\n"
           "    P(b,i) = C(b,i) * M(b,i)\n}")
    return model_case(f"position ids (cumsum*mask) {b}x{n}", "RoBERTa position ids", src, "pos",
                  [(b, n)], lambda m: np.cumsum(m.astype(f64), axis=1) * m,
                  torch=lambda m: torch.cumsum(m, dim=1) * m, torch_text="cumsum*mask")


def log_softmax(big):
    # GPT-2 language-model loss (transformers GPT2LMHeadModel via CrossEntropyLoss):
    # log_softmax over the vocabulary
    n, v = (64, 50257) if big else (3, 7)
    src = ("def logsm(float(N,V) X) -> (Y) {\n    M(n) max=! X(n,v)\n"
           "    S(n) +=! exp(X(n,v) - M(n))\n    Y(n,v) = X(n,v) - M(n) - log(S(n))\n}")

    def ref(x):
        x = x.astype(f64)
        m = x.max(axis=1, keepdims=True)
        return x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))
    return model_case(f"log-softmax {n}x{v}", "GPT-2 LM head loss (log_softmax)", src, "logsm",
                  [(n, v)], ref, torch=lambda x: F.log_softmax(x, dim=1),
                  torch_text="log_softmax")


LAYERS = (mixer_tokens, lora, bilinear, tt_layer, mps_step, dlrm_interaction,
          linear_attention_state, position_ids, log_softmax)
