#!/usr/bin/env bash
# --report FILE.html on both trainers: a tiny training writes a well-formed, self-contained page
# (python3's html.parser: tags balanced; no http(s) address, no script or stylesheet fetched)
# with every section (the trace with its backward rows); --amp-trace prints the same lines with
# and without --report; an unwritable path is refused before training (exit 1, one line naming
# the path and the reason), and a page that cannot be written mid-run stops the run with a
# message. Where Debian's chromium is installed, it also opens the page headless and
# screenshots it.
# usage: trainer_html_report.sh MNIST_TRAIN CIFAR_TRAIN
set -uo pipefail
mnist="$1" cifar="$2"
. "$(dirname "$0")/cli_checks.sh" # run, one_line, check

# page FILE DTYPE STATUS EXPR...: FILE parses with every tag closed in order, names no http(s)
# address and loads nothing, has every section, its histograms on DTYPE's line, and each
# Python expression EXPR holds for it (s: the text, trace: the trace table's rows as lists,
# back: the backward table's).
page() {
    python3 - "$@" <<'EOF'
import html.parser, re, sys
path, dtype, status, *exprs = sys.argv[1:]
s = open(path, encoding="utf-8").read()
VOID = {"meta", "br", "img", "hr", "input", "link", "rect", "line", "circle", "polyline"}
class P(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(); self.stack, self.heads, self.cells, self.rows, self.where = [], [], [], [], None
    def handle_starttag(self, tag, attrs):
        if tag in ("script", "link", "iframe", "img"): sys.exit(f"{path}: a <{tag}> element")
        if tag not in VOID: self.stack.append(tag)
        if tag in ("h2", "h3"): self.heads.append("")
        if tag == "tr": self.rows.append([])
        if tag in ("td", "th"): self.rows[-1].append("")
    def handle_startendtag(self, tag, attrs): pass
    def handle_endtag(self, tag):
        if tag in VOID: return
        if not self.stack or self.stack[-1] != tag: sys.exit(f"{path}: </{tag}> closes <{self.stack[-1] if self.stack else None}>")
        self.stack.pop()
    def handle_data(self, d):
        if self.stack and self.stack[-1] in ("h2", "h3"): self.heads[-1] += d
        if self.rows and "td" in self.stack or "th" in self.stack: self.rows[-1][-1] += d
p = P(); p.feed(s); p.close()
if p.stack: sys.exit(f"{path}: unclosed {p.stack}")
if re.search(r"https?://", s): sys.exit(f"{path}: names an http(s) address")
for h in ["Configuration", "Loss", "Loss scale", "Amp monitor alerts", "Gradients", "Activations", "Autocast trace", "Final JSON"]:
    if h not in p.heads: sys.exit(f"{path}: no section {h!r} in {p.heads}")
if f"Status: <b>{status}" not in s: sys.exit(f"{path}: status is not {status!r}")
if f"rounds to 0 in {dtype}</th>" not in s: sys.exit(f"{path}: the histograms are not on the {dtype} line")
i = next(k for k, r in enumerate(p.rows) if r[:2] == ["op", "input dtypes"])
trace = [r for r in p.rows[i + 1:] if len(r) == 6]
j = next((k for k, r in enumerate(p.rows) if r == ["op", "gradient", "zero", "subnormal", "inf/NaN"]), None)
back = [r for r in p.rows[j + 1:] if len(r) == 5] if j is not None else []
for e in exprs:
    if not eval(e): sys.exit(f"{path}: does not hold: {e}")
EOF
}
real=(--data "$data" --limit 256 --test-limit 64 --batch 64 --model mlp)

# --- 1. fp16 over 2 epochs: 4 steps each; sampled: steps 1 and 5; the trace's linear in f16
check "mnist fp16" run 0 "$mnist" "${real[@]}" --epochs 2 --amp fp16 --quiet --report "$tmp/r.html"
check "  page" page "$tmp/r.html" f16 complete \
    "'Sampled steps: 1 5 ' in s" "s.count('<svg') == 1 + 2 * (4 + 4)" \
    "['linear', 'f32,f32,f32', 'lower', 'f16', 'f16', 'f32'] in trace" \
    "[r[:2] for r in back][:4] == [['mul', 'f32 []'], ['cross_entropy', 'f32 []'], ['cast', 'f32 [64,10]'], ['linear', 'f16 [64,10]']]" \
    "all(re.fullmatch(r'\d+\.\d\d%', c) for r in back for c in r[2:])" \
    "'1.weight (x 65536)' in s" "'&quot;' not in s and '\"amp\": \"fp16\"' in s"
check "  mode" test "$(stat -c %a "$tmp/r.html")" = "$(umask -S >/dev/null; printf '%o' $((0666 & ~$(umask))))"
check "  no temporary file left" test -z "$(ls "$tmp" | grep '^r\.html\.')"
# --- 2. bf16 and off: their lines; o2 traces every op
check "mnist bf16" run 0 "$mnist" "${real[@]}" --epochs 1 --amp bf16 --quiet --report "$tmp/b.html"
check "  page" page "$tmp/b.html" bf16 complete "['linear', 'f32,f32,f32', 'lower', 'bf16', 'bf16', 'f32'] in trace" \
    "'FP8 operands' not in p.heads"
# fp8: the bf16 line for gradients and activations; each FP8 layer's input and weight on E4M3,
# times the scale its cast used (1 at the first step, TE's start; then from the history)
check "mnist fp8" run 0 "$mnist" "${real[@]}" --epochs 2 --amp fp8 --quiet --report "$tmp/f8.html"
check "  page" page "$tmp/f8.html" bf16 complete "'FP8 operands' in p.heads" \
    "['1 input', 'f8e4m3'] in [r[:2] for r in p.rows]" \
    "any(r[0].startswith('1 weight (x ') and r[1] == 'f8e4m3' for r in p.rows)" \
    "'step 5: FP8 operand 3 input (f8e4m3)' in s"
check "mnist off" run 0 "$mnist" "${real[@]}" --epochs 1 --quiet --report "$tmp/o.html"
check "  page" page "$tmp/o.html" f32 complete "['linear', 'f32,f32,f32', 'as_is', 'f32', 'f32', 'f32'] in trace"
check "mnist o2" run 0 "$mnist" "${real[@]}" --epochs 1 --amp o2 --quiet --report "$tmp/o2.html"
check "  page" page "$tmp/o2.html" f16 complete "any(r[0] == 'linear' and r[3] == 'f16' for r in trace)"
# --- 3. cifar-train
check "cifar bf16" run 0 "$cifar" --synthetic 64 --limit 64 --test-limit 32 --batch 32 --epochs 1 \
    --amp bf16 --quiet --report "$tmp/c.html"
check "  page" page "$tmp/c.html" bf16 complete "any(r[0] == 'conv2d' and r[3] == 'bf16' for r in trace)" \
    "any(r[1].startswith('bf16 [32,') for r in back)"
# --- 4. --amp-trace prints the same with --report (the report's observer prints it)
run 0 "$mnist" "${real[@]}" --epochs 1 --amp fp16 --quiet --amp-trace; grep '^amp: ' "$tmp/err" >"$tmp/trace"
check "amp-trace with --report" run 0 "$mnist" "${real[@]}" --epochs 1 --amp fp16 --quiet --amp-trace --report "$tmp/t.html"
check "  same lines" cmp -s <(grep '^amp: ' "$tmp/err") "$tmp/trace"
check "  not empty" grep -q '^amp: linear' "$tmp/trace"
check "  with the backward rows" grep -Eq '^amp: linear +grad f16 +\[64,10\] +zero' "$tmp/trace"

# --- 5. refused before training: a directory that does not exist, a directory
check "report in a missing directory" run 1 "$mnist" "${real[@]}" --report "$tmp/nope/r.html"
check "  message" one_line "^mnist-train: --report $tmp/nope/r.html: cannot write a file there: No such file or directory$"
check "report is a directory" run 1 "$cifar" --synthetic 64 --limit 64 --report "$tmp"
check "  message" one_line "^cifar-train: --report $tmp: is a directory"
# --- 6. mid-run: the page outgrows a file-size limit (SIGXFSZ is ignored: EFBIG) after epoch 1
check "page cannot be written" run 1 bash -c "ulimit -f 16; exec \"\$0\" \"\$@\"" "$mnist" "${real[@]}" \
    --epochs 2 --quiet --report "$tmp/big.html"
check "  message" one_line "^mnist-train: --report $tmp/big.html: cannot write the page: File too large$"
check "  nothing left" test ! -e "$tmp/big.html" -a -z "$(ls "$tmp" | grep big)"

# --- 7. headless Chromium, where installed: it renders every section, and a non-blank picture
if command -v chromium >/dev/null; then
    chrome=(chromium --headless --no-sandbox --disable-gpu --user-data-dir="$tmp/chrome")
    check "chromium dom" bash -c '"$@" 2>/dev/null | grep -q "<h2 id=\"trace\">Autocast trace</h2>"' _ \
        timeout 120 "${chrome[@]}" --dump-dom "file://$tmp/r.html"
    timeout 120 "${chrome[@]}" --window-size=1000,1500 --screenshot="$tmp/r.png" "file://$tmp/r.html" >/dev/null 2>&1
    check "chromium screenshot not blank" python3 -c '
import sys, zlib, struct
b = open(sys.argv[1], "rb").read()
assert b[:8] == b"\x89PNG\r\n\x1a\n"
w, h = struct.unpack(">II", b[16:24]); data = b""; i = 8
while i < len(b):
    n, = struct.unpack(">I", b[i:i + 4]); t = b[i + 4:i + 8]
    if t == b"IDAT": data += b[i + 8:i + 8 + n]
    i += 12 + n
raw = zlib.decompress(data)
assert len(set(raw[k:k + 3] for k in range(1, len(raw), 4 * 97))) > 8, "blank"' "$tmp/r.png"
else
    echo "chromium not installed: the page is not opened in a browser (install-deps installs it)"
fi

echo "passed $passed, failed $failed"
[ "$failed" = 0 ]
