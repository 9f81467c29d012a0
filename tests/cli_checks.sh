# Sourced by the trainers' command-line tests (trainer_errors.sh, trainer_resume.sh): run a
# command and check its exit status, its one-line message and its JSON line. The caller sets
# $tmp (a scratch directory) and reads $passed, $failed at the end.
passed=0 failed=0
fail() { echo "FAIL: $*"; failed=$((failed + 1)); }

# run WANT_RC CMD...: runs CMD, keeps stdout/stderr in $tmp/out, $tmp/err; checks the exit status
run() {
    local want=$1; shift
    "$@" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    [ "$rc" = "$want" ] || { echo "  exit $rc, wanted $want: $*"; sed 's/^/  | /' "$tmp/err" | head -n 20; return 1; }
}
# one_line PATTERN: stderr is exactly one line and matches the extended regex PATTERN
one_line() {
    local lines; lines=$(wc -l <"$tmp/err")
    [ "$lines" = 1 ] && grep -Eq -- "$1" "$tmp/err" ||
        { echo "  stderr ($lines lines) should be one line matching /$1/:"; sed 's/^/  | /' "$tmp/err" | head -n 20; return 1; }
}
# json EXPR: the last stdout line is strict JSON and the Python expression EXPR holds for it (d)
json() {
    tail -n 1 "$tmp/out" | python3 -c '
import json, sys
def bad(x): raise ValueError("not JSON: " + x)
d = json.loads(sys.stdin.read(), parse_constant=bad)
sys.exit(0 if eval(sys.argv[1]) else "does not hold: " + sys.argv[1] + " in " + json.dumps(d))' "$1"
}
check() { local name=$1; shift; if "$@"; then passed=$((passed + 1)); else fail "$name"; fi; }
