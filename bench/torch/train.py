#!/usr/bin/env python3
"""One training configuration in PyTorch: the twin of bench/train.c.

The model (models.py) trains on one fixed random batch kept on the device (x ~ N(0, 1), labels
in 0..9). One step: forward, F.cross_entropy (mean), backward, SGD (lr 0.01, momentum 0.9)
step, zero_grad(), in one amp mode:
  off    f32
  fp16   torch.autocast(dtype=float16) around forward + loss, torch.amp.GradScaler (defaults)
  bf16   torch.autocast(dtype=bfloat16) around forward + loss, no scaler
  o2     Apex O2 done with PyTorch's own parts (Apex is not installed): the model in f16 except
         BatchNorm, f32 master weights (f32 parameters are their own masters, as Apex), the
         f16 gradients copied into the master gradients, torch.amp.GradScaler(init 2^16) for
         scaling, unscaling, the inf check and the skip, the masters copied back into the model.
Timing: --warmup steps, then --repeats blocks of --steps steps, each block timed with
time.perf_counter between torch.cuda.synchronize() calls; per-step time = block / steps.
Host round trips (CUDA): counted on an extra untimed block with torch.cuda.set_sync_debug_mode.
Variants (bench/run runs each as its own row, and takes the ratio against the faster eager one):
  --memory-format channels_last   model and input in NHWC, how PyTorch's users run convnets
  --compile                       the model through torch.compile (default mode); compilation
                                  happens in the warm-up steps, which are not timed
  (and on the CPU bench/run runs each with and without a tuned glibc malloc, set in the
  process's environment: MALLOC_TUNED in bench/run)
Memory: peak RSS (getrusage) and RSS before the model; on CUDA torch.cuda.max_memory_allocated.
"""
import argparse

import common
import torch
import torch.nn.functional as F
from torch import nn

import models


class Trainer:
    def __init__(self, model, dev, amp, memory_format=torch.contiguous_format):
        self.dev, self.amp = dev, amp
        self.model = model.to(dev, memory_format=memory_format)
        self.model.train()
        sgd = dict(lr=0.01, momentum=0.9)
        self.scaler = None
        if amp == "o2":
            self.model.half()
            for m in self.model.modules():
                if isinstance(m, nn.modules.batchnorm._BatchNorm):
                    m.float()
            self.params = [p for p in self.model.parameters() if p.requires_grad]
            self.masters = [p if p.dtype == torch.float32
                            else p.detach().float().clone().requires_grad_() for p in self.params]
            self.half_pairs = [(m, p) for m, p in zip(self.masters, self.params) if m is not p]
            for m, p in self.half_pairs:
                m.grad = torch.zeros_like(m)
            self.opt = torch.optim.SGD(self.masters, **sgd)
            self.scaler = torch.amp.GradScaler(dev.type, init_scale=2.0 ** 16)
        else:
            self.opt = torch.optim.SGD(self.model.parameters(), **sgd)
            if amp == "fp16":
                self.scaler = torch.amp.GradScaler(dev.type)

    def step(self, x, y):
        if self.amp in ("fp16", "bf16"):
            dt = torch.float16 if self.amp == "fp16" else torch.bfloat16
            with torch.autocast(self.dev.type, dtype=dt):
                loss = F.cross_entropy(self.model(x), y)
            if self.scaler is not None:
                self.scaler.scale(loss).backward()
                self.scaler.step(self.opt)
                self.scaler.update()
            else:
                loss.backward()
                self.opt.step()
            self.opt.zero_grad()
        elif self.amp == "o2":
            loss = F.cross_entropy(self.model(x.half()).float(), y)
            self.scaler.scale(loss).backward()
            if self.half_pairs:
                torch._foreach_copy_([m.grad for m, _ in self.half_pairs],
                                     [p.grad for _, p in self.half_pairs])
            self.scaler.step(self.opt)
            self.scaler.update()
            with torch.no_grad():
                if self.half_pairs:
                    torch._foreach_copy_([p for _, p in self.half_pairs],
                                         [m for m, _ in self.half_pairs])
            self.model.zero_grad()
        else:
            loss = F.cross_entropy(self.model(x), y)
            loss.backward()
            self.opt.step()
            self.opt.zero_grad()
        return loss


MEMORY_FORMATS = {"contiguous": torch.contiguous_format, "channels_last": torch.channels_last}


