#!/usr/bin/env python3
"""Checks the global view's API (include/nax/global/global_ops.h) against the per-shard op list
(include/nax/ops/{ops,index_ops,transformer_ops}.h), so that the two cannot drift apart silently:
every per-shard op must have a global form of the same name, or be listed below as per-shard only
(with the reason) or as a global form still to write. A name listed but no longer declared is an
error too, so the lists stay true.

If this fails after you added a per-shard op: add its global form to include/nax/global/global_ops.h
(src/global/global_ops.cpp: a factor rule in src/global/propagation.cpp and the per-shard op underneath),
or add its name to PER_SHARD_ONLY or GLOBAL_TO_WRITE here, with the reason.

Usage: scripts/check_global_api.py [REPO_ROOT]
"""
import pathlib
import re
import sys

PER_SHARD_HEADERS = ["ops.h", "index_ops.h", "transformer_ops.h"]  # the collectives are per-shard by nature

# Per-shard only, by design: a global program makes its tensors from host values and placements
# (GlobalTensor::from_host, the runtime's sharded initialisers), and says layouts with placements.
PER_SHARD_ONLY = {
    "zeros": "a global tensor is made from host values or sharded initialisers (GlobalTensor)",
    "ones": "as zeros",
    "full": "as zeros",
    "scalar": "as zeros",
    "arange": "as zeros",
    "from_vector": "as zeros",
    "random_normal": "the runtime's sharded initialisers draw global tensors (Shard::random_normal)",
    "random_uniform": "as random_normal",
    "zeros_like": "as zeros",
    "ones_like": "as zeros",
    "full_like": "as zeros",
    "contiguous_copy": "memory layout is the per-shard view's concern; placements say the global layout",
}

# Global forms wanted and not written yet (wanted: min, slice, concat, where and the
# comparisons). Remove a name here when its global form lands.
GLOBAL_TO_WRITE = {
    "abs", "neg", "pow", "maximum", "minimum", "min", "eq", "ne", "lt", "le", "gt", "ge", "where",
    "slice", "concat", "stack", "squeeze", "expand_dims", "merge_axes", "split_axis",
    "dynamic_slice", "dynamic_update_slice", "one_hot", "scatter_add", "cumsum", "argmax", "argmin",
    "top_k",
}

DECL = re.compile(r"^(?:Tensor|TopK|GlobalTensor|int)\s+([a-z_0-9]+)\(", re.M)


def declared(path: pathlib.Path):
    return set(DECL.findall(path.read_text())) if path.exists() else set()


def main() -> int:
    repo = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[1])
    per_shard = set().union(*(declared(repo / "include" / "nax" / "ops" / h) for h in PER_SHARD_HEADERS))
    global_ops = declared(repo / "include" / "nax" / "global" / "global_ops.h")
    problems = []
    for name in sorted(per_shard - global_ops - set(PER_SHARD_ONLY) - GLOBAL_TO_WRITE):
        problems.append(f"per-shard op {name} has no global form in include/nax/global/global_ops.h: add one, or list it in "
                        f"PER_SHARD_ONLY or GLOBAL_TO_WRITE in scripts/check_global_api.py with the reason")
    for name in sorted((set(PER_SHARD_ONLY) | GLOBAL_TO_WRITE) - per_shard):
        problems.append(f"{name} is listed in scripts/check_global_api.py but no per-shard header declares it: remove it")
    for name in sorted(GLOBAL_TO_WRITE & global_ops):
        problems.append(f"{name} now has a global form: remove it from GLOBAL_TO_WRITE in scripts/check_global_api.py")
    for p in problems:
        print(p)
    print(f"check_global_api: {len(per_shard)} per-shard ops, {len(per_shard & global_ops)} with a global form, "
          f"{len(PER_SHARD_ONLY)} per-shard only, {len(GLOBAL_TO_WRITE)} to write; {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
