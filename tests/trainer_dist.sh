#!/usr/bin/env bash
# mnist-train under mpirun -np 2 (data parallel, docs/distributed.md):
#  1. every --amp mode runs; rank 0 alone prints one strict JSON line, with world_size 2;
#  2. 2 ranks x --batch 64 train the MLP as 1 rank x --batch 128 (same seed, 20 steps): the
#     same losses, accuracy, skipped steps and loss scale, to the tolerance stated below;
#  3. ranks started with different flags stop at start, every rank saying which flag differs;
#  4. --save under 2 ranks leaves exactly one checkpoint, no temporary, and a run resumed from
#     it on 2 ranks ends exactly like an uninterrupted one; resumed on 1 rank it says so; ranks
#     given different checkpoints stop;
#  5. bad flags, missing data and an unwritable --save fail cleanly on 1 and 2 ranks;
#  6. a training step that fails on one rank only ends the job (na_dist_abort), never hangs;
#  7. a failure before training is said once when every rank shares it, tagged when it is one
#     rank's own;
#  8. the CNN's BatchNorm statistics are rank 0's on every rank (broadcast after each step), so
#     the score a 2-rank run reports is its checkpoint's score on one process;
#  9. a rank stopped (SIGSTOP) mid-training makes the other fail after --dist-timeout, naming
#     it, and the job ends.
# usage: trainer_dist.sh MNIST_TRAIN. Skips (77) without mpirun, without data, or when the
# build has no MPI (meson sets NANOAMP_BUILT_WITH_MPI=0).
set -uo pipefail
train="$1"
data="${NANOAMP_TEST_MNIST:-/usr/share/datasets/fashion-mnist}"
command -v mpirun >/dev/null || { echo "no mpirun: skipping"; exit 77; }
if [ ! -f "$data/train-images-idx3-ubyte.gz" ] && [ ! -f "$data/train-images-idx3-ubyte" ]; then
    echo "no MNIST-format data in $data: skipping"; exit 77
fi
[ "${NANOAMP_BUILT_WITH_MPI:-1}" = 1 ] || { echo "built without MPI: skipping"; exit 77; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# one BLAS thread per rank, as the trainers choose under mpirun without NANOAMP_NO_BLAS_TUNE
# (and no BLAS thread still starting when a rank exits at once: ASan then reports the thread's
# start-up allocation as a leak)
export NANOAMP_NO_BLAS_TUNE=1 OPENBLAS_NUM_THREADS=1
# as root, more ranks than cores, sanitized builds
. "$(dirname "$0")/mpi_env.sh"
mpi() { mpirun --oversubscribe --bind-to none -np "$@"; }
passed=0 failed=0
check() { local name=$1; shift; if "$@"; then passed=$((passed + 1)); else echo "FAIL: $name"; failed=$((failed + 1)); fi; }

# run WANT_RC CMD...: stdout, stderr in $tmp/out, $tmp/err; checks the exit status (any
# non-zero status for WANT_RC "fail": mpirun reports a failed rank its own way)
run() {
    local want=$1; shift
    "$@" >"$tmp/out" 2>"$tmp/err"
    local rc=$?
    # a sanitized build (build-asan) reports on stderr, also where a failure is wanted
    if grep -Eq "ERROR: (Address|Leak)Sanitizer|runtime error:" "$tmp/err"; then
        echo "  sanitizer report: $*"; grep -E -A12 "Sanitizer|runtime error:" "$tmp/err" | head -n 40
        return 1
    fi
    if [ "$want" = fail ] && [ "$rc" != 0 ] || [ "$rc" = "$want" ]; then return 0; fi
    echo "  exit $rc, wanted $want: $*"; sed 's/^/  | /' "$tmp/err" | head -n 20; return 1
}
# json EXPR: stdout is exactly one line of strict JSON for which the Python expression EXPR
# holds (d)
json() {
    python3 - "$1" "$tmp/out" <<'EOF'
import json, sys
def bad(x): raise ValueError("not JSON: " + x)
lines = open(sys.argv[2]).read().splitlines()
if len(lines) != 1: sys.exit(f"{len(lines)} lines on stdout, wanted 1 (rank 0's JSON): {lines}")
d = json.loads(lines[0], parse_constant=bad)
sys.exit(0 if eval(sys.argv[1]) else "does not hold: " + sys.argv[1] + " in " + json.dumps(d))
EOF
}
# stderr matches the extended regex on every one of N ranks' lines that name a rank
says() { grep -Eq -- "$1" "$tmp/err" || { echo "  stderr should match /$1/:"; sed 's/^/  | /' "$tmp/err" | head -n 20; return 1; }; }

# --- 1. every amp mode on 2 ranks, and the same run on 1 rank with twice the batch.
# 1280 images: 10 steps of 128 per epoch, 20 in all.
common=(--data "$data" --model mlp --limit 1280 --test-limit 500 --seed 7 --epochs 2 --json --quiet)
for amp in off fp16 bf16 o2; do
    check "2 ranks, --amp $amp" run 0 mpi 2 "$train" "${common[@]}" --batch 64 --amp "$amp"
    check "2 ranks, --amp $amp: JSON" json 'd["world_size"] == 2 and d["batch"] == 64'
    cp "$tmp/out" "$tmp/two-$amp.json"
    check "1 rank, --amp $amp" run 0 "$train" "${common[@]}" --batch 128 --amp "$amp"
    check "1 rank, --amp $amp: JSON" json 'd["world_size"] == 1'
    cp "$tmp/out" "$tmp/one-$amp.json"
done

# --- 2. 2 x 64 against 1 x 128. f32 (off): the two ranks' mean losses averaged and their
# gradients summed in another order than one batch's: rounding only, |diff| <= 2e-5 after 20
# steps. fp16/bf16/o2: each rank rounds its half of the weight gradients to f16/bf16 before
# they are summed: |diff| <= 2e-3. The skip decisions and loss scales must be equal.
compare() { # AMP TOL
    python3 - "$tmp/two-$1.json" "$tmp/one-$1.json" "$2" <<'EOF'
import json, sys
two, one, tol = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), float(sys.argv[3])
print(f"  {two['amp']}: final loss {two['final_loss']} vs {one['final_loss']}, test loss "
      f"{two['test_loss']} vs {one['test_loss']}, accuracy {two['test_acc']} vs {one['test_acc']}, "
      f"skipped {two['skipped_steps']} vs {one['skipped_steps']}")
bad = [k for k in ("final_loss", "test_loss") if abs(two[k] - one[k]) > tol]
bad += [k for k in ("skipped_steps", "final_scale") if two[k] != one[k]]
if abs(two["test_acc"] - one["test_acc"]) > 2 / 500 + 1e-9: bad.append("test_acc")  # 2 images
sys.exit(f"differ beyond {tol}: {bad}" if bad else 0)
EOF
}
check "2x64 = 1x128, off" compare off 2e-5
for amp in fp16 bf16 o2; do check "2x64 = 1x128, $amp" compare "$amp" 2e-3; done

