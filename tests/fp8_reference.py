#!/usr/bin/env python3
"""Writes tests/fp8_reference.h: PyTorch's FP8 casts, compact, for tests/test_fp8.c.

Run with a PyTorch that has float8 (made with 2.15 on the CPU):
    /work/venv/bin/python tests/fp8_reference.py > tests/fp8_reference.h
CI has no torch: the test reads only the header. What it holds:
  - bulk hashes: the test set of 2^24 f32 patterns bits(i) = i << 8 | mix(i) >> 24 (every sign,
    exponent and top-15-mantissa-bit prefix, a pseudo-random low byte), cast to each format;
    one hash per block of 2^16 outputs: sum of (byte + 1) * weight(i), weight(i) =
    (i * 2246822519 mod 2^32) | 1 (no overflow in 64 bits, any single wrong byte shows);
  - the same hash over all 65536 f16 and all 65536 bf16 patterns, cast to each format;
  - every FP8 byte decoded to f32, f16 and bf16 bits;
  - explicit edge cases with their bytes: every FP8 value's f32 neighbours, every rounding
    midpoint and its neighbours, the overflow and underflow thresholds, specials; and f64
    values next to the midpoints (PyTorch goes f64 -> f32 -> FP8: double rounding).
"""
import struct
import sys

import torch

FMTS = (torch.float8_e4m3fn, torch.float8_e5m2)
BLOCK = 1 << 16


def bulk_bits():
    i = torch.arange(1 << 24, dtype=torch.int64)
    low = ((i * 2654435761) & 0xFFFFFFFF) >> 24
    return ((i << 8) | low).to(torch.int32).view(torch.float32)  # wraps to the top-bit patterns


def weights(n):
    i = torch.arange(n, dtype=torch.int64)
    return ((i * 2246822519) & 0xFFFFFFFF) | 1


def block_hashes(codes):
    b = codes.view(torch.uint8).to(torch.int64) + 1
    w = weights(b.numel())
    return (b * w).view(-1, BLOCK).sum(dim=1).tolist()


def f32(bits):
    return struct.unpack("<f", struct.pack("<I", bits & 0xFFFFFFFF))[0]


def bits32(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def decode(fmt):
    return torch.arange(256, dtype=torch.int32).to(torch.uint8).view(fmt)


def edge_f32():
    s = set()
    for fmt in FMTS:
        vals = decode(fmt).float().tolist()
        for byte in range(128):
            v = vals[byte]
            if v != v or v in (float("inf"),):
                continue
            u = bits32(v)
            s.update((u - 1, u, u + 1))
            nxt = vals[byte + 1] if byte < 127 else float("nan")
            if nxt != nxt or nxt == float("inf"):  # above the largest: the virtual next code
                nxt = v + (v - vals[byte - 1])
            m = bits32((v + nxt) / 2)
            s.update((m - 1, m, m + 1))
    for x in (0.0, 2.0 ** -10, 2.0 ** -17, 448.0, 449.0, 464.0, 480.0, 57344.0, 61439.0,
              61440.0, 65504.0, 65536.0, 1e30, 3.4028234663852886e38, 2.0 ** -126, 2.0 ** -149):
        u = bits32(x)
        s.update((u - 1, u, u + 1))
    s.update((0x7F800000, 0x7F800001, 0x7FC00000, 0x7FFFFFFF, 0x7FA00000, 0x00000001))
    s = {u & 0x7FFFFFFF for u in s if 0 <= u <= 0xFFFFFFFF}
    return sorted(s | {u | 0x80000000 for u in s})


def edge_f64():
    s = set()
    for fmt in FMTS:
        vals = [v for v in decode(fmt).double().tolist()[:128] if v == v and v != float("inf")]
        for a, b in zip(vals, vals[1:]):
            m = (a + b) / 2
            s.update((m, m * (1 + 2.0 ** -40), m * (1 - 2.0 ** -40), m * (1 + 2.0 ** -20)))
    s.update((464.0000001, 61439.99999, 61440.0000001, 1e300, 1e-300, float("inf")))
    s = sorted(s)
    return s + [-x for x in s] + [float("nan")]


def main():
    out = sys.stdout
    out.write("/* tests/fp8_reference.h: made by tests/fp8_reference.py with PyTorch %s; do not "
              "edit. */\n#include <stdint.h>\n\n" % torch.__version__)
    x = bulk_bits()
    out.write("#define NA_REF_BLOCK %d\n" % BLOCK)
    out.write("static const uint64_t na_ref_bulk_hash[2][%d] = {\n" % ((1 << 24) // BLOCK))
    for fmt in FMTS:
        h = block_hashes(x.to(fmt))
        out.write("  {" + ",".join("%dull" % v for v in h) + "},\n")
    out.write("};\n")
    for name, dt in (("f16", torch.float16), ("bf16", torch.bfloat16)):
        src = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(dt)
        hs = [block_hashes(src.to(fmt))[0] for fmt in FMTS]
        out.write("static const uint64_t na_ref_%s_hash[2] = {%dull, %dull};\n" % (name, *hs))
    for name, dt, ty, mask in (("f32", torch.float32, "uint32_t", 0xFFFFFFFF),
                               ("f16", torch.float16, "uint16_t", 0xFFFF),
                               ("bf16", torch.bfloat16, "uint16_t", 0xFFFF)):
        it = torch.int32 if dt == torch.float32 else torch.int16
        out.write("static const %s na_ref_decode_%s[2][256] = {\n" % (ty, name))
        for fmt in FMTS:
            t = decode(fmt).to(dt).view(it).tolist()
            out.write("  {" + ",".join("0x%xu" % (v & mask) for v in t) + "},\n")
        out.write("};\n")
    e = edge_f32()
    codes = [torch.tensor(e, dtype=torch.int64).to(torch.int32).view(torch.float32).to(f)
             .view(torch.uint8).tolist() for f in FMTS]
    out.write("static const struct { uint32_t bits; uint8_t e4m3, e5m2; } na_ref_f32_edges[] = {\n")
    for u, c4, c5 in zip(e, *codes):
        out.write("  {0x%08xu, 0x%02x, 0x%02x},\n" % (u, c4, c5))
    out.write("};\n")
    d = edge_f64()
    t = torch.tensor(d, dtype=torch.float64)
    codes = [t.to(f).view(torch.uint8).tolist() for f in FMTS]
    out.write("static const struct { uint64_t bits; uint8_t e4m3, e5m2; } na_ref_f64_edges[] = {\n")
    for v, c4, c5 in zip(t.view(torch.int64).tolist(), *codes):
        out.write("  {0x%016xull, 0x%02x, 0x%02x},\n" % (v & 0xFFFFFFFFFFFFFFFF, c4, c5))
    out.write("};\n")


if __name__ == "__main__":
    main()