def variant_name(memory_format="contiguous", compile=False):
    """The variant's suffix of the key: "" for plain eager, else "+channels_last", "+compile"."""
    return ("+" + memory_format if memory_format != "contiguous" else "") + \
        ("+compile" if compile else "")


def run(model="mlp", device="cpu", amp="off", batch=128, warmup=5, repeats=10, steps=5,
        threads=0, memory_format="contiguous", compile=False, tf32=False):
    """tf32: f32 matrix products in TF32 too (cuDNN's convolutions are by PyTorch's default),
    restored afterwards (plan.py runs several configurations in one process)."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    if tf32:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    try:
        return run_tf32_as_set(model, device, amp, batch, warmup, repeats, steps, threads,
                               memory_format, compile)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def run_tf32_as_set(model, device, amp, batch, warmup, repeats, steps, threads, memory_format,
                    compile):
    key = "train/%s/%s/%s%s" % (device, model, amp, variant_name(memory_format, compile))
    threads = common.setup_threads(threads)
    if memory_format not in MEMORY_FORMATS:
        raise common.BenchError(key, "unknown memory format %r" % memory_format, 2)
    dev = common.device_or_fail(device, key)
    if dev.type == "cuda" and amp == "bf16" and not torch.cuda.is_bf16_supported():
        raise common.BenchError(key, "bf16 is not supported on this CUDA device")
    if model not in models.MODELS:
        raise common.BenchError(key, "unknown model %r" % model, 2)

    base_rss = common.rss_now_mib()
    torch.manual_seed(0)
    net, shape = models.by_name(model)
    params = sum(p.numel() for p in net.parameters())
    try:
        mf = MEMORY_FORMATS[memory_format]
        t = Trainer(net, dev, amp, mf)
        if compile:
            t.model = torch.compile(t.model)
            warmup = max(warmup, 3)  # compiles, then recompiles once for the steady state
        x = torch.randn((batch,) + shape, device=dev)
        if len(shape) == 3:
            x = x.contiguous(memory_format=mf)
        y = torch.randint(0, 10, (batch,), device=dev)
        for _ in range(warmup):
            t.step(x, y)
        per_step = []
        loss = None
        for _ in range(repeats):
            common.sync(dev)
            t0 = common.now_s()
            for _ in range(steps):
                loss = t.step(x, y)
            common.sync(dev)
            per_step.append((common.now_s() - t0) / steps * 1e3)
        loss_value = loss.item()
        syncs = None
        if dev.type == "cuda":
            with common.SyncCounter(dev) as sc:
                for _ in range(steps):
                    t.step(x, y)
            syncs = sc.count / steps
    except RuntimeError as e:
        raise common.BenchError(key, str(e).splitlines()[0] if str(e) else repr(e))
    st = common.stats(per_step)
    out = {"bench": "train", "key": key, "impl": "pytorch", "model": model,
           "device": device, "amp": amp, "batch": batch, "warmup": warmup,
           "repeats": repeats, "steps": steps, "params": params, "threads": threads,
           "variant": variant_name(memory_format, compile) or "eager",
           "torch": torch.__version__, "step_ms": st,
           "images_per_s": batch / (st["median"] * 1e-3), "loss": loss_value,
           "peak_rss_mib": common.peak_rss_mib(), "base_rss_mib": base_rss}
    if dev.type == "cuda":
        out["cuda_peak_mib"] = torch.cuda.max_memory_allocated() / (1024.0 * 1024.0)
        out["cuda_reserved_peak_mib"] = torch.cuda.max_memory_reserved() / (1024.0 * 1024.0)
        out["syncs_per_step"] = syncs
        out["tf32_matmul"] = torch.backends.cuda.matmul.allow_tf32
        out["tf32_cudnn"] = torch.backends.cudnn.allow_tf32
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="mlp", choices=sorted(models.MODELS))
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--amp", default="off", choices=["off", "fp16", "bf16", "o2"])
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--threads", type=int, default=0,
                   help="CPU threads (default: PyTorch's own default)")
    p.add_argument("--memory-format", default="contiguous", choices=sorted(MEMORY_FORMATS))
    p.add_argument("--compile", action="store_true", help="run the model through torch.compile")
    p.add_argument("--tf32", action="store_true",
                   help="f32 matrix products in TF32 too (convolutions are by default)")
    a = p.parse_args()
    common.run_main("train/%s/%s/%s%s" % (a.device, a.model, a.amp,
                                          variant_name(a.memory_format, a.compile)),
                    lambda: run(**vars(a)))


if __name__ == "__main__":
    main()
