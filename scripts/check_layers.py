#!/usr/bin/env python3
"""Checks that nax's layers only look down: no #include from a lower layer to a higher one.

The layers, lowest first (docs/architecture.md describes each):
  core      include/nax/core, include/nax/tensor.h, src/core
  io        include/nax/io, src/io (reading the files nax is given: size caps, the bounded JSON reader, output paths)
  trace     include/nax/trace.h, src/trace (the timeline recorder; it uses core only)
  kernels   include/nax/kernels, src/kernels (cpu, cuda)
  comm      include/nax/comm, src/comm (local, mpi, nccl)
  runtime   include/nax/runtime.h, src/runtime
  ops       include/nax/{ops,collectives,async_collectives,index_ops,transformer_ops,autodiff}.h,
            src/ops (the ops, their backward functions and the tape they record on)
  autodiff  src/autodiff (the backward pass over the tape: grad, value_and_grad)
  debug     include/nax/debug, src/debug (the op recorder and the mesh-comparison locator; ops, runtime, trace)
  global    include/nax/global, src/global
  nn        include/nax/nn, src/nn
  checkpoint include/nax/checkpoint.h, include/nax/checkpoint, src/checkpoint (files, safetensors, sharded)
  text      include/nax/text, src/text (the tokenizer, its own library nax::text; it uses core, io and checkpoint's files)
  (all)     include/nax/nax.h, the umbrella header, may include everything.

A file may include its own layer and any layer below it. A new header at include/nax/ must be
given its layer in TOP_LEVEL_HEADERS below; a new folder, in LAYERS.

Usage: scripts/check_layers.py [REPO_ROOT]   (exit 1 and one line per violation if any)
"""
import pathlib
import re
import sys

LAYERS = ["core", "io", "trace", "kernels", "comm", "runtime", "ops", "autodiff", "debug", "global", "nn", "checkpoint", "text"]
TOP_LEVEL_HEADERS = {
    "tensor.h": "core",  # the value type; its methods are defined by the op layer (src/ops/tensor.cpp)
    "trace.h": "trace",
    "runtime.h": "runtime",
    "ops.h": "ops",
    "collectives.h": "ops",
    "async_collectives.h": "ops",
    "index_ops.h": "ops",
    "transformer_ops.h": "ops",
    "vary_checks.h": "ops",
    # Declares grad mode, parameter and stop_gradient, which ops consult and src/ops/node.cpp defines
    # with the tape, and grad / value_and_grad, which the autodiff layer (src/autodiff) defines.
    "autodiff.h": "ops",
    "checkpoint.h": "checkpoint",
    "nax.h": None,  # the umbrella header
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def layer_of(path: str):
    """The layer of a path relative to the repository (include/nax/... or src/...), or raises."""
    parts = path.split("/")
    if parts[0] == "include" and len(parts) >= 3 and parts[1] == "nax":
        rest = parts[2:]
    elif parts[0] == "src" and len(parts) >= 2:
        rest = parts[1:]
    else:
        raise KeyError(path)
    if len(rest) == 1 and parts[0] == "include":
        if rest[0] not in TOP_LEVEL_HEADERS:
            raise KeyError(f"{path}: give include/nax/{rest[0]} a layer in TOP_LEVEL_HEADERS")
        return TOP_LEVEL_HEADERS[rest[0]]
    if rest[0] in LAYERS:
        return rest[0]
    raise KeyError(f"{path}: folder '{rest[0]}' is in no layer; add it to LAYERS")


def resolve(include: str, repo: pathlib.Path):
    """The repository path an include names: "nax/..." is include/nax/..., other paths are src/..."""
    if include.startswith("nax/"):
        return "include/" + include
    if (repo / "src" / include).exists():
        return "src/" + include
    return None  # a file beside the includer, a generated header or a test helper


def main() -> int:
    repo = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[1])
    files = sorted(p for d in ("include/nax", "src") for p in (repo / d).rglob("*")
                   if p.suffix in {".h", ".cpp", ".cu", ".cuh"})
    problems = []
    for file in files:
        rel = file.relative_to(repo).as_posix()
        try:
            own = layer_of(rel)
        except KeyError as e:
            problems.append(f"{rel}: {e.args[0]}")
            continue
        if own is None:
            continue
        for include in INCLUDE.findall(file.read_text(errors="replace")):
            target = resolve(include, repo)
            if target is None:
                continue
            try:
                theirs = layer_of(target)
            except KeyError as e:
                problems.append(f"{rel}: includes {include}: {e.args[0]}")
                continue
            if theirs is None or LAYERS.index(theirs) > LAYERS.index(own):
                problems.append(f"{rel} ({own}) includes {include} ({theirs or 'the umbrella header'}), a higher layer")
    for p in problems:
        print(p)
    print(f"check_layers: {len(files)} files, {len(problems)} problem(s); layers, lowest first: {' < '.join(LAYERS)}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
