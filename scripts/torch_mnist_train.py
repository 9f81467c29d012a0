#!/usr/bin/env python3
"""The PyTorch twin of `mnist-train --device cuda`: the same CNN (bench/torch/models.py), SGD
with Nesterov momentum 0.9, lr 0.05, batch 128, per-dataset normalization, one batch copied to
the GPU per step, one epoch, then test accuracy. Modes: off (f32), fp16 (torch.autocast +
GradScaler), bf16 (torch.autocast, no scaler), o2 (PyTorch has no O2; measured as fp16
autocast + GradScaler, the nearest native recipe). One JSON line per mode on stdout.

  scripts/torch_mnist_train.py DATA_DIR [--modes off,fp16,bf16,o2] [--epochs 1] [--batch 128]
"""
import argparse
import gzip
import json
import os
import struct
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench", "torch"))
import models  # noqa: E402


def read_idx(path):
    opener = gzip.open if open(path, "rb").read(2) == b"\x1f\x8b" else open
    with opener(path, "rb") as f:
        data = f.read()
    magic = struct.unpack(">I", data[:4])[0]
    nd = magic & 0xFF
    dims = struct.unpack(">" + "I" * nd, data[4:4 + 4 * nd])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * nd).reshape(dims)


def find(d, stem):
    for name in (stem + ".gz", stem):
        if os.path.exists(os.path.join(d, name)):
            return os.path.join(d, name)
    raise SystemExit(f"{stem}[.gz] not found in {d}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("--modes", default="off,fp16,bf16,o2")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=0.05)
    a = ap.parse_args()
    dev = torch.device("cuda")
    xtr = read_idx(find(a.data, "train-images-idx3-ubyte")).astype(np.float32) / 255.0
    ytr = read_idx(find(a.data, "train-labels-idx1-ubyte")).astype(np.int64)
    xte = read_idx(find(a.data, "t10k-images-idx3-ubyte")).astype(np.float32) / 255.0
    yte = read_idx(find(a.data, "t10k-labels-idx1-ubyte")).astype(np.int64)
    mean, std = float(xtr.mean()), float(xtr.std())
    xtr = torch.from_numpy((xtr - mean) / std).unsqueeze(1).pin_memory()
    xte = torch.from_numpy((xte - mean) / std).unsqueeze(1)
    ytr, yte = torch.from_numpy(ytr).pin_memory(), torch.from_numpy(yte)
    for mode in a.modes.split(","):
        torch.manual_seed(1)
        net = models.mnist_cnn().to(dev)
        opt = torch.optim.SGD(net.parameters(), lr=a.lr, momentum=0.9, nesterov=True)
        amp_dtype = {"fp16": torch.float16, "o2": torch.float16, "bf16": torch.bfloat16}.get(mode)
        scaler = torch.amp.GradScaler("cuda", enabled=mode in ("fp16", "o2"))
        n = xtr.shape[0]
        images, t_train = 0, 0.0
        for epoch in range(a.epochs):
            perm = torch.randperm(n)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for s in range(0, n, a.batch):
                idx = perm[s:s + a.batch]
                x = xtr[idx].to(dev, non_blocking=True)
                y = ytr[idx].to(dev, non_blocking=True)
                with torch.autocast("cuda", dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
                    loss = torch.nn.functional.cross_entropy(net(x), y)
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
                opt.zero_grad(set_to_none=False)
                images += idx.numel()
            torch.cuda.synchronize()
            t_train += time.perf_counter() - t0
        net.eval()
        correct = 0
        with torch.no_grad(), torch.autocast("cuda", dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
            for s in range(0, xte.shape[0], 1000):
                correct += (net(xte[s:s + 1000].to(dev)).argmax(1).cpu() == yte[s:s + 1000]).sum().item()
        ips = images / t_train
        print(json.dumps({"framework": "pytorch", "torch": torch.__version__, "model": "cnn", "amp": mode,
                          "batch": a.batch, "epochs": a.epochs, "train_images_per_s": round(ips, 1),
                          "step_ms": round(1000 * a.batch / ips, 4), "train_time_s": round(t_train, 3),
                          "test_acc": correct / xte.shape[0], "final_loss": float(loss)}), flush=True)


if __name__ == "__main__":
    main()
