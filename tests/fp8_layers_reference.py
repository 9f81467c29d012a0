#!/usr/bin/env python3
"""Writes tests/fp8_layers_reference.h: the FP8 Linear's and Conv2d's forward and both backward
products as Transformer Engine computes them, for tests/test_fp8_layers.c.

    /work/venv/bin/python tests/fp8_layers_reference.py > tests/fp8_layers_reference.h

Inputs (x, w, b, dy) come from a formula the C test repeats (value): ((h >> 20) - 2048) / 2048
* spread with h = (i + 7919 seed) * 2654435761 mod 2^32, exact in f32. Each tensor is cast as TE
casts (saturating): fp8((t * scale).clamp(-max, max)) with scale = max / amax (current scaling,
in f32) or 1 (delayed scaling's first step). The straight-through convention: dx, dw are the
products of the FP8 dy with the FP8 w and x, times the scale_inv values; db = sum dy.
Linear: the products by torch._scaled_mm (f32 out). Conv2d: the convolution and its two
gradients (torch.nn.grad) on the widened FP8 tensors in f64, times the scale_inv product.
Each product comes with its magnitude (the same product on |operands|, in f64), from which
the C test takes its f32 tolerance. Arrays are f32 bits."""
import struct

import torch

MAX = {"e4m3": 448.0, "e5m2": 57344.0}
FMT = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}

# name, kind, recipe, formats, shape (linear: rows, in, out; conv: n, c, h, w, c_out, k, pad),
# spreads of x, w, dy
CASES = [
    ("mlp_fc2_current_hybrid", "linear", "current", "hybrid", (16, 64, 10), (4.0, 0.125, 2.0 ** -6)),
    ("linear_delayed_e4m3_saturating", "linear", "delayed", "e4m3", (8, 32, 16), (512.0, 1.0, 1.0)),
    ("conv_current_hybrid", "conv", "current", "hybrid", (2, 3, 6, 6, 4, 3, 1), (2.0, 0.5, 2.0 ** -4)),
    ("conv_delayed_e4m3_saturating", "conv", "delayed", "e4m3", (2, 2, 5, 5, 3, 3, 0), (600.0, 1.0, 0.25)),
]


def value(shape, seed, spread):
    n = 1
    for d in shape:
        n *= d
    i = torch.arange(n, dtype=torch.int64)
    h = ((i + 7919 * seed) * 2654435761) & 0xFFFFFFFF
    return (((h >> 20) - 2048).to(torch.float32) / 2048 * spread).view(shape)


def cast(t, recipe, fmt):
    fmax = torch.tensor(MAX[fmt], dtype=torch.float32)
    scale = fmax / t.abs().max() if recipe == "current" else torch.tensor(1.0)
    xs = t.float() * scale
    saturated = int((xs.abs() > fmax).sum())
    return xs.clamp(-MAX[fmt], MAX[fmt]).to(FMT[fmt]), scale, saturated


def bits(t):
    return t.float().contiguous().view(torch.int32).flatten().tolist()


def emit(name, field, t, out):
    b = bits(t)
    out.append("static const uint32_t na_ref_%s_%s[%d] = {%s};" %
               (name, field, len(b), ",".join("0x%08xu" % (v & 0xFFFFFFFF) for v in b)))


