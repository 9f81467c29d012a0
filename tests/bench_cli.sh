#!/usr/bin/env bash
# The benchmark programs given bad arguments: each exits 2 (1 for a run that fails) with one
# message, and na-kbench checks every argument before it runs any case (a typo at the end of a
# long command costs no benchmark time). A one-repeat kernel case runs and prints JSON lines.
# bench/run's rounds and PyTorch variants run against a stand-in for torch (no torch needed).
# usage: bench_cli.sh NA_KBENCH NA_BENCH AMP_PLOT
set -uo pipefail
kbench="$1" bench="$2" amp_plot="$3"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
passed=0 failed=0
check() {
    local name=$1; shift
    if "$@"; then passed=$((passed + 1)); else echo "FAIL: $name"; failed=$((failed + 1)); fi
}
# run WANT_RC CMD...: stdout/stderr kept in $tmp/out, $tmp/err
run() {
    local want=$1; shift
    "$@" >"$tmp/out" 2>"$tmp/err"; local rc=$?
    [ "$rc" = "$want" ] || { echo "  exit $rc, wanted $want: $*"; sed 's/^/  | /' "$tmp/err" | head -n 5; return 1; }
}
one_line() { [ "$(wc -l <"$tmp/err")" = 1 ] && grep -Eq -- "$1" "$tmp/err" || { echo "  stderr:"; sed 's/^/  | /' "$tmp/err"; return 1; }; }
no_stdout() { [ ! -s "$tmp/out" ] || { echo "  something ran: $(head -c 200 "$tmp/out")"; return 1; }; }
json_lines() { python3 -c 'import json,sys; rows=[json.loads(l) for l in open(sys.argv[1])]; assert rows and all("min_ms" in r for r in rows)' "$tmp/out"; }

check "kbench unknown case" run 2 "$kbench" bogus
check "  message names the cases" one_line "unknown case 'bogus' \(cases: conv conv-resnet9"
check "kbench missing --repeats value" run 2 "$kbench" conv --repeats
check "  nothing ran before the error" no_stdout
check "kbench --repeats 0" run 2 "$kbench" --repeats 0 relu
check "  message" one_line "--repeats expects an integer >= 1"
check "kbench one repeat of relu" run 0 "$kbench" --repeats 1 --cpu-clock relu
check "  JSON lines" json_lines
check "bench unknown model" run 1 "$bench" train --model nope --warmup 0 --repeats 1 --steps 1
check "  the JSON names the error" grep -q '"error": ".*unknown model' "$tmp/out"
check "bench --batch 0" run 2 "$bench" train --batch 0
check "  message" one_line "--batch expects an integer >= 1"
check "bench unknown command" run 2 "$bench" --bogus
check "  message names it" grep -q "unknown command '--bogus'" "$tmp/err"
check "bench --help" run 0 "$bench" --help
check "  usage on stdout" grep -q '^usage:' "$tmp/out"
check "bench --tf32 on the CPU" run 1 "$bench" train --model mlp --tf32 --warmup 0 --repeats 1 --steps 1
check "  the JSON says it needs CUDA" grep -q '"error": ".*--tf32 .*needs --device cuda' "$tmp/out"
check "bench --cpu-clock on CUDA" run 1 "$bench" train --model mlp --device cuda --cpu-clock \
    --warmup 0 --repeats 1 --steps 1
check "  the JSON says it needs the CPU" grep -q '"error": ".*--cpu-clock .*needs --device cpu' \
    "$tmp/out"
check "bench --sync-bn without --ddp" run 1 "$bench" train --model cnn --sync-bn --warmup 0 --repeats 1 --steps 1
check "  the JSON says it needs --ddp" grep -q '"error": ".*--sync-bn .*needs --ddp' "$tmp/out"
check "bench --sync-bn --profile-steps 2 in a world of one with collectives" run 0 env NANOAMP_DIST_COLLECTIVES=1 \
    "$bench" train --model cnn --batch 4 --ddp --sync-bn --profile-steps 2 --warmup 0 --repeats 1 --steps 1
