"""Compiles a sharded training step of the LM for 4 TPU chips or 4 GPUs, without a device.

    python -m experiments.benchmarks.sharded_step_compile        # the product
    python -m experiments.benchmarks.sharded_step_compile --recipes=mxfp8 \\
        --topologies=v5e:2x2 --layouts=data

A quantized ``DecoderLM`` (tiny: 1 layer, d 64, 4 x 32 tokens a device) under
``quantize_model``, ``value_and_grad`` and AdamW, with the Pallas kernels forced on
(``kernels.implementation("pallas")``), compiled deviceless (the recipe of
:mod:`numerics.kernels.compile_check`, which supplies the toolchain and the child
process) for a 4-device topology:

* ``v5e:2x2``: a TPU v5e slice of 4 chips (libtpu's compile-only topology);
* ``h200x4``: 4 H200 GPUs (the CUDA plugin, ``topology="1x1x4"``,
  numerics/kernels/targets/h200.txtpb).

Layouts: ``data`` (a 4-way mesh ``("data",)``, the batch split, the parameters
replicated) and ``data_tensor`` (a 2 x 2 mesh ``("data", "model")``: the batch over
``data``, the feed-forward and attention projections Megatron-style over ``model``:
``qkv`` and ``ff_in`` by columns, ``attn_out`` and ``ff_out`` by rows). Before issue 53
item 6 the quantized steps failed on the TPU slice ("Mosaic kernels cannot be
automatically partitioned"). It lives in experiments/ because it builds the LM.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Sequence

from absl import app
from absl import flags

from experiments.common.config_flags import parse_flags

TOPOLOGIES = ("v5e:2x2", "h200x4")
LAYOUTS = ("data", "data_tensor")
RECIPES = ("bf16", "mxfp8", "nvfp4")
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_COLUMNS, _ROWS = ("qkv", "ff_in"), ("attn_out", "ff_out")


def _devices(topology: str):
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  if topology == "v5e:2x2":
    return topologies.get_topology_desc(topology_name="v5e:2x2", platform="tpu").devices
  if topology == "h200x4":
    with open(os.path.join(_ROOT, "numerics", "kernels", "targets", "h200.txtpb")) as f:
      spec = f.read()
    return topologies.get_topology_desc(platform="cuda", topology_name="",
                                        target_config=spec, topology="1x1x4").devices
  raise ValueError(f"unknown topology {topology!r}; known: {', '.join(TOPOLOGIES)}")


def _param_spec(path, leaf, layout: str):
  from jax.sharding import PartitionSpec as P  # pylint: disable=g-import-not-at-top
  names = [str(getattr(k, "key", k)) for k in path]
  if layout == "data_tensor" and leaf.ndim == 2 and names[-1] == "kernel":
    if any(n in names for n in _COLUMNS):
      return P(None, "model")
    if any(n in names for n in _ROWS):
      return P("model", None)
  return P()


def compile_step(recipe: str, topology: str, layout: str) -> dict:
  """Compiles the step in this process (a child with ``JAX_PLATFORMS=cpu``); returns
  ``{ok, seconds, error, kernel_calls}``."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top
  from experiments.benchmarks.qtrain_step import lm_train_step  # pylint: disable=g-import-not-at-top
  from experiments.common import recipe_flag  # pylint: disable=g-import-not-at-top
  from lowprec.models import transformer  # pylint: disable=g-import-not-at-top
  from lowprec.numerics import kernels  # pylint: disable=g-import-not-at-top

  if layout not in LAYOUTS:
    raise ValueError(f"unknown layout {layout!r}; known: {', '.join(LAYOUTS)}")
  devices = np.array(_devices(topology))
  mesh = (Mesh(devices, ("data",)) if layout == "data" else
          Mesh(devices.reshape(2, 2), ("data", "model")))
  cfg = transformer.TransformerConfig(vocab_size=64, d_model=64, num_layers=1,
                                      num_heads=2, d_ff=256, max_len=32)
  model = recipe_flag.quantized_model(transformer.DecoderLM(cfg), recipe)
  opt = optax.adamw(1e-3)
  batch, length = 4 * len(devices), 32

  def init():
    params = model.init(jax.random.key(1), jnp.zeros((batch, length), jnp.int32),
                        jax.random.key(2))
    return params, opt.init(params)

  def abstract(spec_of, tree):
    return jax.tree_util.tree_map_with_path(lambda p, a: jax.ShapeDtypeStruct(
        a.shape, a.dtype, sharding=NamedSharding(mesh, spec_of(p, a))), tree)

  state = abstract(lambda p, a: _param_spec(p, a, layout), jax.eval_shape(init))
  tokens = abstract(lambda p, a: P("data"),
                    jax.ShapeDtypeStruct((batch, length + 1), jnp.int32))
  key = abstract(lambda p, a: P(), jax.eval_shape(lambda: jax.random.key(0)))

  step = lm_train_step(model, opt)

  t0 = time.perf_counter()
  try:
    with kernels.implementation("pallas"):
      text = jax.jit(step).trace(state, tokens, key).lower().compile().as_text()
  except Exception as e:  # pylint: disable=broad-except  (reported, not hidden)
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return dict(ok=False, seconds=time.perf_counter() - t0,
                error=f"{type(e).__name__}: {first}"[:400], kernel_calls=0)
  calls = text.count("tpu_custom_call") + text.count("__gpu$xla.gpu.triton")
  return dict(ok=True, seconds=time.perf_counter() - t0, error=None, kernel_calls=calls)


