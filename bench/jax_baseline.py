#!/usr/bin/env python3
"""The GPT-J-style model of examples/gptj written in JAX: the baseline nax is compared with.

It trains the run that `gptj export` describes -- the same config, the same initial parameters
(DIR/model.safetensors, Hugging Face GPT-J names and layouts), the same batches
(DIR/batches.safetensors) and the same optimizer (DIR/export.json) -- on CPU devices arranged in
the same mesh, and reports the losses and tokens/s. The first-step loss equals nax's `gptj train`
first-step loss to float32 rounding.

The program is written in JAX's global view: one `jax.jit` of the whole training step, with the
parameters, the optimizer state and the batch placed on the mesh by `NamedSharding`s, following
mesh-transformer-jax and examples/gptj/model.cpp's axis rules:

    heads, mlp (d_ff) and vocab over `mp`;   batch over `dp`;   everything else replicated.

XLA's SPMD partitioner inserts the collectives.

The model (examples/gptj/block.h):
    x = wte[ids]
    per block:  h = LayerNorm(x);  x = x + attention(h) + mlp(h)        (parallel residual)
        attention: q, k, v, out without bias; rotary on the first rotary_dims of each head in
                   GPT-J's interleaved form; causal softmax scaled by 1/sqrt(head_dim)
        mlp:       gelu_tanh(h W_in^T + b_in) W_out^T + b_out
    logits = LayerNorm_f(x) lm_head^T + lm_head_bias;   loss = mean next-token cross-entropy
The training step (src/nn/optim.cpp): gradients, global-norm clipping, AdamW with bias
correction and decoupled weight decay on parameters of rank >= 2, warmup + cosine learning rate.

Usage:
    bench/jax_baseline.py --export DIR [--mesh dp=2,mp=2] [--steps K] [--json FILE]
                          [--expect-loss X] [--quiet]
Exit status: 0 done, 2 bad arguments or export, 3 the first-step loss differs from --expect-loss
by more than --loss-rtol (1e-4) relative.
"""

import argparse
import json
import math
import os
import sys
import time

import numpy as np

from baseline_common import add_export_args, check_first_loss, learning_rates, timed_steps, write_row

# ---------------------------------------------------------------------------------------------
# Files written by `gptj export`
# ---------------------------------------------------------------------------------------------

SAFETENSORS_DTYPES = {"F32": np.float32, "F64": np.float64, "I32": np.int32, "I64": np.int64}


def read_safetensors(path):
    """{name: numpy array} of a safetensors file: u64 little-endian header size, JSON header, data."""
    with open(path, "rb") as f:
        blob = f.read()
    (header_size,) = np.frombuffer(blob[:8], dtype="<u8")
    header = json.loads(blob[8 : 8 + int(header_size)])
    data = memoryview(blob)[8 + int(header_size) :]
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if entry["dtype"] not in SAFETENSORS_DTYPES:
            raise ValueError(f"{path}: tensor {name} has unsupported dtype {entry['dtype']}")
        begin, end = entry["data_offsets"]
        dtype = np.dtype(SAFETENSORS_DTYPES[entry["dtype"]]).newbyteorder("<")
        tensors[name] = np.frombuffer(data[begin:end], dtype=dtype).reshape(entry["shape"]).copy()
    return tensors


def parse_mesh(spec):
    """'dp=2,mp=2' -> {'dp': 2, 'mp': 2}, in the order given."""
    axes = {}
    for part in spec.split(","):
        name, _, size = part.partition("=")
        if not name or not size.isdigit() or int(size) < 1 or name in axes:
            raise ValueError(f"malformed mesh '{spec}' (expected e.g. dp=2,mp=2)")
        axes[name] = int(size)
    for name in ("dp", "mp"):
        if name not in axes:
            raise ValueError(f"the mesh {spec} has no '{name}' axis")
    return axes


def parse_args(argv):
    p = argparse.ArgumentParser(description="GPT-J baseline in JAX (jit + NamedSharding on CPU devices) on a `gptj export` folder.")
    add_export_args(p)
    p.add_argument("--mesh", help="mesh axes dp and mp, e.g. dp=2,mp=2 (default: the export's)")
    return p.parse_args(argv)