check "  the key, the profile's minima, the SyncBatchNorm rows" python3 -c '
import json, sys
j = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")][-1]
assert j["key"] == "train/cpu/cnn/off/ddp-f32/syncbn" and j["profile_steps"] == 2, j
assert 0 < j["profile_batchnorm_ms_min"] < j["profile_step_ms_min"], j
err = open(sys.argv[2]).read()
assert "sync_batch_norm backward" in err and "batch_norm_relu" not in err, err' "$tmp/out" "$tmp/err"
check "kbench --help" run 0 "$kbench" --help
check "  usage on stdout, with the cases" grep -q '^usage: na-kbench.*' "$tmp/out"
check "  the cases" grep -q 'conv conv-resnet9' "$tmp/out"
check "kbench --version" run 0 "$kbench" --version
check "  output" grep -Eq '^na-kbench \(nanoamp [0-9]+\.[0-9]+\.[0-9]+\)$' "$tmp/out"
# a setup failure (no memory for a batch of 10^11 images) frees what setup made: LeakSanitizer
# on for this one run (a no-op without ASan)
check "bench setup failure" run 1 env ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 "$bench" train --model mlp \
    --batch 100000000000 --warmup 0 --repeats 1 --steps 1
check "  the JSON names the stage" grep -q '"error": "setup' "$tmp/out"
check "  nothing leaked" bash -c "! grep -q LeakSanitizer '$tmp/err'"
check "amp-plot --version" run 0 "$amp_plot" --version
check "  output" grep -Eq '^amp-plot \(nanoamp [0-9]+\.[0-9]+\.[0-9]+\)$' "$tmp/out"
check "amp-plot --title without its value" run 2 "$amp_plot" --title
check "  message" one_line "^amp-plot: --title needs a value \(the picture's title\)$"

# na-kbench's peak probes and the convolutions' rate against them (bench/peak.h)
check "kbench peak" run 0 "$kbench" peak
check "  one row per probe, GFLOP/s > 0 where the CPU has it" python3 -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["kernel"] for r in rows] == ["f32_fma_avx512", "bf16_dp_avx512", "f32_fma_avx2"], rows
flags = open("/proc/cpuinfo").read().split()
for r, need in zip(rows, (("avx512f",), ("avx512f", "avx512_bf16"), ("avx2", "fma"))):
    assert (r["gflops"] > 0) == all(f in flags for f in need), r
    assert r["threads"] >= 1' "$tmp/out"
check "kbench conv: GFLOP/s and % of peak" run 0 "$kbench" --repeats 1 conv
check "  every row has them; totals per variant" python3 -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for r in rows:
    assert abs(r["gflops"] - r["gflop"] * 1e3 / r["min_ms"]) < 1e-3 * r["gflops"], r
flags = open("/proc/cpuinfo").read().split()
# the yardsticks: the widest f32 FMA; for bf16 vdpbf16ps where the CPU has it, else that FMA
f32_peak = "f32_fma_avx512" if "avx512f" in flags else "f32_fma_avx2"
bf16_peak = "bf16_dp_avx512" if "avx512_bf16" in flags else f32_peak
for r in rows:
    assert r["peak"] == (bf16_peak if r["dtype"] == "bf16" else f32_peak), r
    assert "pct_peak" in r and r["pct_peak"] > 0, r
totals = [r for r in rows if "_conv_total" in r["kernel"]]
# im2col, bf16 widened and f16 (f32 compute); the direct convolution and bf16 on vdpbf16ps
# where the CPU has them
direct = "avx512f" in flags or all(f in flags for f in ("avx2", "fma", "f16c"))
assert len(totals) == 3 + direct + ("avx512_bf16" in flags), totals
assert any(r["variant"].startswith("direct") for r in rows) == direct, rows
assert {r["dtype"] for r in rows} == {"f32", "bf16", "f16"}, totals
flop = sum(r["gflop"] for r in rows
           if r["variant"] == "im2col_gemm" and r["dtype"] == "f32" and "total" not in r["kernel"])
