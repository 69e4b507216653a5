"""Operators taken from public model code for the generality benchmark, each written in
tclang for this benchmark (none comes from benchmarks/kernels.py). The comment above each
names the model and the layer it comes from; `big` gives sizes of a few to tens of ms in
NumPy, else small odd extents (the smoke test's, size 1 included).
"""

from __future__ import annotations

import numpy as np

from benchmarks.generality_cases import einsum_reference, model_case
from benchmarks.generality_windows import F, torch

f64 = np.float64


def _gelu(y):
    return 0.5 * y * (1 + np.tanh(0.7978845608 * (y + 0.044715 * y ** 3)))


GELU = "0.5 * {y} * (1 + tanh(0.7978845608 * ({y} + 0.044715 * {y} * {y} * {y})))"


def _softmax(s, axis=-1):
    e = np.exp(s - s.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def causal_attention(big):
    # nanoGPT model.py, CausalSelfAttention.forward (the masked_fill/softmax/@v branch)
    b, h, t, d = (1, 4, 256, 64) if big else (1, 2, 7, 3)
    sc = 1 / d ** 0.5
    src = ("def attn(float(B,H,T,D) Q, float(B,H,T,D) K, float(B,H,T,D) V) -> (O) {\n"
           "    S(b,h,i,j) +=! Q(b,h,i,d) * K(b,h,j,d)\n"
           f"    Z(b,h,i,j) = (j <= i) ? S(b,h,i,j) * {sc!r} : -1e30\n"
           "        where b in 0:B, h in 0:H, i in 0:T, j in 0:T\n"
           "    M(b,h,i) max=! Z(b,h,i,j)\n    E(b,h,i,j) = exp(Z(b,h,i,j) - M(b,h,i))\n"
           "    L(b,h,i) +=! E(b,h,i,j)\n    O(b,h,i,e) +=! E(b,h,i,j) * V(b,h,j,e) / L(b,h,i)\n}")

    def ref(q, k, v):
        s = np.where(np.tri(t, dtype=bool), q.astype(f64) @ k.swapaxes(2, 3) * sc, -np.inf)
        return _softmax(s) @ v
    return model_case(f"causal attention B={b} H={h} T={t} D={d}",
                  "nanoGPT CausalSelfAttention", src, "attn", [(b, h, t, d)] * 3, ref,
                  torch=lambda q, k, v: F.scaled_dot_product_attention(q, k, v,
                                                                       is_causal=True),
                  torch_text="scaled_dot_product_attention(is_causal)")


def alibi_scores(big):
    # BLOOM modeling_bloom.py, BloomAttention: alibi (slope(h) * key position) added to
    # the scaled scores, causal mask, softmax
    b, h, t, d = (1, 4, 256, 64) if big else (1, 3, 5, 2)
    sc = 1 / d ** 0.5
    src = ("def alibi(float(B,H,T,D) Q, float(B,H,T,D) K, float(H) Sl) -> (P) {\n"
           "    S(b,h,i,j) +=! Q(b,h,i,d) * K(b,h,j,d)\n"
           f"    Z(b,h,i,j) = (j <= i) ? S(b,h,i,j) * {sc!r} + Sl(h) * float(j) : -1e30\n"
           "        where b in 0:B, h in 0:H, i in 0:T, j in 0:T\n"
           "    M(b,h,i) max=! Z(b,h,i,j)\n    E(b,h,i,j) = exp(Z(b,h,i,j) - M(b,h,i))\n"
           "    L(b,h,i) +=! E(b,h,i,j)\n    P(b,h,i,j) = E(b,h,i,j) / L(b,h,i)\n}")

    def ref(q, k, sl):
        s = q.astype(f64) @ k.swapaxes(2, 3) * sc + sl[:, None, None] * np.arange(t)
        return _softmax(np.where(np.tri(t, dtype=bool), s, -np.inf))

    def peer(q, k, sl):
        s = (q @ k.transpose(2, 3)) * sc + sl[:, None, None] * torch.arange(t)
        return torch.softmax(s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1),
                                           float("-inf")), dim=-1)
    return model_case(f"ALiBi causal scores B={b} H={h} T={t}", "BLOOM BloomAttention (alibi)",
                  src, "alibi", [(b, h, t, d), (b, h, t, d), (h,)], ref, torch=peer,
                  torch_text="masked_fill+softmax")


def gqa_scores(big):
    # transformers modeling_llama.py, LlamaAttention with num_key_value_groups > 1:
    # repeat_kv(key) then query @ key^T (here without the copy: heads g*R+r share K(g))
    b, g, r, t, d = (1, 2, 4, 256, 64) if big else (1, 2, 3, 5, 3)
    spec = "bgrid,bgjd->bgrij"
    src = ("def gqa(float(B,G,R,T,D) Q, float(B,G,T,D) K) -> (S) {\n"
           "    S(b,g,r,i,j) +=! Q(b,g,r,i,d) * K(b,g,j,d)\n}")
    return model_case(f"GQA scores B={b} G={g} R={r} T={t} D={d}", "LLaMA LlamaAttention (GQA)",
                  src, "gqa", [(b, g, r, t, d), (b, g, t, d)], einsum_reference(spec),
                  einsum=spec)


