#!/usr/bin/env python3
"""The layering of the library, checked on its #include lines and on its calls.

    kernels <- tensor <- autograd <- ops <- nn, optim <- amp <- io, data, dist

Each file of src/, kernels/ and include/ belongs to one layer (its directory; a public header
to the layer that implements it). An include may go down or stay in its layer, never up; optim
does not include nn; and no circle of includes exists, among files or among layers. Given the
built static library, the same rules hold for calls: no object file uses a function defined
in a layer above its own (a header can declare what it likes; the linker tells who calls
whom). Exits 1 naming every offending include or call.

    tests/include_layers.py [SOURCE_ROOT [STATIC_LIBRARY]]
"""
import os
import re
import subprocess
import sys

RANK = {"base": 0, "kernels": 1, "tensor": 2, "autograd": 3, "ops": 4, "nn": 5, "optim": 5,
        "amp": 6, "io": 7, "data": 7, "dist": 7,
        "umbrella": 8}

# Public headers, by the layer that implements them (error and dtype sit below the kernels).
PUBLIC = {"error.h": "base", "dtype.h": "base", "cuda.h": "kernels", "tensor.h": "tensor",
          "autograd.h": "autograd", "ops.h": "ops", "autocast.h": "ops", "nn.h": "nn",
          "optim.h": "optim", "amp.h": "amp", "fp8.h": "amp", "io.h": "io", "data.h": "data",
          "state.h": "tensor", "view.h": "base", "dist.h": "dist", "profile.h": "autograd",
          "threads.h": "kernels"}

# Same rank, still one way: optimizers take parameter lists, not modules.
FORBIDDEN = {("optim", "nn")}

# Includes that break the rules today and that another slice of issue 12 removes; reported,
# not failed. Delete an entry once its include is gone (the check says when).
PENDING = {
}

# The same, for calls: object file (as the archive names it) -> function it uses.
PENDING_CALLS = {
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
SOURCES = (".c", ".h", ".cu", ".cuh")


def layer_of(rel):
    parts = rel.split("/")
    if rel == "include/nanoamp.h":
        return "umbrella"
    if parts[0] == "include":
        return PUBLIC.get(parts[-1])
    if parts[0] == "kernels":
        return "kernels"
    if parts[0] == "src" and len(parts) > 2 and parts[1] in RANK:
        return parts[1]
    return None


def object_layer(member):
    """src_ops_shape.c.o -> (src_ops_shape, ops); the error and dtype tables are the base below the kernels."""
    name = member.split(".")[0]
    if name in ("src_tensor_error", "src_tensor_dtype"):
        return name, "base"
    if name.startswith("kernels"):
        return name, "kernels"
    parts = name.split("_")
    return name, parts[1] if parts[0] == "src" and len(parts) > 2 and parts[1] in RANK else None


def check_calls(lib, errors, notes):
    out = subprocess.run(["nm", lib], capture_output=True, text=True, check=True).stdout
    defined, used, member = {}, {}, None
    for line in out.splitlines():
        if line.endswith(":"):
            member = object_layer(line[:-1])
            continue
        f = line.split()
        if len(f) == 3 and f[1] in "TDBRC":
            defined[f[2]] = member
        elif len(f) == 2 and f[0] == "U" and member:
            used.setdefault(member, set()).add(f[1])
    seen = set()
    for (obj, a), symbols in sorted(used.items()):
        for sym in sorted(symbols):
            if sym not in defined or a is None:
                continue
            dobj, b = defined[sym]
            if b is None or a == b or not (RANK[b] > RANK[a] or (a, b) in FORBIDDEN):
                continue
            if (obj, dobj) in PENDING_CALLS:
                seen.add((obj, dobj))
                continue
            errors.append(f"{obj} calls {sym} ({dobj}): {a} must not call into {b}")
    for obj, dobj in sorted(seen):
        notes.append(f"{obj} calls into {dobj}: enforced after merge, "
                     f"{PENDING_CALLS[(obj, dobj)]}")
    for obj, dobj in sorted(set(PENDING_CALLS) - seen):
        notes.append(f"{obj} no longer calls into {dobj}: delete its PENDING_CALLS entry")


def scan(root):
    files = []
    for top in ("src", "kernels", "include"):
        for d, _, names in os.walk(os.path.join(root, top)):
            files += [os.path.relpath(os.path.join(d, n), root) for n in sorted(names)
                      if n.endswith(SOURCES)]
    edges = {}
    for rel in files:
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
            text = f.read()
        here = os.path.dirname(rel)
        targets = []
        for inc in INCLUDE.findall(text):
            # the build's include path: the file's directory, include/, the root, kernels/
            for base in (here, "include", "", "kernels"):
                cand = os.path.normpath(os.path.join(base, inc))
                if os.path.isfile(os.path.join(root, cand)):
                    targets.append(cand)
                    break
        edges[rel] = targets
    return edges


def circles(graph):
    """Strongly connected components with more than one member (or a self edge)."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.get(v, ()):
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    edges = scan(root)
    errors, notes, seen_pending = [], [], set()
    for src in sorted(edges):
        if src.startswith("kernels/"):  # kernels see plain views (na_view), never the tensor
            with open(os.path.join(root, src), encoding="utf-8") as f:
                if re.search(r"\bna_tensor\b", f.read()):
                    errors.append(f"{src} names na_tensor: kernels take na_view")
        if src.startswith("include/nanoamp/") and layer_of(src) is None:
            errors.append(f"{src}: a public header of no layer (add it to PUBLIC)")
    layer_graph = {}
    for src, targets in sorted(edges.items()):
        a = layer_of(src)
        for dst in targets:
            b = layer_of(dst)
            if a is None or b is None or a == b:
                continue
            if (src, dst) in PENDING:
                seen_pending.add((src, dst))
                notes.append(f"{src} includes {dst} ({a} -> {b}): enforced after merge, "
                             f"{PENDING[(src, dst)]}")
                continue
            layer_graph.setdefault(a, set()).add(b)
            if RANK[b] > RANK[a] or (a, b) in FORBIDDEN:
                errors.append(f"{src} includes {dst}: {a} must not include {b} "
                              f"(kernels <- tensor <- autograd <- ops <- nn/optim <- amp <- io/data/dist)")
    for comp in circles(edges):
        errors.append("include circle among files: " + " -> ".join(comp))
    for comp in circles(layer_graph):
        errors.append("include circle among layers: " + " -> ".join(comp))
    for key in sorted(set(PENDING) - seen_pending):
        notes.append(f"{key[0]} no longer includes {key[1]}: delete its PENDING entry")
    if len(sys.argv) > 2 and os.path.isfile(sys.argv[2]):
        check_calls(sys.argv[2], errors, notes)
    elif len(sys.argv) > 2:
        notes.append(f"{sys.argv[2]} is not built: calls not checked")
    for n in notes:
        print("note:", n)
    for e in errors:
        print("error:", e)
    print(f"{len(edges)} files, {sum(map(len, edges.values()))} includes, "
          f"{len(errors)} errors")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
