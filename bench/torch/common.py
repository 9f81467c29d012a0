"""What the PyTorch twins share: threads, timing statistics, memory figures and the JSON line.

Mirrors bench/bench_util.c: the same statistics (median, min, max and quartiles with linear
interpolation between order statistics), the same memory figures (peak RSS from getrusage, the
RSS before the model is built) and one JSON object per line on stdout, joined by bench/run with
na-bench's by "key".
"""
import json
import math
import os
import resource
import sys
import time
import warnings

# torch prints this when NumPy is absent; NumPy is not needed here
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402


def setup_threads(threads):
    """PyTorch at its best: its own default thread count unless a number is asked for
    (bench/run --threads N sets both sides to N)."""
    n = threads or int(os.environ.get("NANOAMP_BENCH_THREADS", "0"))
    if n:
        torch.set_num_threads(n)
    return torch.get_num_threads()


def now_s():
    return time.perf_counter()


def quantile(sorted_v, q):
    pos = q * (len(sorted_v) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(sorted_v) - 1)
    return sorted_v[lo] + (pos - lo) * (sorted_v[hi] - sorted_v[lo])


def stats(values):
    v = sorted(values)
    if not v:
        return {"median": None, "min": None, "max": None, "q1": None, "q3": None, "n": 0}
    return {"median": quantile(v, 0.5), "min": v[0], "max": v[-1],
            "q1": quantile(v, 0.25), "q3": quantile(v, 0.75), "n": len(v)}


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def rss_now_mib():
    try:
        with open("/proc/self/statm") as f:
            resident = int(f.read().split()[1])
        return resident * os.sysconf("SC_PAGESIZE") / (1024.0 * 1024.0)
    except (OSError, ValueError, IndexError):
        return 0.0


def emit(obj):
    def clean(x):
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        return x
    sys.stdout.write(json.dumps(clean(obj)) + "\n")
    sys.stdout.flush()


class BenchError(Exception):
    """A configuration that cannot run; code 3: the device is not available."""

    def __init__(self, key, msg, code=1):
        super().__init__(msg)
        self.key, self.msg, self.code = key, msg, code


def run_main(key, fn):
    """Runs fn() -> result dict and prints it; on failure prints the error line (as na-bench
    does) and exits nonzero."""
    try:
        emit(fn())
    except BenchError as e:
        emit({"key": e.key, "impl": "pytorch", "error": e.msg})
        sys.stderr.write("bench/torch %s: %s\n" % (e.key, e.msg))
        sys.exit(e.code)


def device_or_fail(name, key):
    if name == "cuda" and not torch.cuda.is_available():
        raise BenchError(key, "no CUDA device (torch.cuda.is_available() is False)", 3)
    return torch.device(name)


def reset_cuda_peak():
    """Between configurations run in one process: frees cached blocks and resets the peak."""
    import gc
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


class SyncCounter:
    """Counts device->host synchronizations with torch.cuda.set_sync_debug_mode("warn"): every
    synchronizing call (item(), .cpu(), nonzero, cudaStreamSynchronize, ...) raises a
    warning, and the warnings are counted. Used on an untimed block of steps, since the
    warnings cost time."""

    def __init__(self, dev):
        self.dev = dev
        self.count = 0

    def __enter__(self):
        if self.dev.type == "cuda":
            self._cm = warnings.catch_warnings(record=True)
            self._log = self._cm.__enter__()
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc):
        if self.dev.type == "cuda":
            torch.cuda.set_sync_debug_mode("default")
            self.count = sum(1 for w in self._log if "synchroniz" in str(w.message).lower())
            self._cm.__exit__(*exc)
        return False
