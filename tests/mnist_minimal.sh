#!/usr/bin/env bash
# mnist-minimal writes mnist-train's fp16 training step out in the open; both must end on the
# same loss and test accuracy, to the printed digit, for the same data, seed and batch, so
# that the copyable loop and the trainers' shared recipe (examples/common/amp_step.c) cannot
# drift apart.
set -euo pipefail
minimal="$1" train="$2"
data="${NANOAMP_TEST_MNIST:-/usr/share/datasets/fashion-mnist}"
if [ ! -f "$data/train-images-idx3-ubyte.gz" ] && [ ! -f "$data/train-images-idx3-ubyte" ]; then
    echo "no MNIST-format data in $data: skipping"; exit 77
fi
# out of the box: both choose OpenBLAS's kernels the same way (blas_tune_reexec), so no
# NANOAMP_NO_BLAS_TUNE here
unset NANOAMP_NO_BLAS_TUNE OPENBLAS_CORETYPE
out=$("$minimal" "$data" 2048 1000)
echo "mnist-minimal: $out"
want=$("$train" --data "$data" --model mlp --amp fp16 --epochs 1 --batch 128 --seed 1 --limit 2048 \
    --test-limit 1000 --json --quiet | tail -n 1 | python3 -c 'import json,sys
d = json.load(sys.stdin)
print("final loss %.6f, test accuracy %.4f, loss scale %g" % (d["final_loss"], d["test_acc"], d["final_scale"]))')
echo "mnist-train:   $want"
[ "$out" = "$want" ] || { echo "FAIL: the open loop and the trainer differ"; echo "0 passed, 1 failed"; exit 1; }
# a limit that is not a number, too many arguments, or an option (mnist-train's --data): exit 2
# with a message, no training
for bad in "$data abc" "$data 10 10 10" "--data $data"; do
    rc=0; "$minimal" $bad >/dev/null 2>"${TMPDIR:-/tmp}/mnist-minimal.err" || rc=$?
    if [ "$rc" != 2 ]; then echo "FAIL: '$bad' gave exit $rc, wanted 2"; echo "1 passed, 1 failed"; exit 1; fi
done
grep -q "unknown option '--data'" "${TMPDIR:-/tmp}/mnist-minimal.err" ||
    { echo "FAIL: --data is not named"; cat "${TMPDIR:-/tmp}/mnist-minimal.err"; echo "1 passed, 1 failed"; exit 1; }
echo "2 passed, 0 failed"
