#!/usr/bin/env python3
"""bench/run's table logic on canned results, no process run (tests/bench_cli.sh runs it):
the kernel rows join ours and PyTorch's convolutions by name with % of the measured peak;
the speed-up rows divide each side's f32 step by its amp step; a configuration's ratios come
from the best rounds (min) and the per-round pairs (median).
usage: bench_run_units.py BENCH_RUN"""
import importlib.machinery
import importlib.util
import os
import sys

loader = importlib.machinery.SourceFileLoader("bench_run", sys.argv[1])
spec = importlib.util.spec_from_loader("bench_run", loader)
br = importlib.util.module_from_spec(spec)
loader.exec_module(br)

# ---- kernel rows: na-kbench and conv.py stubbed
OURS = [{"bench": "peak", "kernel": "f32_fma_avx512", "threads": 2, "gflops": 200.0},
        {"bench": "peak", "kernel": "bf16_dp_avx512", "threads": 2, "gflops": 400.0},
        {"bench": "kernel", "kernel": "cnn_conv2_32x64_forward", "variant": "im2col_gemm",
         "dtype": "f32", "gflops": 50.0, "peak": "f32_fma_avx512"},
        {"bench": "kernel", "kernel": "cnn_conv2_32x64_forward", "variant": "direct_avx512",
         "dtype": "f32", "gflops": 150.0, "peak": "f32_fma_avx512"},
        {"bench": "kernel", "kernel": "cnn_conv2_32x64_bf16_forward", "variant": "default",
         "dtype": "bf16", "gflops": 100.0, "peak": "bf16_dp_avx512"},
        # a kernel with no direct row (a CPU without the direct convolution): im2col is shown
        {"bench": "kernel", "kernel": "cnn_conv2_32x64_f16_forward", "variant": "im2col_gemm",
         "dtype": "f16", "gflops": 40.0, "peak": "f32_fma_avx512"}]
THEIRS = [{"bench": "kernel", "kernel": "cnn_conv2_32x64_forward", "impl": "pytorch",
           "variant": "channels_last", "gflops": 120.0},
          {"bench": "kernel", "kernel": "cnn_conv2_32x64_bf16_forward", "impl": "pytorch",
           "variant": "contiguous", "gflops": 300.0}]
calls = []


AGAIN = [{"bench": "peak", "kernel": "f32_fma_avx512", "threads": 2, "gflops": 100.0},
         {"bench": "peak", "kernel": "bf16_dp_avx512", "threads": 2, "gflops": 500.0}]


def fake_run(cmd, env=None, timeout=0):
    calls.append((cmd, env))
    return (THEIRS if cmd[1].endswith("conv.py") else AGAIN if cmd[1:] == ["peak"] else OURS), ""


br.run_json_lines = fake_run
os.access = lambda path, mode: True
rows, raw = br.kernel_rows("/b/bench/na-bench", "python-with-torch", {"A": "1"}, "quick", 10)
assert calls[0][0][:3] == ["/b/bench/na-kbench", "--repeats", "3"], calls
assert calls[1][1]["MALLOC_MMAP_THRESHOLD_"] == "4000000000"  # PyTorch's: tuned malloc
assert "MALLOC_TOP_PAD_" not in calls[0][1]  # ours: the default
assert [r[2] for r in rows[:2]] == ["200.0", "500.0"], rows  # the higher of the two probes
assert rows[0] == ("peak cpu: f32_fma_avx512, 2 threads", "GFLOP/s", "200.0", "", "", ""), rows
want = [("kernel cpu: cnn_conv2_32x64_forward (direct_avx512), % of f32_fma_avx512", "GFLOP/s",
         "150.0 (75%)", "120.0 (60%) (channels_last)", "1.25", ""),
        ("kernel cpu: cnn_conv2_32x64_bf16_forward (default), % of bf16_dp_avx512", "GFLOP/s",
         "100.0 (20%)", "300.0 (60%)", "0.33", ""),
        ("kernel cpu: cnn_conv2_32x64_f16_forward (im2col_gemm), % of f32_fma_avx512", "GFLOP/s",
         "40.00 (20%)", "", "", "")]
assert rows[2:] == want, rows  # the f32 im2col row beside a direct one stays in the JSON only
assert len(raw) == len(OURS) + len(THEIRS) + len(AGAIN)


