#!/usr/bin/env python3
"""Runs several benchmark configurations in one PyTorch process (bench/run uses it for CUDA,
where importing torch and starting CUDA would otherwise dominate a short run).

Argument: a JSON list of {"bench": "overhead" | "train", ...keyword arguments of overhead.run
or train.run...}. One JSON line per configuration on stdout, an "error" line for one that
fails. Between configurations the CUDA caching allocator is emptied and its peak reset, so each
configuration's torch.cuda.max_memory_allocated is its own. Host peak RSS cannot be reset: use
one process per configuration for CPU memory figures (bench/run does).
"""
import json
import sys

import common
import overhead
import train


def main():
    plan = json.loads(sys.argv[1] if len(sys.argv) > 1 else sys.stdin.read())
    rc = 0
    for cfg in plan:
        cfg = dict(cfg)
        kind = cfg.pop("bench")
        common.reset_cuda_peak()
        try:
            common.emit(overhead.run(**cfg) if kind == "overhead" else train.run(**cfg))
        except common.BenchError as e:
            common.emit({"key": e.key, "impl": "pytorch", "error": e.msg})
            rc = 1
    sys.exit(rc)


if __name__ == "__main__":
    main()