def load_export(args):
    with open(os.path.join(args.export, "export.json")) as f:
        info = json.load(f)
    mesh = parse_mesh(args.mesh or info["mesh"])
    steps = info["steps"] if args.steps is None else args.steps
    if not 1 <= steps <= info["steps"]:
        raise ValueError(f"--steps {steps}: the export has batches for 1 to {info['steps']} steps")
    dims = info["dims"]
    if dims["n_heads"] % mesh["mp"] or dims["d_ff"] % mesh["mp"] or dims["vocab"] % mesh["mp"]:
        raise ValueError(f"mesh {args.mesh}: mp must divide heads {dims['n_heads']}, d_ff {dims['d_ff']} and vocab {dims['vocab']}")
    if info["batch"] % mesh["dp"]:
        raise ValueError(f"mesh {args.mesh}: dp must divide the batch {info['batch']}")
    return info, mesh, steps


# ---------------------------------------------------------------------------------------------
# Command line first: the number of CPU devices must be set before JAX is imported.
# ---------------------------------------------------------------------------------------------

ARGS = parse_args(sys.argv[1:])
try:
    INFO, MESH_AXES, STEPS = load_export(ARGS)
except (OSError, ValueError, KeyError) as e:
    print(f"jax_baseline: {e}", file=sys.stderr)
    sys.exit(2)
N_DEVICES = MESH_AXES["dp"] * MESH_AXES["mp"]
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={N_DEVICES}").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------


class Dims:
    def __init__(self, d):
        self.vocab, self.d_model, self.n_layers = d["vocab"], d["d_model"], d["n_layers"]
        self.n_heads, self.head_dim, self.d_ff = d["n_heads"], d["head_dim"], d["d_ff"]
        self.rotary_dims, self.eps = d["rotary_dims"], d.get("layer_norm_eps", 1e-5)


def parameter_specs(dims):
    """PartitionSpec of every parameter, in Hugging Face layout (a linear weight is [out, in]; the
    attention projections' heads*head_dim side has the heads outermost, so cutting it over mp cuts
    whole heads)."""
    specs = {"transformer.wte.weight": P("mp", None)}  # [vocab, embed]
    for i in range(dims.n_layers):
        prefix = f"transformer.h.{i}."
        specs.update(
            {
                prefix + "ln_1.weight": P(),
                prefix + "ln_1.bias": P(),
                prefix + "attn.q_proj.weight": P("mp", None),  # [heads*head_dim, embed]
                prefix + "attn.k_proj.weight": P("mp", None),
                prefix + "attn.v_proj.weight": P("mp", None),
                prefix + "attn.out_proj.weight": P(None, "mp"),  # [embed, heads*head_dim]
                prefix + "mlp.fc_in.weight": P("mp", None),  # [mlp, embed]
                prefix + "mlp.fc_in.bias": P("mp"),
                prefix + "mlp.fc_out.weight": P(None, "mp"),  # [embed, mlp]
                prefix + "mlp.fc_out.bias": P(),
            }
        )
    specs.update(
        {
            "transformer.ln_f.weight": P(),
            "transformer.ln_f.bias": P(),
            "lm_head.weight": P("mp", None),  # [vocab, embed]
            "lm_head.bias": P("mp"),
        }
    )
    return specs


def layer_norm(x, scale, bias, eps):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * scale + bias


