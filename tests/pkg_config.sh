#!/usr/bin/env bash
# pkg-config --static names everything the static library needs: a program linked with
# libnanoamp.a and `pkg-config --static --libs nanoamp` (the build's uninstalled .pc) links
# and runs. In a CUDA build that takes -lstdc++ (the CUDA objects call the C++ runtime).
# usage: pkg_config.sh BUILD_ROOT CC [EXTRA_FLAGS]
set -euo pipefail
root="$1" cc="$2" extra="${3:-}"
command -v pkg-config >/dev/null || { echo "no pkg-config: skipping"; exit 77; }
export PKG_CONFIG_PATH="$root/meson-uninstalled"
libs=$(pkg-config --static --libs nanoamp) cflags=$(pkg-config --cflags nanoamp)
echo "pkg-config --static --libs nanoamp: $libs"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/t.c" <<'EOF'
#include <nanoamp.h>
int main(void) {
    na_tensor *t = na_tensor_new(NA_DTYPE_F32, NA_DEVICE_CPU, NA_SHAPE(2));
    int ok = t && na_fill_(t, 1.0) == NA_OK;
    na_tensor_free(t);
    return !ok;
}
EOF
# the static archive in place of -lnanoamp (the build holds the shared library beside it)
# shellcheck disable=SC2086
"$cc" $extra $cflags "$tmp/t.c" -o "$tmp/t" "$root/libnanoamp.a" ${libs//-lnanoamp/}
"$tmp/t"
echo "1 passed, 0 failed"
