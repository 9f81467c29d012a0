#!/usr/bin/env python3
"""Writes tests/fp8_scaled_mm_reference.h: torch._scaled_mm outputs for tests/test_fp8.c.

    /work/venv/bin/python tests/fp8_scaled_mm_reference.py > tests/fp8_scaled_mm_reference.h

The operands are FP8 bytes from a formula the C test repeats (fp8_operand_byte): byte(i, seed)
= ((i + 7919 seed) * 2654435761 mod 2^32) >> 24, with the NaN codes moved to finite ones; b is
made as [N, K] and passed transposed (the column-major b of _scaled_mm, a Linear weight).
Scales are f32 scalars; bias is (h % 201 - 100) / 8 (exact in bf16), in the output's dtype
(bias 1) or in f32 (bias 2). Outputs are stored as f32
bits (bf16 outputs widened)."""
import struct

import torch

CASES = [  # name, a format, b format, M, K, N, scale_a, scale_b, bias, out
    ("mnist_fc1", "e4m3", "e4m3", 16, 784, 256, 0.5, 0.25, True, "f32"),
    ("mnist_fc2", "e4m3", "e4m3", 16, 256, 10, 0.3, 1.7, True, "f32"),
    ("mnist_fc1_bf16", "e4m3", "e5m2", 8, 784, 256, 1.0 / 448.0, 3.0, True, "bf16"),
    ("small_e5m2_e4m3", "e5m2", "e4m3", 5, 7, 3, 1.0, 1.0, False, "f32"),
    ("e5m2_e5m2_bf16", "e5m2", "e5m2", 4, 32, 16, 2.0 ** -10, 0.75, False, "bf16"),
    ("mnist_fc2_bf16_f32_bias", "e4m3", "e4m3", 16, 256, 10, 0.3, 1.7, "f32", "bf16"),
]
FMT = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
OUT = {"f32": torch.float32, "bf16": torch.bfloat16}


def operand(fmt, n, seed):
    i = torch.arange(n, dtype=torch.int64)
    b = (((i + 7919 * seed) * 2654435761) & 0xFFFFFFFF) >> 24
    if fmt == "e4m3":
        b = torch.where((b & 0x7F) == 0x7F, b ^ 0x08, b)
    else:
        b = torch.where((b & 0x7C) == 0x7C, b ^ 0x40, b)
    return b.to(torch.uint8).view(FMT[fmt])


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def main():
    print("/* tests/fp8_scaled_mm_reference.h: made by tests/fp8_scaled_mm_reference.py with "
          "PyTorch %s; do not edit. */\n#include <stdint.h>\n" % torch.__version__)
    rows = []
    for ci, (name, fa, fb, m, k, n, sa, sb, has_bias, out) in enumerate(CASES):
        a = operand(fa, m * k, 2 * ci).view(m, k)
        b = operand(fb, n * k, 2 * ci + 1).view(n, k).t()
        bias = None
        if has_bias:
            h = ((torch.arange(n, dtype=torch.int64) * 2654435761 + ci) & 0xFFFFFFFF) >> 8
            bias = ((h % 201 - 100).to(torch.float32) / 8).to(OUT[out] if has_bias is True else
                                                               OUT[has_bias])
        y = torch._scaled_mm(a, b, scale_a=torch.tensor(f32(sa)), scale_b=torch.tensor(f32(sb)),
                             bias=bias, out_dtype=OUT[out])
        bits = y.float().view(torch.int32).flatten().tolist()
        print("static const uint32_t na_ref_mm_%s[%d] = {" % (name, m * n))
        print(",".join("0x%08xu" % (v & 0xFFFFFFFF) for v in bits))
        print("};")
        rows.append('  {"%s", %d, %d, %d, %d, %d, %d, %.9ef, %.9ef, %d, %d, na_ref_mm_%s},' %
                    (name, fa == "e5m2", fb == "e5m2", m, k, n, ci, f32(sa), f32(sb),
                     0 if not has_bias else 1 if has_bias is True else 2, out == "bf16", name))
    print("static const struct {\n  const char *name;\n  int a_e5m2, b_e5m2, m, k, n, case_index;"
          "\n  float scale_a, scale_b;\n  int bias, bf16_out;\n  const uint32_t *out;\n"
          "} na_ref_mm_cases[] = {")
    print("\n".join(rows))
    print("};")


if __name__ == "__main__":
    main()