def gelu_tanh(x):
    return 0.5 * x * (1 + jnp.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def rotary(x, rotary_dims, base=10000.0):
    """GPT-J's rotary embedding on x [batch, seq, heads, head_dim]: on the first rotary_dims of
    head_dim, pair i = (x[2i], x[2i+1]) at position t turns by t * base^(-2i / rotary_dims)."""
    seq = x.shape[1]
    frequencies = base ** (-np.arange(0, rotary_dims, 2, dtype=np.float64) / rotary_dims)
    angles = np.arange(seq, dtype=np.float64)[:, None] * frequencies[None, :]  # [seq, pairs]
    cos = jnp.asarray(np.cos(angles), x.dtype)[None, :, None, :]
    sin = jnp.asarray(np.sin(angles), x.dtype)[None, :, None, :]
    rot, rest = x[..., :rotary_dims], x[..., rotary_dims:]
    x0, x1 = rot[..., 0::2], rot[..., 1::2]
    turned = jnp.stack([x0 * cos - x1 * sin, x1 * cos + x0 * sin], axis=-1).reshape(rot.shape)
    return jnp.concatenate([turned, rest], axis=-1)


class Model:
    def __init__(self, dims, mesh):
        self.dims = dims
        self.mesh = mesh

    def constrain(self, x, *spec):
        """Activation sharding as in mesh-transformer-jax (a hint; XLA would mostly find it)."""
        return jax.lax.with_sharding_constraint(x, NamedSharding(self.mesh, P(*spec)))

    def attention(self, p, prefix, h):
        d = self.dims
        batch, seq, _ = h.shape

        def heads(name):  # h [batch, seq, embed] @ W^T -> [batch, seq, heads, head_dim], heads over mp
            y = (h @ p[prefix + name].T).reshape(batch, seq, d.n_heads, d.head_dim)
            return self.constrain(y, "dp", None, "mp", None)

        q = rotary(heads("attn.q_proj.weight"), d.rotary_dims)
        k = rotary(heads("attn.k_proj.weight"), d.rotary_dims)
        v = heads("attn.v_proj.weight")
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(d.head_dim)
        causal = np.tril(np.ones((seq, seq), dtype=bool))
        scores = jnp.where(causal, scores, -jnp.inf)
        weights = jax.nn.softmax(scores, axis=-1)
        out = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(batch, seq, d.n_heads * d.head_dim)
        return out @ p[prefix + "attn.out_proj.weight"].T

    def mlp(self, p, prefix, h):
        hidden = gelu_tanh(h @ p[prefix + "mlp.fc_in.weight"].T + p[prefix + "mlp.fc_in.bias"])
        hidden = self.constrain(hidden, "dp", None, "mp")
        return hidden @ p[prefix + "mlp.fc_out.weight"].T + p[prefix + "mlp.fc_out.bias"]

    def logits(self, p, ids):
        d = self.dims
        x = self.constrain(p["transformer.wte.weight"][ids], "dp", None, None)  # [batch, seq, embed]
        for i in range(d.n_layers):
            prefix = f"transformer.h.{i}."
            h = layer_norm(x, p[prefix + "ln_1.weight"], p[prefix + "ln_1.bias"], d.eps)
            x = self.constrain(x + self.attention(p, prefix, h) + self.mlp(p, prefix, h), "dp", None, None)
        h = layer_norm(x, p["transformer.ln_f.weight"], p["transformer.ln_f.bias"], d.eps)
        logits = h @ p["lm_head.weight"].T + p["lm_head.bias"]
        return self.constrain(logits, "dp", None, "mp")  # [batch, seq, vocab], vocab over mp

    def loss(self, p, ids, targets):
        """Mean next-token cross-entropy over the global batch."""
        logits = self.logits(p, ids)
        picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
        return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - picked)


# ---------------------------------------------------------------------------------------------
# The training step: gradients, global-norm clipping, AdamW (as src/nn/optim.cpp)
# ---------------------------------------------------------------------------------------------


def make_train_step(model, opt):
    beta1, beta2, eps = opt["beta1"], opt["beta2"], opt["eps"]
    weight_decay, clip = opt["weight_decay"], opt["clip"]
    min_rank = opt.get("weight_decay_min_rank", 2)

    def train_step(params, state, ids, targets, lr):
        loss, grads = jax.value_and_grad(model.loss)(params, ids, targets)
        # Global-norm clipping: scale by clip / (norm + 1e-6) when the norm exceeds clip.
        norm = jnp.sqrt(sum(jnp.sum(jnp.square(g)) for g in jax.tree_util.tree_leaves(grads)))
        scale = jnp.where(norm > clip, clip / (norm + 1e-6), 1.0)
        grads = jax.tree_util.tree_map(lambda g: g * scale, grads)
        # AdamW with bias correction; decoupled weight decay on parameters of rank >= 2.
        count = state["count"] + 1
        correction1 = 1 - beta1 ** count.astype(jnp.float32)
        correction2 = 1 - beta2 ** count.astype(jnp.float32)
        new_params, new_m, new_v = {}, {}, {}
        for name, p in params.items():
            g = grads[name]
            m = state["m"][name] * beta1 + g * (1 - beta1)
            v = state["v"][name] * beta2 + jnp.square(g) * (1 - beta2)
            direction = (m / correction1) / (jnp.sqrt(v / correction2) + eps)
            if p.ndim >= min_rank and weight_decay > 0:
                direction = direction + p * weight_decay
            new_params[name] = p - direction * lr
            new_m[name], new_v[name] = m, v
        return new_params, {"m": new_m, "v": new_v, "count": count}, loss, norm

    return train_step