assert abs(flop - totals[0]["gflop"]) < 1e-4 * flop, (flop, totals[0])' "$tmp/out"

# bench/run: its own argument errors, then its rounds and PyTorch variants with a stand-in for
# torch (tests/bench_fake_torch.sh), so that they are tested where torch is not installed
runner="$(dirname "$0")/../bench/run" build_dir="$(dirname "$(dirname "$bench")")"
brun() { "$runner" --no-build --build-dir "$build_dir" --device cpu --quick --no-dist "$@"; }
check "bench/run --rounds 0" run 2 brun --rounds 0
check "  message" grep -q -- "--rounds expects an integer >= 1" "$tmp/err"
check "bench/run --json into a missing directory, refused before it runs" run 2 brun --no-torch \
    --json "$tmp/no/such/dir/r.json"
check "  message" grep -q -- "--json .*cannot be written (its directory .* does not exist)" "$tmp/err"
check "bench/run --no-torch, default rounds" run 0 brun --no-torch --no-kernels \
    --only train/cpu/mlp/off --only train/cpu/mlp/bf16 --json "$tmp/r.json"
check "  three rounds of ours, the table without PyTorch, the bf16 speed-up" python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))
raw = [r for r in j["raw"] if r["key"] == "train/cpu/mlp/off"]
assert [r["round"] for r in raw] == [0, 1, 2] and j["meta"]["rounds"] == {"cpu": 3}, raw
step = [t for t in j["table"] if t["row"] == "mlp cpu b128 off: step"][0]
assert float(step["ours"].split()[0]) > 0, step
assert step["pytorch"] == "" and step["ratio"] == "" and step["ratio_min"] == "", step
med = {}
for amp in ("off", "bf16"):
    m = sorted(r["step_ms"]["median"] for r in j["raw"] if r["key"] == "train/cpu/mlp/" + amp)
    med[amp] = m[1]
gain = [t for t in j["table"] if t["row"] == "mlp cpu b128 bf16: speed-up over f32"][0]
assert abs(float(gain["ours"]) / (med["off"] / med["bf16"]) - 1) < 0.01, (gain, med)
assert gain["pytorch"] == "" and gain["ratio"] == "", gain' "$tmp/r.json"
# the overhead configuration has no amp: bench/run once failed on it (KeyError) before any
# training row ran
check "bench/run, the overhead rows" run 0 brun --no-torch --no-kernels --only overhead \
    --rounds 1 --json "$tmp/o.json"
check "  the fwd+bwd row measured" python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))
row = [t for t in j["table"] if t["row"].startswith("overhead cpu") and "fwd+bwd" in t["row"]][0]
assert float(row["ours"].split()[0]) > 0, row' "$tmp/o.json"
check "bench/run with a stand-in torch" run 0 env FAKE_TORCH_LOG="$tmp/torch.log" \
    "$runner" --no-build --build-dir "$build_dir" --device cpu --quick --no-dist --no-kernels \
    --no-compile --python "$(dirname "$0")/bench_fake_torch.sh" --only train/cpu/cnn/off \
    --rounds 3 --json "$tmp/f.json"
check "  4 variants a round, tuned malloc in half, A B B A order, best variant, ratios" \
    python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))
