#!/usr/bin/env python3
"""The convolutions of na-kbench's conv cases in PyTorch: the twin of bench/kernels.c's
bench_conv_layers, for per-layer GFLOP/s beside ours.

The same layers (the MNIST CNN's two at batch 128, ResNet-9's six distinct 3x3 layers at batch
32), kernels and names (e.g. resnet9_conv3_128x128_bf16_backward_weight): forward with bias
(F.conv2d), data gradient and weight gradient (aten.convolution_backward with one output
each), f32 and bf16 tensors, no autograd. Each kernel runs in both layouts (NCHW and
channels-last) and prints its faster one ("variant"); the minimum over --repeats calls after
one warm-up call, in ms, as na-kbench. GFLOP per kernel: 2 N C K 9 H W / 1e9. A total row per
dtype and net divides all the FLOPs by all the time of the chosen layouts.

  conv.py [--repeats N] [--threads N] [case...]     cases: conv, conv-resnet9 (default both)
"""
import argparse

import common
import torch
import torch.nn.functional as F

CASES = {  # {batch, c_in, c_out, h = w}, as bench/kernels.c
    "conv": ("cnn", [(128, 1, 32, 28), (128, 32, 64, 14)]),
    "conv-resnet9": ("resnet9", [(32, 3, 64, 32), (32, 64, 128, 32), (32, 128, 128, 16),
                                 (32, 128, 256, 16), (32, 256, 512, 8), (32, 512, 512, 4)]),
}
LAYOUTS = {"contiguous": torch.contiguous_format, "channels_last": torch.channels_last}


def min_ms(fn, repeats):
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = common.now_s()
        fn()
        best = min(best, (common.now_s() - t0) * 1e3)
    return best


def layer_kernels(n, c, k, hw, dtype, layout):
    """[(kernel suffix, callable)] of one layer in one layout."""
    mf = LAYOUTS[layout]
    x = torch.randn(n, c, hw, hw, dtype=dtype).contiguous(memory_format=mf)
    w = torch.randn(k, c, 3, 3, dtype=dtype).contiguous(memory_format=mf)
    b = torch.randn(k, dtype=dtype)
    gy = torch.randn(n, k, hw, hw, dtype=dtype).contiguous(memory_format=mf)

    def backward(mask):
        return lambda: torch.ops.aten.convolution_backward(
            gy, x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1, mask)
    out = [("forward", lambda: F.conv2d(x, w, b, padding=1))]
    if c > 3:  # a first layer's input needs no gradient (as na-kbench)
        out.append(("backward_data", backward([True, False, False])))
    out.append(("backward_weight", backward([False, True, False])))
    return out


def run_case(case, repeats):
    net, layers = CASES[case]
    rows = []
    for dtype, dname in ((torch.float32, "f32"), (torch.bfloat16, "bf16")):
        total_gflop = total_ms = 0.0
        for i, (n, c, k, hw) in enumerate(layers):
            gflop = 2.0 * n * c * k * 9 * hw * hw / 1e9
            best = {}
            for layout in LAYOUTS:
                for suffix, fn in layer_kernels(n, c, k, hw, dtype, layout):
                    ms = min_ms(fn, repeats)
                    if suffix not in best or ms < best[suffix][0]:
                        best[suffix] = (ms, layout)
            for suffix, (ms, layout) in best.items():
                name = "%s_conv%d_%dx%d%s_%s" % (net, i + 1, c, k,
                                                 "" if dname == "f32" else "_bf16", suffix)
                rows.append({"bench": "kernel", "kernel": name, "impl": "pytorch",
                             "variant": layout, "dtype": dname, "min_ms": ms, "gflop": gflop,
                             "gflops": gflop * 1e3 / ms})
                total_gflop += gflop
                total_ms += ms
        rows.append({"bench": "kernel", "impl": "pytorch", "variant": "best layout",
                     "kernel": "%s_conv_total%s" % (net, "" if dname == "f32" else "_bf16"),
                     "dtype": dname, "min_ms": total_ms, "gflop": total_gflop,
                     "gflops": total_gflop * 1e3 / total_ms})
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--threads", type=int, default=0,
                   help="CPU threads (default: PyTorch's own default)")
    p.add_argument("cases", nargs="*", metavar="case", help="conv, conv-resnet9 (default both)")
    a = p.parse_args()
    for case in a.cases:
        if case not in CASES:
            p.error("unknown case %r (cases: %s)" % (case, ", ".join(sorted(CASES))))
    threads = common.setup_threads(a.threads)
    with torch.no_grad():
        for case in a.cases or sorted(CASES):
            for r in run_case(case, a.repeats):
                r["threads"] = threads
                r["torch"] = torch.__version__
                common.emit(r)


if __name__ == "__main__":
    main()
