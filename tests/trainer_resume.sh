#!/usr/bin/env bash
# A run resumed from a checkpoint saved after epoch 1 ends with the same numbers as an
# uninterrupted run with the same seed (MLP and CNN on a slice of Fashion-MNIST).
set -euo pipefail
train="$1"
data="${NANOAMP_TEST_MNIST:-/usr/share/datasets/fashion-mnist}"
if [ ! -f "$data/train-images-idx3-ubyte.gz" ] && [ ! -f "$data/train-images-idx3-ubyte" ]; then
    echo "no MNIST-format data in $data: skipping"; exit 77
fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export NANOAMP_NO_BLAS_TUNE=1
pick() { tail -n 1 | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["test_acc"], d["final_loss"])'; }
for model in mlp cnn; do
    common=(--data "$data" --model "$model" --limit 512 --test-limit 500 --batch 64 --seed 7 --json --quiet)
    full=$("$train" "${common[@]}" --epochs 2 | pick)
    "$train" "${common[@]}" --epochs 1 --save "$tmp/ck.safetensors" >/dev/null
    resumed=$("$train" "${common[@]}" --epochs 2 --resume "$tmp/ck.safetensors" | pick)
    echo "$model: uninterrupted [$full], resumed [$resumed]"
    [ "$full" = "$resumed" ] || { echo "FAIL: resumed run differs"; exit 1; }
done
echo "1 passed, 0 failed"
