"""Operators of convolutional networks for the generality benchmark, taken from public
model code (the comment above each names the model and layer) and written in tclang for
this benchmark. `big`: sizes of a few to tens of ms in NumPy; else small odd extents.
"""

from __future__ import annotations

import numpy as np

from benchmarks.generality_cases import model_case
from benchmarks.generality_windows import F, _windows

f64 = np.float64


def _padded_conv(pad: int) -> str:
    return (f"(h + kh >= {pad} && h + kh < H + {pad} && w + kw >= {pad} && "
            f"w + kw < W + {pad})")


def grouped_conv(big):
    # torchvision resnet.py, resnext50_32x4d Bottleneck.conv2 (3x3, groups=32, padding 1);
    # the input's channels as (group, channel in group): a view of the NCHW tensor
    n, g, c, h = (2, 32, 4, 28) if big else (1, 2, 3, 5)
    src = ("def gconv(float(N,G,C,H,W) I, float(G,M,C,3,3) Wt) -> (O) {\n"
           f"    O(n,g,m,h,w) +=! {_padded_conv(1)}\n"
           "        ? I(n,g,c,h + kh - 1,w + kw - 1) * Wt(g,m,c,kh,kw) : 0\n"
           "        where n in 0:N, g in 0:G, m in 0:M, c in 0:C, h in 0:H, w in 0:W,"
           " kh in 0:3, kw in 0:3\n}")

    def ref(x, w):
        win = _windows(x.reshape(n, g * c, h, h), 3, 1, 1, 0).reshape(n, g, c, h, h, 3, 3)
        return np.einsum("ngchwij,gmcij->ngmhw", win, w)
    return model_case(f"grouped conv 3x3 N={n} G={g} C=M={c} {h}x{h}",
                  "ResNeXt-50 32x4d Bottleneck.conv2", src, "gconv",
                  [(n, g, c, h, h), (g, c, c, 3, 3)], ref,
                  torch=lambda x, w: F.conv2d(x.reshape(n, g * c, h, h),
                                              w.reshape(g * c, c, 3, 3), padding=1,
                                              groups=g).reshape(n, g, c, h, h),
                  torch_text="conv2d(groups=32)")


def depthwise7(big):
    # ConvNeXt convnext.py, Block.dwconv (7x7 depthwise, padding 3)
    n, c, h = (2, 96, 56) if big else (1, 3, 4)
    src = ("def dw7(float(N,C,H,W) I, float(C,7,7) Wt) -> (O) {\n"
           f"    O(n,c,h,w) +=! {_padded_conv(3)} ? I(n,c,h + kh - 3,w + kw - 3) * Wt(c,kh,kw)"
           " : 0\n        where n in 0:N, c in 0:C, h in 0:H, w in 0:W, kh in 0:7, kw in 0:7\n}")
    return model_case(f"depthwise conv 7x7 N={n} C={c} {h}x{h}", "ConvNeXt Block.dwconv", src,
                  "dw7", [(n, c, h, h), (c, 7, 7)],
                  lambda x, w: np.einsum("nchwij,cij->nchw", _windows(x, 7, 1, 3, 0), w),
                  torch=lambda x, w: F.conv2d(x, w[:, None], padding=3, groups=c),
                  torch_text="conv2d(groups=C)")


def depthwise_stride2(big):
    # torchvision mobilenetv2.py, InvertedResidual depthwise conv (3x3, stride 2, padding 1)
    n, c, h = (4, 144, 56) if big else (1, 2, 5)
    src = ("def dws2(float(N,C,H,W) I, float(C,3,3) Wt) -> (O) {\n"
           "    O(n,c,h,w) +=! (2*h + kh >= 1 && 2*h + kh < H + 1 && 2*w + kw >= 1 && "
           "2*w + kw < W + 1)\n        ? I(n,c,2*h + kh - 1,2*w + kw - 1) * Wt(c,kh,kw) : 0\n"
           "        where n in 0:N, c in 0:C, h in 0:(H - 1) / 2 + 1, w in 0:(W - 1) / 2 + 1,"
           " kh in 0:3, kw in 0:3\n}")
    return model_case(f"depthwise conv 3x3/2 N={n} C={c} {h}x{h}",
                  "MobileNetV2 InvertedResidual (stride 2)", src, "dws2",
                  [(n, c, h, h), (c, 3, 3)],
                  lambda x, w: np.einsum("nchwij,cij->nchw", _windows(x, 3, 2, 1, 0), w),
                  torch=lambda x, w: F.conv2d(x, w[:, None], stride=2, padding=1, groups=c),
                  torch_text="conv2d(groups=C)")


def pointwise(big):
    # torchvision mobilenetv2.py, InvertedResidual projection (1x1 conv, 96 -> 24 at 56x56)
    n, c, m, h = (4, 96, 24, 56) if big else (1, 3, 2, 5)
    spec = "nchw,mc->nmhw"
    return model_case(f"pointwise conv 1x1 N={n} C={c} M={m} {h}x{h}",
                  "MobileNetV2 InvertedResidual (project)",
                  "def pw(float(N,C,H,W) I, float(M,C) Wt) -> (O) {\n"
                  "    O(n,m,h,w) +=! I(n,c,h,w) * Wt(m,c)\n}", "pw",
                  [(n, c, h, h), (m, c)],
                  lambda x, w: np.einsum(spec, x.astype(f64), w), einsum=spec,
                  torch=lambda x, w: F.conv2d(x, w[:, :, None, None]), torch_text="conv2d 1x1")