# --- 3. rank 1 with another --lr: both ranks stop at start and say so.
cat >"$tmp/other-lr.sh" <<EOF
#!/usr/bin/env bash
if [ "\${OMPI_COMM_WORLD_RANK:-0}" = 1 ]; then exec "$train" "\$@" --lr 0.1; fi
exec "$train" "\$@"
EOF
chmod +x "$tmp/other-lr.sh"
check "different --lr" run fail mpi 2 "$tmp/other-lr.sh" "${common[@]}" --batch 64
check "different --lr: message" says "rank 1's --lr differs from rank 0's"
check "different --lr: on both ranks" says "\(rank 1\): .*--lr differs"
check "different --lr: no JSON" test ! -s "$tmp/out"

# --- 4. --save on 2 ranks: one file, no temporaries; resume on 2 ranks matches.
mkdir "$tmp/ck"
half=(--data "$data" --model mlp --limit 512 --test-limit 500 --seed 7 --batch 64 --json --quiet)
check "uninterrupted" run 0 mpi 2 "$train" "${half[@]}" --epochs 2
cp "$tmp/out" "$tmp/full.json"
check "--save on 2 ranks" run 0 mpi 2 "$train" "${half[@]}" --epochs 1 --save "$tmp/ck/ck.safetensors"
check "--save: exactly one file" test "$(ls -A "$tmp/ck")" = ck.safetensors
check "--resume on 2 ranks" run 0 mpi 2 "$train" "${half[@]}" --epochs 2 --resume "$tmp/ck/ck.safetensors"
check "--resume: stderr empty" test ! -s "$tmp/err"
same_end() {
    python3 - "$tmp/full.json" "$tmp/out" <<'EOF'
import json, sys
a, b = json.load(open(sys.argv[1])), json.loads(open(sys.argv[2]).read())
keys = ("final_loss", "test_loss", "test_acc", "world_size")
print("  uninterrupted", [a[k] for k in keys], "resumed", [b[k] for k in keys])
sys.exit(0 if all(a[k] == b[k] for k in keys) else "the resumed run differs")
EOF
}
check "--resume: same end as uninterrupted" same_end
# 2-rank checkpoint on 1 rank: said (the shards differ); ranks given different checkpoints
# (the same epoch and random state, other weights) stop at start, naming the checkpoint.
check "1 rank resumes a 2-rank checkpoint" run 0 "$train" "${half[@]:0:12}" --epochs 2 \
    --resume "$tmp/ck/ck.safetensors"
