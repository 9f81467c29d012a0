#!/usr/bin/env bash
# scripts/carry-criterion with an ldconfig whose output outlasts the pipe (a system with many
# libraries: Debian's ldconfig -p writes ~80 KB): it must still exit 0 and leave a complete
# prefix (criterion.pc, zlib.pc, pkg-config), which its own last step compiles and runs a
# Criterion program against. Skips (77) without libcriterion-dev. Args: the source root.
set -euo pipefail
root="$1"
dpkg -s libcriterion-dev >/dev/null 2>&1 || { echo "libcriterion-dev not installed: skip"; exit 77; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/bin"
real="$(PATH=/sbin:/usr/sbin:$PATH command -v ldconfig)"
# the real cache first (the libz line is early), then 4 MiB more: a reader that stops at the
# first match leaves this writer to die of SIGPIPE
yes '	libpadding.so.0 (libc6,x86-64) => /nowhere/libpadding.so.0' | head -c 4194304 >"$tmp/pad" || true
cat >"$tmp/bin/ldconfig" <<EOF
#!/usr/bin/env bash
set -eo pipefail # a writer killed by SIGPIPE ends this one with 141, as ldconfig itself
"$real" "\$@"
[ "\${1:-}" = -p ] && cat "$tmp/pad"
exit 0
EOF
chmod +x "$tmp/bin/ldconfig"
set +e
PATH="$tmp/bin:$PATH" "$root/scripts/carry-criterion" "$tmp/carry" >"$tmp/log" 2>&1
rc=$?
set -e
cat "$tmp/log"
[ $rc -eq 0 ] || { echo "FAIL: carry-criterion exited $rc"; exit 1; }
for f in lib/pkgconfig/criterion.pc lib/pkgconfig/zlib.pc lib/libz.so.1 include/zlib.h; do
    [ -e "$tmp/carry/$f" ] || { echo "FAIL: $f missing from the carried prefix"; exit 1; }
done
if command -v pkgconf >/dev/null; then
    [ -x "$tmp/carry/bin/pkg-config" ] || { echo "FAIL: bin/pkg-config missing"; exit 1; }
fi
echo "ok: carry-criterion exits 0 with a long ldconfig -p and leaves a complete prefix"
