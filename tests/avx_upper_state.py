#!/usr/bin/env python3
"""No function of the library leaves the upper halves of the vector registers dirty.

A function that uses 256- or 512-bit registers (ymm/zmm) must clear their upper halves
(vzeroupper) before it hands control to code that may use legacy SSE instructions: otherwise
every SSE instruction after it pays a state-transition cost until something clears them.
Compilers emit vzeroupper before ret and call, but GCC forgets it before a tail call (a jmp to
another function): f16 -> f32 conversions that ended in the scalar tail loop that way made
BatchNorm on f16 data run 3x slower than on bf16 (na-kbench bn).

Disassembles the given shared library (objdump) and exits 1 naming each function that jumps
to another function, or returns, with ymm/zmm state live and no vzeroupper on the way; 77
(skipped) where objdump is missing or the library is not x86-64.

    tests/avx_upper_state.py LIBRARY
"""
import re
import shutil
import subprocess
import sys

# Functions that return a vector in ymm/zmm to AVX callers: their ret is meant to keep it.
RETURNS_VECTOR = {"lane_sums16"}


def offenders(disassembly):
    # A jmp from f to f.cold (GCC's hot/cold split) is no exit: f goes on there, so the cold
    # part is read as entered with f's state; the second pass knows which are entered dirty.
    entered_dirty = set()
    for _ in range(2):
        found = scan(disassembly, entered_dirty)
    return found


def scan(disassembly, entered_dirty):
    found, fn, dirty = [], None, False
    for line in disassembly.splitlines():
        m = re.match(r"^[0-9a-f]+ <(.+)>:$", line)
        if m:
            fn = m.group(1)
            dirty = fn in entered_dirty
            continue
        if "\t" not in line:
            continue
        ins = line.split("\t")[-1].strip()
        if "vzeroupper" in ins or "vzeroall" in ins:
            dirty = False
        elif "%ymm" in ins or "%zmm" in ins:
            dirty = True
        if not dirty or fn in RETURNS_VECTOR:
            continue
        target = re.search(r"<([^>]+)>", ins)
        if ins.startswith("jmp") and target is not None and target.group(1) == fn + ".cold":
            entered_dirty.add(target.group(1))
            continue
        leaves = ins.startswith("ret") or (
            ins.startswith("jmp") and target is not None and "+0x" not in target.group(1))
        if leaves:
            found.append(f"{fn}: '{ins}' with ymm/zmm upper halves dirty (no vzeroupper)")
    return found


def main():
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    objdump = shutil.which("objdump")
    if not objdump:
        print("avx_upper_state: objdump not found: skipped")
        return 77
    out = subprocess.run([objdump, "-d", "--no-show-raw-insn", sys.argv[1]], check=True,
                         capture_output=True, text=True).stdout
    if "%rip" not in out and "%rsp" not in out:
        print("avx_upper_state: not x86-64 code: skipped")
        return 77
    found = offenders(out)
    for f in found:
        print(f)
    print(f"avx_upper_state: {len(found)} offending exits")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