def stem_maxpool(big):
    # torchvision resnet.py, ResNet.maxpool (3x3, stride 2, padding 1) after the stem
    n, c, h = (4, 64, 112) if big else (1, 2, 5)
    src = ("def maxpool(float(N,C,H,W) I) -> (O) {\n"
           "    O(n,c,h,w) max=! (2*h + kh >= 1 && 2*h + kh < H + 1 && 2*w + kw >= 1 && "
           "2*w + kw < W + 1)\n        ? I(n,c,2*h + kh - 1,2*w + kw - 1) : -1e30\n"
           "        where n in 0:N, c in 0:C, h in 0:(H - 1) / 2 + 1, w in 0:(W - 1) / 2 + 1,"
           " kh in 0:3, kw in 0:3\n}")
    return model_case(f"max pool 3x3/2 N={n} C={c} {h}x{h}", "ResNet-50 stem maxpool", src,
                  "maxpool", [(n, c, h, h)],
                  lambda x: _windows(x, 3, 2, 1, -np.inf).max(axis=(4, 5)),
                  torch=lambda x: F.max_pool2d(x, 3, 2, 1), torch_text="max_pool2d")


def global_avgpool(big):
    # torchvision resnet.py, ResNet.avgpool (AdaptiveAvgPool2d((1, 1))) then flatten
    n, c, h = (32, 2048, 7) if big else (2, 3, 1)
    return model_case(f"global avg pool N={n} C={c} {h}x{h}", "ResNet-50 avgpool + flatten",
                  "def gap(float(N,C,H,W) I) -> (O) {\n"
                  "    O(n,c) +=! I(n,c,h,w) / float(H * W)\n}", "gap", [(n, c, h, h)],
                  lambda x: x.astype(f64).mean(axis=(2, 3)),
                  numpy=lambda x, out: np.mean(x, axis=(2, 3), out=out),
                  torch=lambda x: F.adaptive_avg_pool2d(x, 1).flatten(1),
                  torch_text="adaptive_avg_pool2d")


def patch_embed(big):
    # timm / Swin patch_embed.py, PatchEmbed.proj (Conv2d, kernel = stride = 4)
    n, c, m, h = (4, 3, 96, 224) if big else (1, 3, 2, 8)
    src = ("def patch(float(N,C,H,W) I, float(M,C,4,4) Wt) -> (O) {\n"
           "    O(n,m,h,w) +=! I(n,c,4*h + kh,4*w + kw) * Wt(m,c,kh,kw)"
           " where kh in 0:4, kw in 0:4\n}")
    return model_case(f"patch embedding 4x4/4 N={n} C={c} M={m} {h}x{h}",
                  "Swin Transformer PatchEmbed.proj", src, "patch", [(n, c, h, h), (m, c, 4, 4)],
                  lambda x, w: np.einsum("nchwij,mcij->nmhw", _windows(x, 4, 4, 0, 0), w),
                  torch=lambda x, w: F.conv2d(x, w, stride=4), torch_text="conv2d stride 4")


def upconv(big):
    # U-Net (milesial/Pytorch-UNet unet_parts.py), Up.up: ConvTranspose2d(kernel 2, stride 2)
    n, c, m, h = (2, 128, 64, 32) if big else (1, 3, 2, 3)
    src = ("def up(float(N,C,H,W) I, float(C,M,2,2) Wt) -> (O) {\n"
           "    O(n,m,y,x) +=! I(n,c,y / 2,x / 2) * Wt(c,m,y % 2,x % 2)"
           " where y in 0:2*H, x in 0:2*W\n}")
    return model_case(f"U-Net up-conv 2x2/2 N={n} C={c} M={m} {h}x{h}", "U-Net Up.up", src, "up",
                  [(n, c, h, h), (c, m, 2, 2)],
                  lambda x, w: np.einsum("nchw,cmab->nmhawb", x.astype(f64), w)
                  .reshape(n, m, 2 * h, 2 * h),
                  torch=lambda x, w: F.conv_transpose2d(x, w, stride=2),
                  torch_text="conv_transpose2d")


def wavenet_conv(big):
    # WaveNet (r9y9/wavenet_vocoder conv.py), dilated causal Conv1d: kernel 2, dilation 4,
    # padded on the left only
    n, c, m, t = (4, 64, 128, 4000) if big else (1, 2, 3, 7)
    src = ("def wavenet(float(N,C,T) I, float(M,C,2) Wt) -> (O) {\n"
           "    O(n,m,t) +=! (t + 4*k >= 4) ? I(n,c,t + 4*k - 4) * Wt(m,c,k) : 0\n"
           "        where n in 0:N, m in 0:M, c in 0:C, t in 0:T, k in 0:2\n}")

    def ref(x, w):
        xp = np.pad(x.astype(f64), ((0, 0), (0, 0), (4, 0)))
        return sum(np.einsum("nct,mc->nmt", xp[:, :, 4 * k:4 * k + t], w[:, :, k])
                   for k in range(2))
    return model_case(f"dilated causal conv1d N={n} C={c} M={m} T={t}",
                  "WaveNet dilated causal conv", src, "wavenet", [(n, c, t), (m, c, 2)], ref,
                  torch=lambda x, w: F.conv1d(F.pad(x, (4, 0)), w, dilation=4),
                  torch_text="conv1d(pad, dilation)")


CONVNETS = (grouped_conv, depthwise7, depthwise_stride2, pointwise, stem_maxpool,
            global_avgpool, patch_embed, upconv, wavenet_conv)
