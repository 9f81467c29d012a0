#!/usr/bin/env bash
# custom-op (examples/custom_op): its last line is one strict JSON object (no NaN, no
# infinity) saying that swish's gradients pass na_gradcheck, that both runs (f32, and f16
# autocast with a GradScaler) learn, that they end close to each other, and that swish's
# forward and backward saw f32 in both (it declares .cast_inputs = f32); --amp-trace shows
# swish under its own name with that rule.
set -euo pipefail
prog="$1"
export NANOAMP_NO_BLAS_TUNE=1
out=$("$prog" --steps 150)
echo "$out"
tail -n 1 <<<"$out" | python3 -c '
import json, sys
def no_constant(name):
    raise ValueError("not strict JSON: " + name)
d = json.loads(sys.stdin.read(), parse_constant=no_constant)
fails = []
def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok: fails.append(what)
check(d["gradcheck"] == "ok", "gradcheck: " + d["gradcheck"])
for run in ("f32", "amp_fp16"):
    r = d[run]
    check(r["loss_last"] < 0.25 * r["loss_first"], "%s learns: %g -> %g" % (run, r["loss_first"], r["loss_last"]))
    check(r["forward_dtypes"] == ["f32"], "%s: forward saw %s" % (run, r["forward_dtypes"]))
    check(r["backward_dtypes"] == ["f32"], "%s: backward got %s" % (run, r["backward_dtypes"]))
f, a = d["f32"]["loss_last"], d["amp_fp16"]["loss_last"]
check(abs(f - a) <= 0.1 * f + 0.01, "f32 and amp end close: %g and %g" % (f, a))
check(d["amp_fp16"]["loss_scale"] > 1, "the amp run used a GradScaler")
print("%d passed, %d failed" % (8 - len(fails), len(fails)))
sys.exit(1 if fails else 0)
'
"$prog" --help | grep -q '^usage:' || { echo "FAIL: --help does not print the usage on stdout"; exit 1; }
rc=0; "$prog" --steps 2>/dev/null || rc=$?
[ "$rc" = 2 ] || { echo "FAIL: --steps without a value gave exit $rc, wanted 2"; exit 1; }
for bad in 3x 0 -1 99999999999 " 5" ""; do # strict: no atoi prefix, no count out of range
    rc=0; "$prog" --steps "$bad" >/dev/null 2>&1 || rc=$?
    [ "$rc" = 2 ] || { echo "FAIL: --steps '$bad' gave exit $rc, wanted 2"; exit 1; }
done
echo "ok   --help exits 0 with the usage, a bad argument 2"
trace=$("$prog" --steps 1 --amp-trace 2>&1 >/dev/null)
grep -Eq '^amp: swish +in f16 +rule fp32 +compute f32 +out f32' <<<"$trace" ||
    { echo "FAIL: --amp-trace does not show swish with its rule:"; echo "$trace"; exit 1; }
echo "ok   --amp-trace: $(grep -m1 'amp: swish' <<<"$trace")"
