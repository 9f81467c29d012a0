#!/usr/bin/env python3
"""Framework overhead in PyTorch: the twin of bench/overhead.c.

x is a 1-element f32 leaf that requires grad; c a 1-element constant tensor (1.0). One iteration
builds y = x, then y = y + c, y = y * c, ... alternately (--ops ops in all), runs backward from
y, drops x's gradient and the graph. Reported per op: us_per_op (forward + backward + release)
and fwd_us_per_op (forward only). The time includes Python's interpreter: that is the cost a
PyTorch user pays per op. On CUDA the iteration ends with torch.cuda.synchronize().
"""
import argparse

import common
import torch


def run(device="cpu", ops=1000, warmup=5, repeats=30, threads=0):
    key = "overhead/%s" % device
    threads = common.setup_threads(threads)
    dev = common.device_or_fail(device, key)
    x = torch.full((1,), 0.5, device=dev, requires_grad=True)
    c = torch.ones(1, device=dev)
    total, fwd = [], []
    for r in range(-warmup, repeats):
        common.sync(dev)
        t0 = common.now_s()
        y = x
        for i in range(ops):
            y = y * c if i & 1 else y + c
        t1 = common.now_s()
        y.backward()
        x.grad = None
        del y
        common.sync(dev)
        t2 = common.now_s()
        if r >= 0:
            total.append((t2 - t0) / ops * 1e6)
            fwd.append((t1 - t0) / ops * 1e6)
    return {"bench": "overhead", "key": key, "impl": "pytorch", "device": device, "ops": ops,
            "warmup": warmup, "repeats": repeats, "threads": threads,
            "torch": torch.__version__,
            "us_per_op": common.stats(total), "fwd_us_per_op": common.stats(fwd)}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--ops", type=int, default=1000)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--threads", type=int, default=0, help="CPU threads (default: PyTorch's own default)")
    a = p.parse_args()
    common.run_main("overhead/%s" % a.device, lambda: run(**vars(a)))


if __name__ == "__main__":
    main()
