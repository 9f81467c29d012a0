#!/usr/bin/env bash
# The trainers given bad inputs: each case must exit with the right status, say once what was
# wrong (naming the file, key or flag), never crash or leak (run under ASan by scripts/run-tests),
# and with --json print a last line of strict JSON (no NaN or Infinity).
# usage: trainer_errors.sh MNIST_TRAIN CIFAR_TRAIN
set -uo pipefail
mnist="$1" cifar="$2"
. "$(dirname "$0")/cli_checks.sh" # run, one_line, json, check

# A small MNIST-format data set (IDX files): N images of HxW, labels 0..9.
make_idx() { # DIR PREFIX N H W [PIXEL: every pixel this value, else random]
    python3 - "$@" <<'EOF'
import os, struct, sys, random
d, prefix, n, h, w, *pixel = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
os.makedirs(d, exist_ok=True)
r = random.Random(n * h * w)
px = (lambda: pixel[0]) if pixel else (lambda: r.randrange(256))
with open(f"{d}/{prefix}-images-idx3-ubyte", "wb") as f:
    f.write(struct.pack(">IIII", 0x803, n, h, w) + bytes(px() for _ in range(n * h * w)))
with open(f"{d}/{prefix}-labels-idx1-ubyte", "wb") as f:
    f.write(struct.pack(">II", 0x801, n) + bytes(i % 10 for i in range(n)))
EOF
}
make_idx "$tmp/small" train 256 28 28; make_idx "$tmp/small" t10k 100 28 28
make_idx "$tmp/wide_train" train 256 56 14; make_idx "$tmp/wide_train" t10k 100 28 28
make_idx "$tmp/wide_test" train 256 28 28; make_idx "$tmp/wide_test" t10k 100 56 14
small=(--data "$tmp/small" --model mlp --batch 32 --epochs 1)

# --- 1. failed --resume: exit 1, one message, no crash, nothing left running or leaked.
# The full data set (not the small one) keeps the batcher's prefetch busy while main exits.
run 0 "$mnist" "${small[@]}" --quiet --save "$tmp/mlp.safetensors"
head -c 3000 "$tmp/mlp.safetensors" >"$tmp/truncated.safetensors"
real=(--data "$data" --limit 512 --test-limit 64 --model mlp)
for i in $(seq 20); do
    check "resume missing ($i)" run 1 "$mnist" "${real[@]}" --resume "$tmp/nope.safetensors"
    check "  message" one_line "--resume .*nope.safetensors"
    check "resume truncated ($i)" run 1 "$mnist" "${real[@]}" --resume "$tmp/truncated.safetensors"
    check "  message" one_line "--resume .*truncated.safetensors"
    check "resume other model ($i)" run 1 "$mnist" "${real[@]/mlp/cnn}" --resume "$tmp/mlp.safetensors"
    check "  message" one_line "--resume .*mlp.safetensors"
done
check "resume other optimizer" run 1 "$mnist" "${real[@]}" --optim adamw --resume "$tmp/mlp.safetensors"
check "  message" one_line "--resume .*mlp.safetensors"
for i in 1 2 3; do
    check "cifar resume missing ($i)" run 1 "$cifar" --synthetic 256 --limit 256 --epochs 1 --batch 32 --resume "$tmp/nope.safetensors"
    check "  message" one_line "--resume .*nope.safetensors"
done

# --- every early exit frees what was made (a leak fails here under ASan)
mkdir -p "$tmp/train_only"; cp "$tmp/small"/train-* "$tmp/train_only/"
check "no test files" run 1 "$mnist" --data "$tmp/train_only" --model mlp
check "  message" grep -q "t10k-images" "$tmp/err"
check "  nothing leaked" bash -c "! grep -q Sanitizer '$tmp/err'"

