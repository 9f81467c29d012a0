#!/usr/bin/env bash
# --resume (a slice of Fashion-MNIST):
#  1. a run resumed from a checkpoint saved after epoch 1 ends with the same numbers as an
#     uninterrupted run with the same seed (MLP and CNN), also with the run's flags left out
#     (they are the checkpoint's);
#  2. flags given with --resume take effect (--lr, --loss-scale, --growth-interval; --json
#     shows what ran) or are refused naming the flag and the checkpoint's value (--seed,
#     --amp, --schedule, a one-cycle schedule of another length);
#  3. a checkpoint holding inf/NaN state or optimizer hyper-parameters out of range is
#     refused, naming the tensor and element or the key;
#  4. --log goes on after the interrupted run's lines;
#  5. (in 1) --amp fp8: the resumed run's final checkpoint is the uninterrupted run's, byte for
#     byte, its FP8 recipe taken from the checkpoint.
set -uo pipefail
train="$1"
. "$(dirname "$0")/cli_checks.sh" # run, one_line, json, check
pick() { tail -n 1 "$tmp/out" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["test_acc"], d["final_loss"])'; }
same() { [ "$1" = "$2" ] || { echo "  uninterrupted [$1], resumed [$2]"; return 1; }; }

# --- 1. 512 images, batch 64: 8 steps per epoch
data_flags=(--data "$data" --limit 512 --test-limit 500 --json --quiet)
for model in mlp cnn; do
    common=("${data_flags[@]}" --model "$model" --batch 64 --seed 7)
    check "$model uninterrupted" run 0 "$train" "${common[@]}" --epochs 2
    full=$(pick)
    check "$model save" run 0 "$train" "${common[@]}" --epochs 1 --save "$tmp/$model.safetensors"
    check "$model resumed" run 0 "$train" "${common[@]}" --epochs 2 --resume "$tmp/$model.safetensors"
    check "$model: same end" same "$full" "$(pick)"
    [ "$model" = mlp ] && full_mlp=$full
done
# fp8: the FP8 layers' scaling state (amax histories, scales) is in the checkpoint, so a resumed
# run ends bit for bit where the uninterrupted one does: the two final checkpoints (weights,
# optimizer, histories) are the same file. A history of 3 steps rolls over within the run.
for fp8 in "mlp --fp8-history 3" "cnn --fp8-recipe current --fp8-format e4m3"; do
    set -- $fp8
    common=("${data_flags[@]}" --model "$@" --amp fp8 --batch 64 --seed 7)
    check "fp8 $fp8 uninterrupted" run 0 "$train" "${common[@]}" --epochs 2 --save "$tmp/fp8_full.st"
    check "  json: fp8 recipe" json 'd["amp_mode"] == "fp8" and d["fp8_recipe"] in ("delayed", "current") and d["saturated"] >= 0'
    check "fp8 $fp8 save" run 0 "$train" "${common[@]}" --epochs 1 --save "$tmp/fp8_half.st"
    # the flags left out (batch, seed, amp, the fp8 recipe) are the checkpoint's
    check "fp8 $fp8 resumed" run 0 "$train" "${data_flags[@]}" --model "$1" --epochs 2 \
        --resume "$tmp/fp8_half.st" --save "$tmp/fp8_resumed.st"
    check "  the same final checkpoint, bit for bit" cmp "$tmp/fp8_full.st" "$tmp/fp8_resumed.st"
    check "  the scaling state is in it" grep -Eq "fp8\.[0-9.]+amax_history" "$tmp/fp8_full.st"
done
set -- "$train"
# A 2-epoch run stopped in epoch 2 (the trainer's test hook fails step 10) leaves its epoch-1
# checkpoint; resumed with only the data flags, it continues with seed 7, batch 64, 2 epochs.
mlp=("${data_flags[@]}" --model mlp)
check "interrupted" run 1 env NANOAMP_TEST_FAIL_STEP=10 "$train" "${mlp[@]}" --batch 64 --seed 7 \
    --epochs 2 --save "$tmp/cut.safetensors"
check "resumed, flags left out" run 0 "$train" "${mlp[@]}" --resume "$tmp/cut.safetensors"
check "  same end" same "$(run 0 "$train" "${mlp[@]}" --batch 64 --seed 7 --epochs 2 && pick)" \
    "$(run 0 "$train" "${mlp[@]}" --resume "$tmp/cut.safetensors" && pick)"
check "  json: the saved run's flags" json 'd["seed"] == 7 and d["batch"] == 64 and d["epochs"] == 2'

# --- 2. flags given with --resume: effect, or refusal naming the checkpoint's value
ck="$tmp/mlp.safetensors" # seed 7, SGD lr 0.05, 1 epoch of 2
resume=("${mlp[@]}" --batch 64 --epochs 2 --resume "$ck")
check "--lr on resume" run 0 "$train" "${resume[@]}" --lr 0.2
check "  json: lr 0.2" json 'd["lr"] == 0.2'
check "  another end" bash -c "[ '$(pick)' != '$full_mlp' ]"
check "--weight-decay on resume" run 0 "$train" "${resume[@]}" --weight-decay 0.01
check "  json: weight_decay 0.01" json 'd["weight_decay"] == 0.01'
check "no --lr on resume" run 0 "$train" "${resume[@]}"
check "  json: the checkpoint's lr" json 'd["lr"] == 0.05'
check "--seed on resume" run 1 "$train" "${resume[@]}" --seed 5
check "  message" one_line "--resume .*mlp.safetensors: --seed 5: the checkpoint's run has seed 7"
check "--seed as saved" run 0 "$train" "${resume[@]}" --seed 7
check "--schedule on resume" run 1 "$train" "${resume[@]}" --schedule onecycle
check "  message" one_line "--schedule onecycle: the checkpoint's run has --schedule constant"
# fp16: the scaler's state cannot be dropped; --loss-scale and --growth-interval take effect
fp16=("${mlp[@]}" --batch 64 --seed 3)
check "fp16 save" run 0 "$train" "${fp16[@]}" --epochs 1 --amp fp16 --save "$tmp/fp16.safetensors"
for amp in bf16 off o2; do
    check "fp16 checkpoint under --amp $amp" run 1 "$train" "${fp16[@]}" --epochs 2 --amp "$amp" \
        --resume "$tmp/fp16.safetensors"
    check "  message" one_line "trained with --amp fp16 and this run has --amp $amp"
