#!/usr/bin/env bash
# --amp-trace's backward rows (docs/mixed-precision.md, lesson 5): the guide's block for the
# MNIST MLP is what mnist-train prints, byte for byte, for the command the guide names (run on
# the test data with --quiet, which changes no trace line); the rows follow the forward's under
# one "backward" line; with the default dynamic scale no row has a subnormal, as the guide
# says; cifar-train prints them too.
# usage: trainer_amp_trace.sh MNIST_TRAIN CIFAR_TRAIN GUIDE
set -uo pipefail
mnist="$1" cifar="$2" guide="$3"
. "$(dirname "$0")/cli_checks.sh" # run, check

# the guide's command (in backticks on one line) and the first fenced block after it
cmd=$(grep -o 'build/examples/mnist-train --model mlp [^`]*--amp-trace' "$guide" | head -n 1)
read -ra flags <<<"${cmd#build/examples/mnist-train }"
quoted() { awk -v cmd="$cmd" 'index($0, cmd) { found = 1 }
    found && /^```/ { if (open) exit; open = 1; next } open' "$guide"; }
# the trace's lines from "amp: backward" on
backward() { sed -n '/^amp: backward$/,$p' "$tmp/err" | grep '^amp: '; }

check "the guide names the command" test -n "$cmd"
check "the guide's command runs" run 0 "$mnist" "${flags[@]}" --data "$data" --quiet
backward >"$tmp/rows"
if ! cmp -s <(quoted) "$tmp/rows"; then
    fail "the guide's block is not what mnist-train prints (< guide, > program):"
    diff <(quoted) "$tmp/rows" | sed 's/^/  | /'
fi
check "  one backward line, after the forward's" \
    test "$(grep -n '^amp: ' "$tmp/err" | grep -c ':amp: backward$')" = 1 -a \
    "$(grep -m 1 -n '^amp: backward$' "$tmp/err" | cut -d: -f1)" -gt 1
check "  a row per node" test "$(grep -vc '^amp: backward$' "$tmp/rows")" -ge 10
check "  every row a gradient" test -z "$(grep -v '^amp: backward$' "$tmp/rows" | grep -v ' grad ')"

# the default dynamic scale (2^16): no subnormal left in any row
unscaled=() skip=0
for f in "${flags[@]}"; do
    if [ "$skip" = 1 ]; then skip=0; continue; fi
    if [ "$f" = --loss-scale ]; then skip=1; continue; fi
    unscaled+=("$f")
done
check "scaled" run 0 "$mnist" "${unscaled[@]}" --data "$data" --quiet
backward >"$tmp/scaled"
check "  the rows" grep -q '^amp: linear .*grad f16' "$tmp/scaled"
check "  no subnormal" test -z "$(grep ' grad ' "$tmp/scaled" | grep -v 'subnormal   0\.00%')"

check "cifar-train" run 0 "$cifar" --synthetic 64 --limit 32 --test-limit 32 --batch 32 --epochs 1 \
    --amp fp16 --quiet --amp-trace
check "  its backward rows" grep -Eq '^amp: conv2d +grad f16 +\[32,' "$tmp/err"

echo "passed $passed, failed $failed"
[ "$failed" = 0 ]