def main():
    info, mesh_axes, steps = INFO, MESH_AXES, STEPS
    say = (lambda *a: None) if ARGS.quiet else (lambda *a: print(*a, flush=True))
    dims = Dims(info["dims"])
    opt = info["optimizer"]
    batch, seq = info["batch"], info["seq"]

    if len(jax.devices()) < N_DEVICES:
        raise ValueError(f"JAX sees {len(jax.devices())} CPU device(s), the mesh needs {N_DEVICES}: "
                         f"is XLA_FLAGS ({os.environ['XLA_FLAGS']!r}) well formed?")
    devices = np.array(jax.devices()[:N_DEVICES]).reshape([mesh_axes[a] for a in mesh_axes])
    mesh = Mesh(devices, tuple(mesh_axes))
    mesh_str = ",".join(f"{a}={n}" for a, n in mesh_axes.items())
    model = Model(dims, mesh)

    # Parameters, optimizer state and batches, placed on the mesh.
    specs = parameter_specs(dims)
    host_params = read_safetensors(os.path.join(ARGS.export, "model.safetensors"))
    if set(host_params) != set(specs):
        missing, extra = sorted(set(specs) - set(host_params)), sorted(set(host_params) - set(specs))
        raise ValueError(f"model.safetensors does not hold the expected parameters (missing {missing[:3]}, unexpected {extra[:3]})")
    param_sharding = {name: NamedSharding(mesh, spec) for name, spec in specs.items()}
    params = {name: jax.device_put(host_params[name].astype(np.float32), param_sharding[name]) for name in specs}
    state = {
        "m": {name: jax.device_put(np.zeros_like(host_params[name], np.float32), param_sharding[name]) for name in specs},
        "v": {name: jax.device_put(np.zeros_like(host_params[name], np.float32), param_sharding[name]) for name in specs},
        "count": jax.device_put(np.int32(0), NamedSharding(mesh, P())),
    }
    state_sharding = {"m": param_sharding, "v": param_sharding, "count": NamedSharding(mesh, P())}
    data_sharding = NamedSharding(mesh, P("dp", None))
    host_batches = read_safetensors(os.path.join(ARGS.export, "batches.safetensors"))
    batches = [
        (jax.device_put(host_batches[f"ids.{k}"], data_sharding), jax.device_put(host_batches[f"targets.{k}"], data_sharding))
        for k in range(steps)
    ]
    lrs = learning_rates(info, steps)

    # One jitted step, parameters and state donated; compiled ahead so that no step times compilation.
    scalar = NamedSharding(mesh, P())
    step_fn = jax.jit(
        make_train_step(model, opt),
        in_shardings=(param_sharding, state_sharding, data_sharding, data_sharding, scalar),
        out_shardings=(param_sharding, state_sharding, scalar, scalar),
        donate_argnums=(0, 1),
    )
    t0 = time.perf_counter()
    lr0 = jax.device_put(np.float32(lrs[0]), scalar)
    compiled = step_fn.lower(params, state, batches[0][0], batches[0][1], lr0).compile()
    compile_s = time.perf_counter() - t0
    peak_bytes = None
    try:  # XLA's compile-time estimate of one device's memory for the step
        m = compiled.memory_analysis()
        peak_bytes = int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes)
    except Exception:  # not offered by every backend or version
        pass
    hlo = compiled.as_text() or ""
    collectives = {op: hlo.count(f" {op}(") + hlo.count(f" {op}-start(")
                   for op in ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")}

    say(f"jax_baseline: jax {jax.__version__}, config {info['config']}, mesh {mesh_str} ({N_DEVICES} CPU devices), "
        f"batch {batch} x seq {seq}, {steps} steps, compiled in {compile_s:.1f} s")
    trained = {"params": params, "state": state}

    def run_step(k, lr):
        ids, targets = batches[k]
        trained["params"], trained["state"], loss, norm = compiled(trained["params"], trained["state"], ids, targets,
                                                                  jax.device_put(np.float32(lr), scalar))
        loss = float(loss)  # waits for the step
        jax.block_until_ready(trained["params"])
        return loss, float(norm)

    losses, tokens_per_s = timed_steps(steps, batch * seq, lrs, run_step, say)
    print(f"jax: config {info['config']}, mesh {mesh_str}: first loss {losses[0]:.6f}, final loss {losses[-1]:.6f}, "
          f"{tokens_per_s:.0f} tokens/s (median over steps after the first), jax {jax.__version__}")
    row = {
        "sharding": "jax",
        "config": info["config"],
        "mesh": mesh_str,
        "tokens_per_s": tokens_per_s,
        "first_loss": losses[0],
        "final_loss": losses[-1],
        "losses": losses,
        "bytes_per_step": None,
        "collectives_per_step": None,
        "peak_bytes": peak_bytes,
        # Extras: where the figures come from.
        "peak_bytes_source": "xla_memory_analysis" if peak_bytes is not None else None,
        "hlo_collectives": collectives,
        "batch": batch,
        "seq": seq,
        "steps": steps,
        "compile_s": compile_s,
        "jax_version": jax.__version__,
    }
    write_row(ARGS.json, row)
    return check_first_loss("jax_baseline", losses[0], ARGS, say)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (OSError, ValueError, KeyError) as e:
        print(f"jax_baseline: {e}", file=sys.stderr)
        sys.exit(2)