check "1 rank resumes a 2-rank checkpoint: said" \
    says "note: .*ck.safetensors was saved by 2 rank\(s\) and this run has 1"
check "another checkpoint" run 0 mpi 2 "$train" "${half[@]}" --epochs 1 --lr 0.2 \
    --save "$tmp/other.safetensors"
cat >"$tmp/other-ck.sh" <<EOF
#!/usr/bin/env bash
if [ "\${OMPI_COMM_WORLD_RANK:-0}" = 1 ]; then exec "$train" "\$@" --resume "$tmp/other.safetensors"; fi
exec "$train" "\$@" --resume "$tmp/ck/ck.safetensors"
EOF
chmod +x "$tmp/other-ck.sh"
check "different checkpoints" run fail mpi 2 "$tmp/other-ck.sh" "${half[@]}" --epochs 2
check "different checkpoints: message" says "rank 1's --resume checkpoint \(its tensors and metadata\) differs from rank 0's"
check "different checkpoints: no JSON" test ! -s "$tmp/out"

# --- 5. bad input on 1 and 2 ranks: the message, the status, nothing left behind.
for np in 1 2; do
    check "np $np: --batch 0" run fail mpi "$np" "$train" "${half[@]}" --batch 0
    check "np $np: --batch 0 message" says "--batch: expected an integer >= 1, got '0'"
    check "np $np: missing data" run fail mpi "$np" "$train" "${half[@]}" --data "$tmp/none"
    check "np $np: missing data message" says "$tmp/none"
    check "np $np: unwritable --save" run fail mpi "$np" "$train" "${half[@]}" --save "$tmp/none/ck"
    check "np $np: unwritable --save message" says "--save $tmp/none/ck: cannot write a file there"
    check "np $np: unwritable --save: no JSON" test ! -s "$tmp/out"
done
check "nothing left in the checkpoint directory" test "$(ls -A "$tmp/ck")" = ck.safetensors

# --- 6. a training step that fails on rank 1 only (the trainer's test hook
# NANOAMP_TEST_FAIL_STEP), after its forward, while rank 0 waits for its gradients: rank 1 says
# so once and ends the job (na_dist_abort); mpirun exits with its status 1 well within 60 s
# (124 would be the timeout: a hang).
cat >"$tmp/fail-on-1.sh" <<EOF
#!/usr/bin/env bash
if [ "\${OMPI_COMM_WORLD_RANK:-0}" = 1 ]; then export NANOAMP_TEST_FAIL_STEP=3; fi
exec "$train" "\$@"
EOF
chmod +x "$tmp/fail-on-1.sh"
check "step fails on rank 1 only" run 1 timeout -k 5 60 mpirun --oversubscribe --bind-to none \
    -np 2 "$tmp/fail-on-1.sh" "${half[@]}" --epochs 1 --save "$tmp/ck/ck.safetensors"
check "step fails on rank 1: one message" \
    test "$(grep -c 'training step 3 failed' "$tmp/err")" = 1
check "step fails on rank 1: it names rank 1" \
    says "mnist-train \(rank 1\): training step 3 failed: NANOAMP_TEST_FAIL_STEP=3 .*ending the job"
# (Open MPI's banner; under load its launcher sometimes fails to print it, saying ORTE_ERROR_LOG
# in show_help.c instead. A rank that merely exits gets "exited with non-zero status".)
check "step fails on rank 1: the job was aborted" \
    says "MPI_ABORT was invoked on rank 1|ORTE_ERROR_LOG: .*show_help"
check "step fails on rank 1: no JSON" test ! -s "$tmp/out"
check "step fails on rank 1: the old checkpoint stays" test "$(ls -A "$tmp/ck")" = ck.safetensors

