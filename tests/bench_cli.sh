#!/usr/bin/env bash
# The benchmark programs given bad arguments: each exits 2 (1 for a run that fails) with one
# message, and na-kbench checks every argument before it runs any case (a typo at the end of a
# long command costs no benchmark time). A one-repeat kernel case runs and prints JSON lines.
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
echo "bench_cli: $passed passed, $failed failed"
[ "$failed" = 0 ]