def main():
    out = ["/* tests/fp8_layers_reference.h: made by tests/fp8_layers_reference.py with PyTorch "
           "%s; do not edit. */\n#include <stdint.h>\n" % torch.__version__]
    rows = []
    for ci, (name, kind, recipe, formats, shape, spread) in enumerate(CASES):
        gfmt = "e5m2" if formats == "hybrid" else "e4m3"
        if kind == "linear":
            m, k, n = shape
            xs, ws, ys = (m, k), (n, k), (m, n)
        else:
            bn, c, h, w_, co, ks, pad = shape
            xs, ws = (bn, c, h, w_), (co, c, ks, ks)
            oh, ow = h + 2 * pad - ks + 1, w_ + 2 * pad - ks + 1
            ys = (bn, co, oh, ow)
        x = value(xs, 4 * ci, spread[0])
        w = value(ws, 4 * ci + 1, spread[1])
        b = value((ws[0],), 4 * ci + 2, 1.0)
        dy = value(ys, 4 * ci + 3, spread[2])
        qx, sx, satx = cast(x, recipe, "e4m3")
        qw, sw, satw = cast(w, recipe, "e4m3")
        qg, sg, satg = cast(dy, recipe, gfmt)
        ix, iw, ig = (torch.tensor(1.0) / s for s in (sx, sw, sg))
        if kind == "linear":
            y = torch._scaled_mm(qx, qw.t(), scale_a=ix, scale_b=iw, bias=b,
                                 out_dtype=torch.float32)
            dx = torch._scaled_mm(qg, qw.t().contiguous().t(), scale_a=ig, scale_b=iw,
                                  out_dtype=torch.float32)
            dw = torch._scaled_mm(qg.t().contiguous(), qx.t().contiguous().t(), scale_a=ig,
                                  scale_b=ix, out_dtype=torch.float32)
            fx, fw, fg = (q.double() for q in (qx, qw, qg))
            my = fx.abs() @ fw.abs().t() * float(ix) * float(iw)
            mdx = fg.abs() @ fw.abs() * float(ig) * float(iw)
            mdw = fg.abs().t() @ fx.abs() * float(ig) * float(ix)
            db = dy.double().sum(0)
            mdb = dy.double().abs().sum(0)
        else:
            conv = torch.nn.functional.conv2d
            gin, gwt = torch.nn.grad.conv2d_input, torch.nn.grad.conv2d_weight
            fx, fw, fg = (q.double() for q in (qx, qw, qg))
            a_y, a_x, a_w = (float(ix) * float(iw), float(ig) * float(iw), float(ig) * float(ix))
            y = conv(fx, fw, padding=pad) * a_y + b.double().view(1, -1, 1, 1)
            my = conv(fx.abs(), fw.abs(), padding=pad) * a_y + b.double().abs().view(1, -1, 1, 1)
            dx = gin(xs, fw, fg, padding=pad) * a_x
            mdx = gin(xs, fw.abs(), fg.abs(), padding=pad) * a_x
            dw = gwt(fx, ws, fg, padding=pad) * a_w
            mdw = gwt(fx.abs(), ws, fg.abs(), padding=pad) * a_w
            db = dy.double().sum((0, 2, 3))
            mdb = dy.double().abs().sum((0, 2, 3))
        for field, t in (("y", y), ("my", my), ("dx", dx), ("mdx", mdx), ("dw", dw),
                         ("mdw", mdw), ("db", db), ("mdb", mdb)):
            emit(name, field, t, out)
        dims = list(shape) + [0] * (7 - len(shape))
        rows.append('  {"%s", %d, %d, %d, {%s}, {%.9g, %.9g, %.9g}, %d, %d, %d, %d,\n'
                    '   na_ref_%s_y, na_ref_%s_my, na_ref_%s_dx, na_ref_%s_mdx, na_ref_%s_dw, '
                    'na_ref_%s_mdw, na_ref_%s_db, na_ref_%s_mdb},' %
                    ((name, kind == "conv", recipe == "current", formats == "e4m3",
                      ", ".join(str(d) for d in dims), spread[0], spread[1], spread[2], ci,
                      satx, satw, satg) + (name,) * 8))
    out.append("static const struct {\n  const char *name;\n  int conv, current, e4m3;\n"
               "  int shape[7];\n  double spread[3];\n  int case_index, sat_x, sat_w, sat_g;\n"
               "  const uint32_t *y, *my, *dx, *mdx, *dw, *mdw, *db, *mdb;\n"
               "} na_ref_layer_cases[] = {")
    out.extend(rows)
    out.append("};")
    print("\n".join(out))


if __name__ == "__main__":
    main()