done
check "fp16 resumed, --amp left out" run 0 "$train" "${fp16[@]}" --epochs 2 --resume "$tmp/fp16.safetensors"
check "  json: fp16" json 'd["amp"] == "fp16" and d["final_scale"] == 65536'
check "--loss-scale 1024 on resume" run 0 "$train" "${fp16[@]}" --epochs 2 --loss-scale 1024 \
    --resume "$tmp/fp16.safetensors"
check "  json: scale 1024" json 'd["final_scale"] == 1024'
check "--growth-interval 1 on resume" run 0 "$train" "${fp16[@]}" --epochs 2 --growth-interval 1 \
    --resume "$tmp/fp16.safetensors"
check "  json: the scale moved" json 'd["skipped_steps"] > 0 or d["final_scale"] > 65536'
# the one-cycle schedule spans the saved run: another length is refused
oc=("${mlp[@]}" --batch 64 --schedule onecycle)
check "onecycle interrupted" run 1 env NANOAMP_TEST_FAIL_STEP=10 "$train" "${oc[@]}" --epochs 2 \
    --save "$tmp/oc.safetensors"
check "onecycle --epochs 3" run 1 "$train" "${oc[@]}" --epochs 3 --resume "$tmp/oc.safetensors"
check "  message" one_line "--epochs 3: the checkpoint's one-cycle schedule spans 2 epochs"
check "onecycle --batch 32" run 1 "$train" "${oc[@]}" --batch 32 --resume "$tmp/oc.safetensors"
check "  message" one_line "one-cycle schedule has 8 steps per epoch and this run 16"
check "onecycle as saved" run 0 "$train" "${oc[@]}" --resume "$tmp/oc.safetensors"

# --- 3. a checkpoint with one value changed (TENSOR ELEMENT VALUE)
poke() { # SRC OUT TENSOR ELEMENT VALUE
    python3 - "$@" <<'EOF'
import json, struct, sys
src, out, name, k, v = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
raw = bytearray(open(src, "rb").read())
n = struct.unpack("<Q", raw[:8])[0]
e = json.loads(raw[8:8 + n])[name]
fmt = {"F32": "<f", "F64": "<d"}[e["dtype"]]
struct.pack_into(fmt, raw, 8 + n + e["data_offsets"][0] + k * struct.calcsize(fmt), v)
open(out, "wb").write(raw)
EOF
}
cnn=("${data_flags[@]}" --model cnn --batch 64 --seed 7 --epochs 2)
check "o2 save" run 0 "$train" "${cnn[@]}" --epochs 1 --amp o2 --save "$tmp/o2.safetensors"
for c in "cnn 0.0.weight 5 nan" "cnn 1.1.running_var 3 inf" "cnn optim.state.2.momentum_buffer 7 -inf" \
         "o2 fp16.fp32_from_fp16.3 1 nan"; do
    set -- $c
    poke "$tmp/$1.safetensors" "$tmp/bad.safetensors" "$2" "$3" "$4"
    check "$2 $4" run 1 "$train" "${cnn[@]}" --amp "$([ "$1" = o2 ] && echo o2 || echo off)" \
        --resume "$tmp/bad.safetensors"
    check "  message" one_line "--resume .*bad.safetensors: .*tensor '$2' holds $4 at element $3 "
done
for c in "group.0.momentum 3e38 invalid momentum 3e\+38" "group.0.momentum inf invalid momentum inf" \
         "group.0.weight_decay inf invalid weight_decay inf" \
         "group.0.initial_lr nan invalid initial learning rate nan"; do
    set -- $c
    key=optim.$1
    poke "$tmp/cnn.safetensors" "$tmp/bad.safetensors" "$key" 0 "$2"
    check "$key $2" run 1 "$train" "${cnn[@]}" --resume "$tmp/bad.safetensors"
    shift 2
    check "  message" one_line "--resume .*bad.safetensors: $key: $*"
done

# --- 4. --log on resume goes on after the interrupted run's 8 lines
check "logged run" run 0 "$train" "${mlp[@]}" --batch 64 --epochs 1 --log "$tmp/log.csv" \
    --save "$tmp/logged.safetensors"
check "resumed with --log" run 0 "$train" "${mlp[@]}" --epochs 2 --log "$tmp/log.csv" \
    --resume "$tmp/logged.safetensors"
check "  one header, 16 steps" python3 - "$tmp/log.csv" <<'EOF'
import sys
lines = open(sys.argv[1]).read().splitlines()
steps = [int(l.split(",")[0]) for l in lines[1:]]
sys.exit(0 if lines[0].startswith("step,") and steps == list(range(16)) else f"log: {lines}")
EOF

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