# --- 7. failures before training (flags, data) on 2 ranks: one that every rank shares is said
# once, by rank 0, untagged; one that is a rank's own is said by that rank with "(rank r)", and
# rank 0 names it.
check "np 2: --bogus" run 2 mpi 2 "$train" --bogus
check "np 2: --bogus said once" test "$(grep -c 'unknown option' "$tmp/err")" = 1
check "np 2: --bogus by rank 0, untagged" says "^mnist-train: unknown option --bogus \(see --help\)"
check "np 2: missing data" run 1 mpi 2 "$train" "${half[@]}" --data "$tmp/none"
check "np 2: missing data said once" test "$(grep -c "$tmp/none" "$tmp/err")" = 1
cat >"$tmp/bogus-on-1.sh" <<EOF
#!/usr/bin/env bash
if [ "\${OMPI_COMM_WORLD_RANK:-0}" = 1 ]; then exec "$train" "\$@" --bogus; fi
exec "$train" "\$@"
EOF
chmod +x "$tmp/bogus-on-1.sh"
check "--bogus on rank 1 only" run fail mpi 2 "$tmp/bogus-on-1.sh" "${half[@]}"
check "--bogus on rank 1 only: said once" test "$(grep -c 'unknown option' "$tmp/err")" = 1
check "--bogus on rank 1 only: tagged" says "^mnist-train \(rank 1\): unknown option --bogus"
check "--bogus on rank 1 only: rank 0 names it" says "^mnist-train: stopping: rank 1 failed before training"
check "--bogus on rank 1 only: no JSON" test ! -s "$tmp/out"

# --- 8. BatchNorm without --sync-bn normalizes each rank's shard, so each rank's running
# statistics move their own way; rank 0's are broadcast after each step (--no-broadcast-buffers
# turns that off), so the sharded evaluation of the 2-rank run uses the statistics its
# checkpoint holds: the checkpoint evaluated on one process (--resume, nothing left to train)
# scores the same accuracy and loss (to the rounding of the loss sum's other order).
cnn=(--data "$data" --model cnn --limit 256 --test-limit 200 --seed 7 --batch 32 --epochs 1 --json --quiet)
same_score() { # JSON_A JSON_B
    python3 - "$1" "$2" <<'EOF'
import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
print(f"  run: accuracy {a['test_acc']} loss {a['test_loss']}; checkpoint: accuracy "
      f"{b['test_acc']} loss {b['test_loss']}")
sys.exit(0 if a["test_acc"] == b["test_acc"] and abs(a["test_loss"] - b["test_loss"])
         <= 1e-6 * abs(a["test_loss"]) else "the checkpoint scores differently")
EOF
}
not() { ! "$@"; }
for mode in broadcast local; do
    flag=(); [ "$mode" = local ] && flag=(--no-broadcast-buffers)
    check "cnn, 2 ranks, $mode buffers" run 0 mpi 2 "$train" "${cnn[@]}" "${flag[@]}" \
        --save "$tmp/ck/cnn-$mode.safetensors"
    cp "$tmp/out" "$tmp/cnn-$mode-run.json"
    check "cnn, $mode: its checkpoint on 1 process" run 0 "$train" "${cnn[@]}" \
        --resume "$tmp/ck/cnn-$mode.safetensors"
    cp "$tmp/out" "$tmp/cnn-$mode-ck.json"
done
check "cnn: the checkpoint scores what the run reported" \
    same_score "$tmp/cnn-broadcast-run.json" "$tmp/cnn-broadcast-ck.json"
# (which shows the check above can fail: without the broadcast rank 1 evaluates its shard with
# its own statistics)
check "cnn, --no-broadcast-buffers: rank 1's own statistics score differently" \
    not same_score "$tmp/cnn-local-run.json" "$tmp/cnn-local-ck.json"

# --- 9. rank 1 stops itself (SIGSTOP: alive, never answering) once rank 0 has logged a few
# steps (32 steps an epoch, so mostly within a step; the epoch's end agreement is a collective
# too, hence either message); rank 0 waits in the step's collectives, fails after --dist-timeout 2 plus the roll
# call's 2 s, naming rank 1, and ends the job (na_dist_abort), which ends the stopped rank too.
cat >"$tmp/stop-1.sh" <<EOF
#!/usr/bin/env bash
if [ "\${OMPI_COMM_WORLD_RANK:-0}" = 1 ]; then
    # \$\$ is this script's pid, which exec hands to the trainer
    ( while [ "\$({ wc -l <"$tmp/stop.csv"; } 2>/dev/null || echo 0)" -lt 4 ]; do sleep 0.05; done
      kill -STOP \$\$ ) &
fi
exec "$train" "\$@"
EOF
chmod +x "$tmp/stop-1.sh"
start=$(date +%s)
check "rank 1 stopped" run fail timeout -k 5 60 mpirun --oversubscribe --bind-to none -np 2 \
    "$tmp/stop-1.sh" "${half[@]}" --limit 4096 --epochs 50 --dist-timeout 2 --log "$tmp/stop.csv"
check "rank 1 stopped: ended in time, not by the 60 s limit" test $(( $(date +%s) - start )) -lt 40
check "rank 1 stopped: rank 0 names it" \
    says "^mnist-train( \(rank 0\))?: .*did not complete within 2 s: rank 1 did not answer"
check "rank 1 stopped: no JSON" test ! -s "$tmp/out"

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
