#!/usr/bin/env bash
# docs/custom-ops.md, section 6: the program it shows (square.c) compiles and links with the
# commands it shows for a build directory (pkg-config on build/meson-uninstalled), and runs
# to the output it promises. Both are read from the document itself, so they cannot drift.
set -euo pipefail
doc="$1"
build="$(cd "$2" && pwd)"
command -v pkg-config >/dev/null || { echo "no pkg-config: skipped"; exit 77; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
ln -s "$build" "$work/build"
# the c block that opens with "/* square.c */", and the sh block that follows "Straight from"
python3 - "$doc" "$work" <<'PY'
import re, sys
doc, work = sys.argv[1], sys.argv[2]
text = open(doc).read()
blocks = re.findall(r"```(\w+)\n(.*?)```", text, re.S)
prog = [b for lang, b in blocks if lang == "c" and b.startswith("/* square.c */")]
tail = text[text.index("Straight from a build directory"):]
cmds = re.search(r"```sh\n(.*?)```", tail, re.S)
if len(prog) != 1 or not cmds:
    sys.exit("%s: square.c or its build commands not found" % doc)
open(work + "/square.c", "w").write(prog[0])
open(work + "/commands.sh", "w").write(cmds.group(1))
PY
cd "$work"
echo "--- commands from $doc:"; cat commands.sh
out="$(bash -euo pipefail commands.sh)"
echo "--- output: $out"
[ "$out" = "dy/dx = 6 6" ] || { echo "FAIL: expected \"dy/dx = 6 6\""; exit 1; }
echo ok