def run_child(cases: Sequence[tuple[str, str, str]], *, toolchain: str | None,
              timeout_s: float | None = None) -> list[dict]:
  """Compiles ``(recipe, topology, layout)`` cases in a child process (the compile
  toolchain's environment, :func:`numerics.kernels.compile_check._child_env`)."""
  from lowprec.numerics.kernels import compile_check  # pylint: disable=g-import-not-at-top
  env = compile_check._child_env(toolchain)  # pylint: disable=protected-access
  env["PYTHONPATH"] = os.pathsep.join([p for p in [env.get("PYTHONPATH"), _ROOT] if p])
  with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "results.json")
    cmd = [sys.executable, "-m", "experiments.benchmarks.sharded_step_compile", "--child",
           "--cases=" + ";".join(",".join(c) for c in cases), f"--json={out}"]
    proc = subprocess.run(cmd, env=env, cwd=_ROOT, capture_output=True, text=True,
                          timeout=timeout_s, check=False)
    if proc.returncode != 0 or not os.path.exists(out):
      raise RuntimeError(f"the step compile's child failed (rc={proc.returncode}):\n"
                         f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    with open(out) as f:
      return json.load(f)


def define_flags() -> None:
  """This script's flags (defined only when it runs as a script)."""
  flags.DEFINE_list("recipes", list(RECIPES), "Recipes to compile.")
  flags.DEFINE_list("topologies", list(TOPOLOGIES), "Topologies to compile for.")
  flags.DEFINE_list("layouts", list(LAYOUTS), "Layouts: data, data_tensor.")
  flags.DEFINE_string("toolchain", None, "Directory holding the compile toolchain.")
  flags.DEFINE_string("json", None, "Write the results here.")
  flags.DEFINE_bool("child", False, "The script's own child process (internal).")
  flags.DEFINE_string("cases", "", "The child's cases (internal).")


def main(argv: Sequence[str]) -> int:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  f = flags.FLAGS
  if f.child:
    cases = [tuple(c.split(",")) for c in f.cases.split(";") if c]
    results = [dict(recipe=r, topology=t, layout=l, **compile_step(r, t, l))
               for r, t, l in cases]
    with open(f.json, "w") as out:
      json.dump(results, out)
    return 0
  from experiments.common import recipe_flag  # pylint: disable=g-import-not-at-top
  for name, given, known in (("--topologies", f.topologies, TOPOLOGIES),
                             ("--layouts", f.layouts, LAYOUTS),
                             ("--recipes", f.recipes, recipe_flag.available_recipes())):
    unknown = [v for v in given if v not in known]
    if unknown or not given:
      what = f"unknown {', '.join(unknown)}" if unknown else "none given"
      print(f"error: {name}: {what}; known: {', '.join(known)}", file=sys.stderr)
      return 2
  cases = [(r, t, l) for t in f.topologies for l in f.layouts for r in f.recipes]
  results = run_child(cases, toolchain=f.toolchain)
  print("| recipe | topology | layout | compiles | kernel calls | seconds |")
  print("|---|---|---|---|---|---|")
  for r in results:
    print(f"| {r['recipe']} | {r['topology']} | {r['layout']} | "
          f"{'yes' if r['ok'] else 'FAILS: ' + r['error']} | {r['kernel_calls']} | "
          f"{r['seconds']:.1f} |")
  if f.json:
    with open(f.json, "w") as out:
      json.dump(results, out, indent=1)
  return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
  define_flags()
  app.run(lambda argv: sys.exit(main(argv)), flags_parser=parse_flags)
