#!/usr/bin/env bash
# scripts/gpu-check-report: the $OUT contract (what the device tool brings back: 8 files of
# at most 16 MiB, plain names, two folders deep, no links) and summary.json's stage rows
# (status, seconds, the FIGURE lines of the stage's log). Arg: the source root.
set -uo pipefail
report="$1/scripts/gpu-check-report"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fails=0
check() { # check WANT_RC WHAT CMD...: CMD exits WANT_RC
    local want="$1" what="$2" rc
    shift 2
    "$@" >"$tmp/out" 2>&1
    rc=$?
    if [ "$rc" = "$want" ]; then echo "ok   $what"; else echo "FAIL $what (exit $rc)"; cat "$tmp/out"; fails=1; fi
}
mkdir -p "$tmp/good/a/b"
echo '{}' >"$tmp/good/summary.json"
echo x >"$tmp/good/a/b/logs.tar.gz"
check 0 "three plain files, two folders down: ok" "$report" contract "$tmp/good"
mkdir -p "$tmp/deep/a/b/c" && echo x >"$tmp/deep/a/b/c/f"
check 1 "a file three folders down is refused" "$report" contract "$tmp/deep"
mkdir -p "$tmp/many" && for i in 1 2 3 4 5 6 7 8 9; do echo "$i" >"$tmp/many/f$i"; done
check 1 "nine files are refused" "$report" contract "$tmp/many"
mkdir -p "$tmp/name" && echo x >"$tmp/name/a b.txt"
check 1 "a name with a space is refused" "$report" contract "$tmp/name"
mkdir -p "$tmp/link" && ln -s /etc/hostname "$tmp/link/l"
check 1 "a link is refused" "$report" contract "$tmp/link"
mkdir -p "$tmp/big" && head -c $((16 * 1048576 + 1)) /dev/zero >"$tmp/big/f"
check 1 "a file over 16 MiB is refused" "$report" contract "$tmp/big"
grep -q "over 16 MiB" "$tmp/out" || { echo "FAIL the size breach is not named"; fails=1; }

mkdir -p "$tmp/work"
printf 'x\nFIGURE passed=148\nFIGURE note=fine\n' >"$tmp/log"
check 0 "record a stage" env GC_RUN_KIND=gpu "$report" record "$tmp/work" "$tmp/summary.json" parity ok 12 60 1 "$tmp/log"
check 0 "record a skipped stage" "$report" record "$tmp/work" "$tmp/summary.json" bench skipped 0 0 0 "$tmp/none" "out of time"
python3 - "$tmp/summary.json" <<'PY' || fails=1
import json, sys
d = json.load(open(sys.argv[1]))
s = d["stages"]
assert [r["stage"] for r in s] == ["parity", "bench"], s
assert s[0]["status"] == "ok" and s[0]["seconds"] == 12 and s[0]["figures"] == {"passed": 148, "note": "fine"}, s[0]
assert s[1]["status"] == "skipped" and s[1]["why"] == "out of time" and "figures" not in s[1], s[1]
assert d["seconds"] == 12, d
print("ok   summary.json lists both stages with status, seconds and figures")
PY
exit $fails