def rmsnorm(big):
    # transformers modeling_llama.py, LlamaRMSNorm.forward
    n, d = (4096, 1024) if big else (5, 7)
    src = ("def rmsnorm(float(N,D) X, float(D) G) -> (Y) {\n"
           "    V(n) +=! X(n,d) * X(n,d)\n"
           "    Y(n,d) = X(n,d) * rsqrt(V(n) / float(D) + 1e-6) * G(d)\n}")

    def ref(x, g):
        x = x.astype(f64)
        return x / np.sqrt((x * x).mean(axis=1, keepdims=True) + 1e-6) * g
    return model_case(f"RMSNorm {n}x{d}", "LLaMA LlamaRMSNorm", src, "rmsnorm", [(n, d), (d,)],
                  ref, torch=lambda x, g: F.rms_norm(x, (d,), g, 1e-6), torch_text="rms_norm")


def layernorm(big):
    # timm vision_transformer.py, Block.norm1 (nn.LayerNorm(768, eps=1e-6))
    n, d = (3152, 768) if big else (3, 1)
    src = ("def layernorm(float(N,D) X, float(D) G, float(D) Bt) -> (Y) {\n"
           "    Mu(n) +=! X(n,d) / float(D)\n"
           "    V(n) +=! (X(n,d) - Mu(n)) * (X(n,d) - Mu(n)) / float(D)\n"
           "    Y(n,d) = (X(n,d) - Mu(n)) * rsqrt(V(n) + 1e-6) * G(d) + Bt(d)\n}")

    def ref(x, g, b):
        x = x.astype(f64)
        c = x - x.mean(axis=1, keepdims=True)
        return c / np.sqrt((c * c).mean(axis=1, keepdims=True) + 1e-6) * g + b
    return model_case(f"LayerNorm {n}x{d}", "ViT (timm) Block.norm1", src, "layernorm",
                  [(n, d), (d,), (d,)], ref,
                  torch=lambda x, g, b: F.layer_norm(x, (d,), g, b, 1e-6),
                  torch_text="layer_norm")


def gpt2_mlp(big):
    # transformers modeling_gpt2.py, GPT2MLP: c_fc (Conv1D: x @ W + b) then gelu_new
    n, i, o = (512, 768, 1024) if big else (3, 5, 4)
    src = ("def mlp(float(N,I) X, float(I,O) W, float(O) Bs) -> (Y) {\n"
           "    A(n,o) +=! X(n,i) * W(i,o)\n"
           f"    Y(n,o) = {GELU.format(y='(A(n,o) + Bs(o))')}\n}}")
    return model_case(f"GPT-2 c_fc+GELU {n}x{i}x{o}", "GPT-2 GPT2MLP (c_fc, gelu_new)", src,
                  "mlp", [(n, i), (i, o), (o,)], lambda x, w, b: _gelu(x.astype(f64) @ w + b),
                  torch=lambda x, w, b: F.gelu(torch.addmm(b, x, w), approximate="tanh"),
                  torch_text="gelu(addmm)")


def swiglu(big):
    # transformers modeling_llama.py, LlamaMLP: act_fn(gate_proj(x)) * up_proj(x)
    n, i, o = (256, 512, 1024) if big else (2, 3, 5)
    src = ("def swiglu(float(N,I) X, float(O,I) Wg, float(O,I) Wu) -> (Y) {\n"
           "    Gt(n,o) +=! X(n,i) * Wg(o,i)\n    Up(n,o) +=! X(n,i) * Wu(o,i)\n"
           "    Y(n,o) = Gt(n,o) / (1 + exp(-Gt(n,o))) * Up(n,o)\n}")

    def ref(x, wg, wu):
        g = x.astype(f64) @ wg.T
        return g / (1 + np.exp(-g)) * (x.astype(f64) @ wu.T)
    return model_case(f"SwiGLU gate*up {n}x{i}x{o}", "LLaMA LlamaMLP (gate_proj, up_proj)", src,
                  "swiglu", [(n, i), (o, i), (o, i)], ref,
                  torch=lambda x, wg, wu: F.silu(F.linear(x, wg)) * F.linear(x, wu),
                  torch_text="silu(linear)*linear")


def rotary(big):
    # transformers modeling_llama.py, apply_rotary_pos_emb: q * cos + rotate_half(q) * sin
    b, h, t, d = (4, 16, 512, 64) if big else (1, 3, 5, 2)
    src = ("def rope(float(B,H,T,D) Q, float(T,D) Cs, float(T,D) Sn) -> (O) {\n"
           "    O(b,h,t,d) = Q(b,h,t,d) * Cs(t,d)\n"
           "        + ((d < D / 2) ? -Q(b,h,t,d + D / 2) : Q(b,h,t,d - D / 2)) * Sn(t,d)\n}")

    def ref(q, c, s):
        half = np.concatenate([-q[..., d // 2:], q[..., :d // 2]], axis=-1)
        return q.astype(f64) * c + half * s

    def peer(q, c, s):
        return q * c + torch.cat([-q[..., d // 2:], q[..., :d // 2]], dim=-1) * s
    return model_case(f"rotary embedding B={b} H={h} T={t} D={d}",
                  "LLaMA apply_rotary_pos_emb", src, "rope", [(b, h, t, d), (t, d), (t, d)],
                  ref, torch=peer, torch_text="q*cos+cat(-q2,q1)*sin")


TRANSFORMERS = (causal_attention, alibi_scores, gqa_scores, rmsnorm, layernorm, gpt2_mlp,
                swiglu, rotary)