# ---- speed-up rows and ratios over rounds
def res(impl, key, medians):
    rounds = [{"key": key, "impl": impl, "step_ms": {"median": m}} for m in medians]
    return br.combine_rounds(rounds)


cfgs = [{"bench": "train", "device": "cpu", "model": "cnn", "amp": a, "batch": 128}
        for a in ("off", "bf16")]
ours = {"train/cpu/cnn/off": res("nanoamp", "train/cpu/cnn/off", [30, 32, 40]),
        "train/cpu/cnn/bf16": res("nanoamp", "train/cpu/cnn/bf16", [20, 16, 25])}
theirs = {"train/cpu/cnn/off": res("pytorch", "train/cpu/cnn/off", [40, 44, 42]),
          "train/cpu/cnn/off+channels_last": res("pytorch", "train/cpu/cnn/off+channels_last",
                                                 [33, 36, 35]),
          "train/cpu/cnn/bf16": res("pytorch", "train/cpu/cnn/bf16", [22, 24, 30])}
best = br.best_eager(cfgs[0], theirs)
assert best["key"] == "train/cpu/cnn/off+channels_last", best
assert br.ratios(ours["train/cpu/cnn/off"], best, "step_ms") == (
    "%.2f" % (30 / 33), "%.2f" % sorted([30 / 33, 32 / 36, 40 / 35])[1])
gain = br.gain_rows(cfgs, ours, lambda c: br.best_eager(c, theirs))
ours_gain, their_gain = 32 / 20, 35 / 24  # medians over rounds
assert gain == [("cnn cpu b128 bf16: speed-up over f32", "x (f32/amp step)",
                 br.fmt_num(ours_gain), br.fmt_num(their_gain),
                 "%.2f" % ((30 / 16) / (33 / 22)), "%.2f" % (ours_gain / their_gain))], gain
step = br.rows_for(cfgs[0], ours["train/cpu/cnn/off"],
                   {k: v for k, v in theirs.items() if "off" in k})[0]
assert step[2] == "32.00 [30.00-40.00]" and step[3] == "35.00 [33.00-36.00] (channels_last)", step

# ---- a CUDA group: ours one process per configuration, PyTorch one plan.py for the group,
# the order reversed every round
order = []


def fake_cuda(cmd, env=None, timeout=0):
    if cmd[1].endswith("plan.py"):
        order.append("plan")
        plan = br.json.loads(cmd[2])
        assert all("compile_row" not in p for p in plan), plan  # not train.run's
        return [{"key": "train/cuda/cnn/off" + ("+channels_last" if p.get("memory_format")
                                                   else "") + ("+compile" if p.get("compile")
                                                                else ""),
                 "impl": "pytorch", "step_ms": {"median": 2.0}} for p in plan], ""
    order.append("ours" + ("/cl" if "--channels-last" in cmd else ""))
    return [{"impl": "nanoamp", "step_ms": {"median": 1.0}}], ""


class Args:
    timeout, threads, no_compile = 10, 0, False


br.run_json_lines = fake_cuda
c = {"bench": "train", "device": "cuda", "model": "cnn", "amp": "off", "batch": 128,
     "compile_row": True}
group = [c, dict(c, channels_last=True)]
o_runs, t_runs = br.alternate(group, 2, "na-bench", "py", {}, Args)
assert order == ["ours", "ours/cl", "plan", "plan", "ours/cl", "ours"], order
assert sorted(o_runs) == ["train/cuda/cnn/off", "train/cuda/cnn/off/cl"], o_runs
assert sorted(t_runs) == ["train/cuda/cnn/off", "train/cuda/cnn/off+channels_last",
                          "train/cuda/cnn/off+channels_last+compile"], t_runs
assert all([r["round"] for r in v] == [0, 1]
           for v in list(o_runs.values()) + list(t_runs.values()))
theirs = {k: br.combine_rounds(v) for k, v in t_runs.items()}
rows = br.rows_for(group[1], br.combine_rounds(o_runs["train/cuda/cnn/off/cl"]), theirs)
assert rows[0][0] == "cnn cuda b128 off channels-last: step" and rows[0][4:] == ("0.50", "0.50")
assert rows[-1][0].endswith("step vs channels_last, compile"), rows
print("bench_run_units: ok")
