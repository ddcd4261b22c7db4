#!/usr/bin/env python3
"""Checks that nax's layers only look down, in what files include and in where functions are defined.

Every file sits in the layer of its folder: include/nax/X/... and src/X/... are layer X
(docs/architecture.md describes each). The layers, lowest first:
  core           names, shapes, dtypes, the mesh, vary types, errors, the allocator interface
  io             reading the files nax is given (size caps, the bounded JSON reader) and durable writes
  text           the tokenizer, its own library nax::text (core and io only)
  kernels        the device and its kernel table (cpu, cuda), the canonical sum tree
  tensor         the value type and its copies between layouts and dtypes
  trace          the timeline recorder and the one observer interface ops report to
  comm           communicators (local threads, MPI, NCCL) and the launch of a collective's call
  shard          what per-shard code sees of its device (the interface the runtime implements)
  deterministic  the bitwise mode: its records of partial sums' terms and the tree psum
  ops            the per-shard ops and collectives, their backward functions and the tape
  autodiff       the backward pass over the tape: grad, value_and_grad, remat
  runtime        meshes of devices running per-shard code: the Shard implementation, the options
  debug          the op recorder and the mesh-comparison locator
  global         the global view and the automatic sharding
  nn             parameters and optimizers
  checkpoint     safetensors, sharded saves, run folders
include/nax/nax.h, the umbrella header, may include everything.

Two rules, each reported with the file and line:
  includes     a file includes only its own layer and those below it;
  definitions  a function or class declared in a header of layer X (public or private) is defined
               in layer X or below, never above it: a header's promises are kept by its own layer.

Usage: scripts/check_layers.py [REPO_ROOT]   (exit 1 and one line per violation if any)
"""
import pathlib
import re
import sys

LAYERS = ["core", "io", "text", "kernels", "tensor", "trace", "comm", "shard", "deterministic", "ops", "autodiff",
          "runtime", "debug", "global", "nn", "checkpoint"]
UMBRELLA = "include/nax/nax.h"
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
NAMESPACE_OPEN = re.compile(r"^namespace\s+([\w:]*)\s*\{")
NAMESPACE_CLOSE = re.compile(r"^\}\s*//\s*namespace")
CLASS = re.compile(r"^\s*(?:class|struct)\s+(?:\[\[\w+\]\]\s+)?(\w+)\b[^;]*$")
# A declaration or definition at namespace scope: a return type, then the name and its parameters.
FUNCTION = re.compile(r"^(?!return\b|using\b|typedef\b|friend\b|static_assert\b|template\b|#)"
                      r"[A-Za-z_][\w:<>,\s\*&]*?[\s\*&]([A-Za-z_][\w:]*)\(")
QUALIFIED = re.compile(r"^[A-Za-z_][\w:<>,\s\*&]*?\b(\w+)::(~?\w+|operator\S+)\s*\(")


def layer_of(path: str):
    """The layer of a repository path (include/nax/X/... or src/X/...), None for the umbrella header."""
    if path == UMBRELLA:
        return None
    parts = path.split("/")
    rest = parts[2:] if parts[:2] == ["include", "nax"] else parts[1:] if parts[0] == "src" else None
    if not rest or len(rest) < 2:
        raise KeyError(f"{path}: every file lives in a layer's folder (include/nax/X/ or src/X/)")
    if rest[0] not in LAYERS:
        raise KeyError(f"{path}: folder '{rest[0]}' is in no layer; add it to LAYERS")
    return rest[0]


def resolve(include: str, repo: pathlib.Path):
    """The repository path an include names: "nax/..." is include/nax/..., other paths are src/..."""
    if include.startswith("nax/"):
        return "include/" + include
    if (repo / "src" / include).exists():
        return "src/" + include
    return None  # a file beside the includer, a generated header or a test helper


def namespaced_lines(text: str):
    """(line number, namespace, line) for each line at namespace scope of a named namespace;
    lines in anonymous namespaces are left out (their functions are the file's own)."""
    stack, depth = [], 0
    for number, line in enumerate(text.splitlines(), 1):
        opened = NAMESPACE_OPEN.match(line)
        if opened:
            stack.append(opened.group(1))
            continue
        if NAMESPACE_CLOSE.match(line) and stack:
            stack.pop()
            continue
        if stack and "" not in stack:
            yield number, "::".join(stack), line


def declarations(text: str):
    """The classes and free functions a public header declares, as namespace-qualified names."""
    classes, functions = set(), set()
    for _, ns, line in namespaced_lines(text):
        if (m := CLASS.match(line)) and not line.startswith(" "):
            classes.add(f"{ns}::{m.group(1)}")
        elif (m := FUNCTION.match(line)) and "::" not in m.group(1) and not line.rstrip().endswith("{"):
            functions.add(f"{ns}::{m.group(1)}")
    return classes, functions


def definitions(text: str):
    """(line, qualified name) of each function a source defines at namespace scope."""
    for number, ns, line in namespaced_lines(text):
        if line.rstrip().endswith(";"):
            continue
        if m := QUALIFIED.match(line):
            yield number, f"{ns}::{m.group(1)}", True
        elif m := FUNCTION.match(line):
            yield number, f"{ns}::{m.group(1)}", False


def include_problems(rel, own, text, repo):
    for include in INCLUDE.findall(text):
        target = resolve(include, repo)
        if target is None:
            continue
        try:
            theirs = layer_of(target)
        except KeyError as e:
            yield f"{rel}: includes {include}: {e.args[0]}"
            continue
        if theirs is None or LAYERS.index(theirs) > LAYERS.index(own):
            yield f"{rel} ({own}) includes {include} ({theirs or 'the umbrella header'}), a higher layer"


def main() -> int:
    repo = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[1])
    files = sorted(p for d in ("include/nax", "src") for p in (repo / d).rglob("*")
                   if p.suffix in {".h", ".cpp", ".cu", ".cuh"})
    problems, layered = [], []
    for file in files:
        rel = file.relative_to(repo).as_posix()
        try:
            own = layer_of(rel)
        except KeyError as e:
            problems.append(e.args[0])
            continue
        if own is not None:
            layered.append((rel, own, file.read_text(errors="replace")))

    declared_class, declared_function = {}, {}
    for rel, own, text in layered:
        if rel.endswith((".h", ".cuh")):
            classes, functions = declarations(text)
            for name in classes:
                declared_class.setdefault(name, []).append((rel, own))
            for name in functions:
                declared_function.setdefault(name, []).append((rel, own))

    for rel, own, text in layered:
        problems.extend(include_problems(rel, own, text, repo))
        if not rel.startswith("src/"):
            continue
        for number, name, qualified in definitions(text):
            headers = (declared_class if qualified else declared_function).get(name, [])
            # An overload declared in the definer's own layer (or above) is that layer's function.
            if headers and all(LAYERS.index(own) > LAYERS.index(layer) for _, layer in headers):
                what = f"a member of {name.rsplit('::', 1)[1]}" if qualified else name.rsplit("::", 1)[1]
                problems.append(f"{rel}:{number} ({own}) defines {what}, declared in {headers[0][0]} "
                                f"({headers[0][1]}), a lower layer")
    for p in problems:
        print(p)
    print(f"check_layers: {len(files)} files, {len(problems)} problem(s); layers, lowest first: {' < '.join(LAYERS)}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
