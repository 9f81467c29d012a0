#!/usr/bin/env python3
"""The PyTorch twin of `mnist-train`: the same CNN (bench/torch/models.py), SGD with Nesterov
momentum 0.9, lr 0.05, batch 128, per-dataset normalization, one batch copied to the device per
step, one epoch, then test accuracy. PyTorch runs at its defaults (threads, OpenMP); on the CPU
`--memory-format channels_last` is the variant convnet users run. Modes: off (f32), fp16 (torch.autocast +
GradScaler), bf16 (torch.autocast, no scaler), o2 (PyTorch has no O2; measured as fp16
autocast + GradScaler, the nearest native recipe). One JSON line per mode on stdout.

  scripts/torch_mnist_train.py DATA_DIR [--device cuda|cpu] [--modes off,fp16,bf16,o2]
                               [--epochs 1] [--batch 128] [--memory-format channels_last]
"""
import argparse
import gzip
import json
import os
import struct
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench", "torch"))
import models  # noqa: E402


def read_idx(path):
    """An IDX file of bytes as a uint8 tensor of its shape."""
    opener = gzip.open if open(path, "rb").read(2) == b"\x1f\x8b" else open
    with opener(path, "rb") as f:
        data = f.read()
    magic = struct.unpack(">I", data[:4])[0]
    nd = magic & 0xFF
    dims = struct.unpack(">" + "I" * nd, data[4:4 + 4 * nd])
    return torch.frombuffer(bytearray(data), dtype=torch.uint8, offset=4 + 4 * nd).reshape(dims)


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
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--memory-format", default="contiguous",
                    choices=["contiguous", "channels_last"])
    a = ap.parse_args()
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    mf = torch.channels_last if a.memory_format == "channels_last" else torch.contiguous_format
    xtr = read_idx(find(a.data, "train-images-idx3-ubyte")).float() / 255.0
    ytr = read_idx(find(a.data, "train-labels-idx1-ubyte")).long()
    xte = read_idx(find(a.data, "t10k-images-idx3-ubyte")).float() / 255.0
    yte = read_idx(find(a.data, "t10k-labels-idx1-ubyte")).long()
    mean, std = float(xtr.mean()), float(xtr.std())
    xtr = ((xtr - mean) / std).unsqueeze(1)
    xte = ((xte - mean) / std).unsqueeze(1)
    if cuda:
        xtr, ytr = xtr.pin_memory(), ytr.pin_memory()

    def sync():
        if cuda:
            torch.cuda.synchronize()
    for mode in a.modes.split(","):
        torch.manual_seed(1)
        net = models.mnist_cnn().to(dev, memory_format=mf)
        opt = torch.optim.SGD(net.parameters(), lr=a.lr, momentum=0.9, nesterov=True)
        amp_dtype = {"fp16": torch.float16, "o2": torch.float16, "bf16": torch.bfloat16}.get(mode)
        scaler = torch.amp.GradScaler(dev.type, enabled=mode in ("fp16", "o2"))
        n = xtr.shape[0]
        images, t_train = 0, 0.0
        for epoch in range(a.epochs):
            perm = torch.randperm(n)
            sync()
            t0 = time.perf_counter()
            for s in range(0, n, a.batch):
                idx = perm[s:s + a.batch]
                x = xtr[idx].to(dev, non_blocking=True).contiguous(memory_format=mf)
                y = ytr[idx].to(dev, non_blocking=True)
                with torch.autocast(dev.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
                    loss = torch.nn.functional.cross_entropy(net(x), y)
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
                opt.zero_grad(set_to_none=False)
                images += idx.numel()
            sync()
            t_train += time.perf_counter() - t0
        net.eval()
        correct = 0
        with torch.no_grad(), torch.autocast(dev.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
            for s in range(0, xte.shape[0], 1000):
                xb = xte[s:s + 1000].to(dev).contiguous(memory_format=mf)
                correct += (net(xb).argmax(1).cpu() == yte[s:s + 1000]).sum().item()
        ips = images / t_train
        print(json.dumps({"framework": "pytorch", "torch": torch.__version__, "model": "cnn", "amp": mode,
                          "device": a.device, "memory_format": a.memory_format,
                          "threads": torch.get_num_threads(),
                          "batch": a.batch, "epochs": a.epochs, "train_images_per_s": round(ips, 1),
                          "step_ms": round(1000 * a.batch / ips, 4), "train_time_s": round(t_train, 3),
                          "test_acc": correct / xte.shape[0], "final_loss": loss.item()}), flush=True)


if __name__ == "__main__":
    main()