log = open(sys.argv[2]).read().split("\n")[:-1]
assert len(log) == 12, log  # 3 rounds x (NCHW, channels-last) x (malloc default, tuned)
tuned = [l for l in log if "malloc=4000000000/4000000000/100000000" in l]
assert len(tuned) == 6 and all("malloc=default" in l for l in log if l not in tuned), log
assert sum("--memory-format channels_last" in l for l in log) == 6, log
runs = sorted(j["raw"], key=lambda r: r["started_s"])
sides = "".join("A" if r["impl"] == "nanoamp" else "B" for r in runs)
assert sides == "ABBBBBBBBAABBBB", sides
ours = [r["step_ms"]["median"] for r in runs if r["impl"] == "nanoamp"]
step = [t for t in j["table"] if t["row"] == "cnn cpu b128 off: step"][0]
assert step["pytorch"].endswith("(channels_last, tuned malloc)"), step  # the fake: 10+round ms
assert step["ratio_min"] == "%.2f" % (min(ours) / 10.0), (step, ours)
paired = sorted(o / (10.0 + r) for r, o in enumerate(ours))
assert step["ratio"] == "%.2f" % paired[1], (step, paired)' "$tmp/f.json" "$tmp/torch.log"
check "bench/run's kernel, speed-up and ratio logic (tests/bench_run_units.py)" \
    python3 "$(dirname "$0")/bench_run_units.py" "$runner"

# bench/syncbn-cost (docs/distributed.md, SyncBatchNorm): bad arguments exit 2 before anything
# runs; one tiny round in a world of one, and under mpirun -np 2 where the build has MPI, writes
# both sides' rows and ratios that are syncbn / batchnorm
syncbn="$(dirname "$0")/../bench/syncbn-cost"
check "syncbn-cost --rounds 0" run 2 "$syncbn" --build-dir "$build_dir" --rounds 0
check "  message" grep -q "expect an integer >= 1" "$tmp/err"
check "syncbn-cost without a build" run 2 "$syncbn" --build-dir "$tmp/none" --rounds 1
check "  one message naming it" one_line "no na-bench at $tmp/none/bench/na-bench"
check "syncbn-cost --json in a missing directory" run 2 "$syncbn" --build-dir "$build_dir" --rounds 1 --json "$tmp/none/x.json"
check "  one message naming it" one_line "cannot write --json $tmp/none/x.json: No such file"
check "syncbn-cost --ranks 2 --cpu-clock" run 2 "$syncbn" --build-dir "$build_dir" --ranks 2 --cpu-clock
check "  message says why" grep -q "spins" "$tmp/err"
# sjson FILE RANKS: the summary holds the rows of RANKS ranks with ratio = syncbn / batchnorm
sjson() {
    python3 -c 'import json, sys
j = json.load(open(sys.argv[1])); ranks = int(sys.argv[2])
keys = {"batchnorm_ms", "step_ms"} | ({"timed_step_min_ms", "timed_step_median_ms"} if ranks > 1 else set())
assert j["ranks"] == ranks and set(j["summary"]) == keys, j
assert len(j["raw"]) == 2 and {r["sync_bn"] for r in j["raw"]} == {False, True}, j["raw"]
for k, v in j["summary"].items():
    assert v["batchnorm"] > 0 and v["syncbn"] > 0 and abs(v["ratio"] - v["syncbn"] / v["batchnorm"]) < 1e-12, (k, v)' "$@"
}
check "syncbn-cost, a world of one" run 0 "$syncbn" --build-dir "$build_dir" --batch 8 --rounds 1 \
    --profile-steps 1 --threads 1 --json "$tmp/sc1.json"
check "  summary" sjson "$tmp/sc1.json" 1
if command -v mpirun >/dev/null && [ "${NANOAMP_BUILT_WITH_MPI:-1}" = 1 ]; then
    . "$(dirname "$0")/mpi_env.sh"
    check "syncbn-cost --ranks 2" run 0 "$syncbn" --build-dir "$build_dir" --batch 8 --rounds 1 \
        --profile-steps 1 --ranks 2 --repeats 1 --json "$tmp/sc2.json"
    check "  summary" sjson "$tmp/sc2.json" 2
else
    echo "syncbn-cost --ranks 2: no mpirun or no MPI in this build, not run"
fi
echo "bench_cli: $passed passed, $failed failed"
[ "$failed" = 0 ]
