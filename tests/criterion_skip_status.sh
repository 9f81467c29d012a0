#!/usr/bin/env bash
# tests/criterion_main.c: a Criterion program whose selected tests all skipped (here: none
# selected) exits 77, meson's SKIP, instead of 0 ("OK", "Skipped: 0"); one that passed a test
# exits 0. Arg: a Criterion test program (test_conv_graph).
set -uo pipefail
exe="$1"
"$exe" --filter 'no_such_suite/*' >/dev/null 2>&1
rc=$?
[ $rc -eq 77 ] || { echo "FAIL: nothing ran, exit $rc (want 77)"; exit 1; }
"$exe" --filter 'conv_graph/alignment_of_addresses' >/dev/null 2>&1
rc=$?
[ $rc -eq 0 ] || { echo "FAIL: a passing test, exit $rc (want 0)"; exit 1; }
echo "ok: nothing run -> 77, a passing test -> 0"