# --- 7. checkpoint metadata parsed strictly, the message names the file and the key
python3 - "$tmp/mlp.safetensors" "$tmp" <<'EOF'
import json, struct, sys
src, out = sys.argv[1], sys.argv[2]
raw = open(src, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header, data = json.loads(raw[8:8 + n]), raw[8 + n:]
cases = {"neg": ("epochs_done", "-5"), "abc": ("epochs_done", "abc"), "empty": ("epochs_done", ""),
         "frac": ("epochs_done", "1.5"), "huge": ("epochs_done", "99999999999999999999"),
         "space": ("epochs_done", " 1"), "seed": ("seed", "abc"), "offset": ("rng_offset", "-1")}
for name, (key, value) in cases.items():
    h = dict(header); h["__metadata__"] = dict(header["__metadata__"], **{key: value})
    text = json.dumps(h).encode(); text += b" " * (-len(text) % 8)
    open(f"{out}/meta_{name}.safetensors", "wb").write(struct.pack("<Q", len(text)) + text + data)
EOF
for c in neg:epochs_done abc:epochs_done empty:epochs_done frac:epochs_done huge:epochs_done \
         space:epochs_done seed:seed offset:rng_offset; do
    check "metadata ${c%%:*}" run 1 "$mnist" "${small[@]}" --resume "$tmp/meta_${c%%:*}.safetensors"
    check "  message" one_line "meta_${c%%:*}.safetensors.*'${c#*:}'"
done

# --- 2, 6. images of another shape than the model takes: refused before training, once
check "train images 56x14" run 1 "$mnist" --data "$tmp/wide_train" --model mlp --epochs 1
check "  message" one_line "training images are 1x56x14.*mlp takes 1x28x28"
check "test images 56x14" run 1 "$mnist" --data "$tmp/wide_test" --model cnn --epochs 1 --json
check "  message" one_line "test images are 1x56x14.*cnn takes 1x28x28"

# --- 3. non-finite numbers: null in the JSON; divergence exits 1 and says at which step
check "diverging run" run 1 "$mnist" "${small[@]}" --lr 1e30 --json --quiet
check "  message" one_line "training diverged at step [0-9]+"
check "  json" json 'd["final_loss"] is None and d["diverged_at_step"] >= 1'
# the first non-finite step exactly, though the loss is read at steps 1, 8 (the last) only:
# step 1's update (lr 1e30) makes step 2's loss inf or NaN
check "  the first step" one_line "training diverged at step 2 \(its loss was inf or nan\)"
check "  json: step 2" json 'd["diverged_at_step"] == 2'
# the last update diverges (one step): no loss is read after it, the test loss says so
check "diverging last update" run 1 "$mnist" "${small[@]}" --limit 32 --lr 1e30 --json --quiet
check "  message" one_line "training diverged at step 1 \(the test loss after it is (nan|infinite)\)"
check "  json" json 'd["test_loss"] is None and d["diverged_at_step"] == 1'
check "nothing left to train" run 0 "$mnist" "${small[@]}" --quiet --json --resume "$tmp/mlp.safetensors"
check "  json" json 'd["final_loss"] is None and 0 <= d["test_acc"] <= 1 and d["test_loss"] > 0'

# --- 12. fp16 with a static scale that overflows: the steps are skipped, the loss stays finite
check "fp16 static scale 1e30" run 0 "$mnist" "${small[@]}" --quiet --json --amp fp16 --loss-scale 1e30
check "  json" json 'd["skipped_steps"] > 0 and d["final_loss"] > 0 and d["final_scale"] == 1.00000002e30'
check "fp16 --growth-interval 1" run 0 "$mnist" "${small[@]}" --quiet --json --amp fp16 --growth-interval 1
check "  json" json 'd["skipped_steps"] > 0 or d["final_scale"] > 65536'

# --- 5. the command line
check "unknown option" run 2 "$mnist" --foo
check "  message" one_line "unknown option --foo"
check "empty seed" run 2 "$mnist" "${small[@]}" --seed ""
check "  message" one_line "--seed"
for flag in --epochs --batch --lr --limit --weight-decay --loss-scale --growth-interval; do
    check "empty $flag" run 2 "$mnist" "${small[@]}" "$flag" ""
    check "  message" one_line -- "$flag"
done
check "seed 1x" run 2 "$mnist" "${small[@]}" --seed 1x
check "  message" one_line "--seed: expected an integer"
for v in 0 -1 2x; do
    check "--dist-timeout $v" run 2 "$mnist" "${small[@]}" --dist-timeout "$v"
    check "  message" one_line "^mnist-train: --dist-timeout: expected seconds in \(0, 1e9\], got '$v'"
done
check "NANOAMP_DIST_TIMEOUT_S=soon" run 1 env NANOAMP_DIST_TIMEOUT_S=soon "$mnist" "${small[@]}"
check "  message" one_line "na_dist_init: NANOAMP_DIST_TIMEOUT_S=soon: expected a number of seconds > 0"
check "--no-broadcast-buffers takes no value" run 2 "$mnist" "${small[@]}" --no-broadcast-buffers=1
check "  message" one_line "--no-broadcast-buffers takes no value"
check "version" run 0 "$mnist" --version
check "  output" grep -Eq "^mnist-train \(nanoamp [0-9]+\.[0-9]+\.[0-9]+\)$" "$tmp/out"
check "cifar help" run 0 "$cifar" --help
for want in "--batch N .*default: 512" "--synthetic N" "--lr X .*default: 0.2" \
            "--weight-decay X .*default: 0.0005" "--label-smoothing X .*default: 0.2" \
            "--schedule .*default: onecycle" "--growth-interval N .*default: 2000" "--version"; do
    check "  cifar help: $want" grep -Eq -- "$want" "$tmp/out"
done
check "mnist help" run 0 "$mnist" --help
for want in "--lr X .*0.05 with sgd, 0.001 with adamw" "--weight-decay X .*0 with sgd, 0.01 with adamw"; do
    check "  mnist help: $want" grep -Eq -- "$want" "$tmp/out"
done
# --cuda-graph replays the CUDA stream: on the cpu it is a flag error, whatever the order
check "cuda-graph on cpu" run 2 "$mnist" "${small[@]}" --cuda-graph
check "  message" one_line "mnist-train: --cuda-graph needs --device cuda"
check "cuda-graph before --device cpu" run 2 "$cifar" --cuda-graph --device cpu --synthetic 64
check "  message" one_line "cifar-train: --cuda-graph needs --device cuda"
check "cuda-graph takes no value" run 2 "$mnist" "${small[@]}" --cuda-graph=1
check "  message" one_line -- "--cuda-graph takes no value"
check "mnist has no --synthetic" run 2 "$mnist" --synthetic 64
check "unwritable --log" run 1 "$mnist" "${small[@]}" --log "$tmp/no/dir/log.csv"
check "  message" one_line "--log.*no/dir/log.csv"
check "--log a directory" run 1 "$mnist" "${small[@]}" --log "$tmp"
check "  message" one_line "--log: .*'$tmp': Is a directory"
check "--log /dev/full" run 1 "$mnist" "${small[@]}" --log /dev/full
check "  message" one_line "--log: .*'/dev/full': No space left on device"
# a log that fills up mid-run (a file-size limit, as a full disk) stops the run, exit 1
check "--log filling up" run 1 bash -c 'trap "" XFSZ; ulimit -f 4; exec "$@"' _ "$mnist" \
    --data "$data" --limit 2048 --test-limit 64 --model mlp --batch 8 --epochs 1 --quiet --log "$tmp/full.csv"
check "  message" one_line "--log: .*full.csv': File too large"
check "unwritable --save" run 1 "$mnist" "${small[@]}" --save "$tmp/no/dir/ck.safetensors"
check "  refused before training" one_line "--save .*no/dir/ck.safetensors"
check "--save a directory" run 1 "$mnist" "${small[@]}" --save "$tmp"
check "  message" one_line "--save .*directory"
# --- 8. a save cut short by a file-size limit: a clean error naming the file (not death by
# SIGXFSZ), the old checkpoint intact; a stale temporary of a killed save is removed by the next.
cp "$tmp/mlp.safetensors" "$tmp/keep.safetensors"
check "--save under ulimit -f" run 1 bash -c 'ulimit -f 64; exec "$@"' _ "$mnist" "${small[@]}" --quiet --save "$tmp/keep.safetensors"
check "  message" one_line "keep.safetensors.*EFBIG"
check "  old checkpoint intact" cmp -s "$tmp/mlp.safetensors" "$tmp/keep.safetensors"
check "  no temporary left" bash -c "! ls '$tmp'/keep.safetensors.tmp.* 2>/dev/null"
sh -c 'exit 0' & dead=$!; wait $dead
head -c 100000 /dev/zero >"$tmp/keep.safetensors.tmp.$dead"
check "save after a killed save" run 0 "$mnist" "${small[@]}" --quiet --save "$tmp/keep.safetensors"
check "  stale temporary removed" test ! -e "$tmp/keep.safetensors.tmp.$dead"
# scaling flags the mode would ignore: a bad command line (exit 2, as the README says)
for mode in bf16 off; do
    check "--loss-scale with $mode" run 2 "$mnist" "${small[@]}" --amp "$mode" --loss-scale 128
    check "  message" one_line "--loss-scale applies to --amp fp16 and o2"
    check "--growth-interval with $mode" run 2 "$mnist" "${small[@]}" --amp "$mode" --growth-interval 10
    check "  message" one_line "--growth-interval applies to --amp fp16 and o2"
done
# --amp fp8: no loss scaling; its flags only with it; bad recipe values (both trainers)
check "--loss-scale with fp8" run 2 "$mnist" "${small[@]}" --amp fp8 --loss-scale 128
check "  message" one_line "--loss-scale applies to --amp fp16 and o2 only \\(--amp fp8 has no loss scaling\\)"
for prog in "$mnist" "$cifar"; do
    name=$(basename "$prog")
    check "$name --fp8-history 0" run 2 "$prog" --amp fp8 --fp8-history 0
    check "  message" one_line "$name: --fp8-history: expected an integer in \\[1, 2\\^24\\].*got '0'"
    check "$name --fp8-margin -1" run 2 "$prog" --amp fp8 --fp8-margin -1
    check "  message" one_line "$name: --fp8-margin: expected an integer in \\[0, 64\\].*got '-1'"
    check "$name --fp8-recipe bogus" run 2 "$prog" --amp fp8 --fp8-recipe bogus
    check "  message" one_line "--fp8-recipe: expected delayed\\|current, got 'bogus'"
    check "$name --fp8-format e5m2" run 2 "$prog" --amp fp8 --fp8-format e5m2
    check "  message" one_line "--fp8-format: expected hybrid\\|e4m3, got 'e5m2'"
done
check "--fp8-recipe with bf16" run 2 "$mnist" "${small[@]}" --amp bf16 --fp8-recipe current
check "  message" one_line "--fp8-recipe applies to --amp fp8 only"
check "--fp8-history with current" run 2 "$mnist" "${small[@]}" --amp fp8 --fp8-recipe current --fp8-history 16
check "  message" one_line "--fp8-history applies to --fp8-recipe delayed"
# an FP8 dtype where the trainer sums gradients: named as such
check "--allreduce-dtype f8e4m3" run 2 "$mnist" "${small[@]}" --allreduce-dtype f8e4m3
check "  message" one_line "--allreduce-dtype: expected f32, f16 or bf16 \\(an FP8 dtype .*got 'f8e4m3'"
check "fp8 trains" run 0 "$mnist" "${small[@]}" --quiet --json --amp fp8 --fp8-margin 2
check "  json" json 'd["fp8_recipe"] == "delayed" and d["fp8_format"] == "hybrid" and d["saturated"] >= 0'
check "--growth-interval with a static scale" run 2 "$mnist" "${small[@]}" --amp fp16 --loss-scale 128 --growth-interval 10
check "  message" one_line "--growth-interval"
# a flag after a flag that takes a value is no value
check "--data --epochs 1" run 2 "$mnist" --data --epochs 1
check "  message" one_line "mnist-train: --data needs a value, not the flag --epochs"
check "--data=--x is a value" run 1 "$mnist" --data=--x --epochs 1 --model mlp
check "  message" grep -q -- "'--x/train-images-idx3-ubyte'" "$tmp/err"
# --weight-decay 0 is a value, not "the default": AdamW without decay differs from AdamW's 0.01
loss_of() {
    run 0 "$mnist" "${small[@]}" --quiet --json --optim adamw --lr 0.05 "$@" &&
        tail -n 1 "$tmp/out" | python3 -c 'import json, sys; print(json.load(sys.stdin)["final_loss"])'
}
wd0=$(loss_of --weight-decay 0) wd_default=$(loss_of --weight-decay 0.01)
check "--weight-decay 0 honoured" test "$wd0" != "$wd_default"

# --- messages (#24 item 20)
rc=0; "$mnist" "${small[@]}" --device cuda --quiet >"$tmp/out" 2>"$tmp/err" || rc=$?
check "--device cuda without a GPU names --device" bash -c "[ $rc = 0 ] || grep -q -- '--device cuda: ' '$tmp/err'"
mkdir -p "$tmp/cut"; cp "$tmp/small"/* "$tmp/cut/"
head -c 5000 "$tmp/small/train-images-idx3-ubyte" >"$tmp/cut/train-images-idx3-ubyte"
check "truncated data" run 1 "$mnist" --data "$tmp/cut" --model mlp
check "  no hint where to put files" one_line "cut/train-images-idx3-ubyte"
check "missing data" run 1 "$mnist" --data "$tmp/none" --model mlp
check "  where to get them" grep -q "apt-get install dataset-fashion-mnist" "$tmp/err"
mkdir -p "$tmp/cifar/data_batch_1.bin"; touch "$tmp"/cifar/{data_batch_{2..5},test_batch}.bin
check "cifar: a directory for a data file" run 1 "$cifar" --data "$tmp/cifar" --epochs 1
check "  named for what it is" grep -q "data_batch_1.bin' is a directory, not a regular file" "$tmp/err"
check "  not 'missing'" bash -c "! grep -q missing '$tmp/err'"
check "cifar: missing data" run 1 "$cifar" --data "$tmp/none" --epochs 1
check "  mentions --synthetic" grep -q -- "--synthetic N" "$tmp/err"
check "cifar: --synthetic with --data" run 2 "$cifar" --synthetic 64 --data "$tmp/none"
check "  message" one_line "cifar-train: --synthetic .* no --data"
check "nothing left to train, not quiet" run 0 "$mnist" "${small[@]}" --resume "$tmp/mlp.safetensors"
check "  no nan images/s" bash -c "grep -q 'nothing trained' '$tmp/out' && ! grep -q nan '$tmp/out'"
make_idx "$tmp/flat" train 256 28 28 7; make_idx "$tmp/flat" t10k 100 28 28
check "constant training images" run 0 "$mnist" --data "$tmp/flat" --model mlp --batch 32 --epochs 1
check "  a warning" grep -q "warning: channel 0 of the training images is constant" "$tmp/err"
# Ctrl-C: the step under way ends, a line says where, exit 130 (python: a child it starts has
# SIGINT at its default, a background job of this script would ignore it). An idle machine runs
# an epoch of 7500 MLP steps in under 3 s: the run is 100 epochs long, so the signal always
# finds it training, in whichever epoch.
check "Ctrl-C" python3 - "$mnist" "$data" <<'EOF'
import re, signal, subprocess, sys, time
p = subprocess.Popen([sys.argv[1], "--data", sys.argv[2], "--model", "mlp", "--batch", "8",
                      "--epochs", "100", "--limit", "60000", "--test-limit", "64"],
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
time.sleep(3)
p.send_signal(signal.SIGINT)
out, err = p.communicate(timeout=60)
lines = [l for l in err.splitlines() if "interrupted" in l]
ok = (p.returncode == 130 and len(lines) == 1 and
      re.search(r"interrupted at epoch [0-9]+, step [0-9]+ of 7500$", lines[0]) is not None)
if not ok: print("  exit", p.returncode, "stderr:", err[-500:])
sys.exit(0 if ok else 1)
EOF

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
