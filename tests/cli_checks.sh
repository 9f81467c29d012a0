# Sourced by the trainers' command-line tests (trainer_errors.sh, trainer_resume.sh,
# trainer_html_report.sh): sets $data (MNIST-format files; the test skips, 77, without them)
# and $tmp (a scratch directory, removed at exit), then gives run, one_line, json and check
# (a command's exit status, its one-line message, its JSON line). The caller reads $passed and
# $failed at the end.
data="${NANOAMP_TEST_MNIST:-/usr/share/datasets/fashion-mnist}"
if [ ! -f "$data/train-images-idx3-ubyte.gz" ] && [ ! -f "$data/train-images-idx3-ubyte" ]; then
    echo "no MNIST-format data in $data: skipping"; exit 77
fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export NANOAMP_NO_BLAS_TUNE=1
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
