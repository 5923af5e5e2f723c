"""Compiles the LM's whole training step for accelerators without a device.

    python -m experiments.benchmarks.step_compile                 # every recipe x target
    python -m experiments.benchmarks.step_compile --recipes=mxfp8 --targets=H200,v5e
    python -m experiments.benchmarks.step_compile --targets=v5e:2x2,h200x4 \\
        --layouts=data,data_tensor                                 # sharded steps
    python -m experiments.benchmarks.step_compile --costs=docs/benchmarks/step_costs.md

A quantized ``DecoderLM`` under ``quantize_model``, ``value_and_grad`` and AdamW
(:func:`experiments.benchmarks.qtrain_step.lm_train_step`; a delayed-scaling recipe
carries its amax histories through the step), with the Pallas kernels forced on
(``kernels.implementation("pallas")``), compiled deviceless in a child process (the
toolchain and environment of :mod:`numerics.kernels.compile_check`) for

* one device: ``H200``, ``B200`` (the CUDA plugin, numerics/kernels/targets/*.txtpb),
  ``v5e``, ``v6e`` (libtpu's compile-only topologies): :data:`compile_check.TARGETS`;
* four devices: ``v5e:2x2`` (a TPU v5e slice) and ``h200x4`` (4 H200s, ``topology=
  "1x1x4"``), in the layouts ``data`` (a 4-way mesh ``("data",)``: the batch split, the
  parameters replicated) and ``data_tensor`` (a 2 x 2 mesh ``("data", "model")``: the
  batch over ``data``; ``qkv`` and ``ff_in`` by columns, ``attn_out`` and ``ff_out`` by
  rows over ``model``, Megatron-style).

``--native`` adds each recipe's ``recipes.with_native_gemm`` variant (where the recipe
has one). Per compile: seconds (wall, CPU, trace, lowering), the kernel calls, the
GEMMs and their operand types (:mod:`numerics.kernels.hlo_program`), and FLOPs and
bytes (XLA's cost analysis plus the kernel calls', :func:`_costs`). ``--costs=FILE``
writes the roofline estimate per recipe and target, ``max(FLOPs / bf16 peak, bytes /
HBM bandwidth)`` with ``compile_check.TARGETS``' figures, as markdown
(:mod:`experiments.benchmarks.step_costs`). It lives in experiments/ because it builds
the LM.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Sequence

from absl import app
from absl import flags

from experiments.common.harness.config_flags import parse_flags
from lowprec.numerics.kernels import compile_check

SINGLE = tuple(t.name for t in compile_check.TARGETS)  # H200, B200, v5e, v6e
SHARDED = ("v5e:2x2", "h200x4")
TARGETS = SINGLE + SHARDED
LAYOUTS = ("data", "data_tensor")  # of the sharded targets; one device: "single"
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_COLUMNS, _ROWS = ("qkv", "ff_in"), ("attn_out", "ff_out")


@dataclasses.dataclass(frozen=True)
class Size:
  """The LM and batch a compile builds (``batch`` sequences per device)."""
  d_model: int
  num_layers: int
  d_ff: int
  seq_len: int
  batch: int
  num_heads: int = 2
  vocab_size: int = 64


# "ci": what the compile tests build (1-30 CPU seconds a compile); "table": the cost
# table's, nearer a real step (a TPU compile of it takes minutes).
SIZES = {"ci": Size(d_model=64, num_layers=1, d_ff=256, seq_len=32, batch=4),
         "table": Size(d_model=512, num_layers=2, d_ff=2048, seq_len=256, batch=8,
                       num_heads=4, vocab_size=256)}


@dataclasses.dataclass(frozen=True)
class Case:
  """One compile: a recipe name (its native-GEMM variant if ``native``) on a target."""
  recipe: str
  target: str
  layout: str = "single"
  native: bool = False

  @property
  def label(self) -> str:
    return f"{self.recipe}{' native' if self.native else ''} {self.target} {self.layout}"


def native_recipes(names: Sequence[str]) -> list[str]:
  """The recipes among ``names`` that ``recipes.with_native_gemm`` accepts."""
  from lowprec.numerics import recipes  # pylint: disable=g-import-not-at-top
  return [name for name in names if recipes.has_native_gemm(name)]


def _devices(target: str):
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  if target in SINGLE:
    return [compile_check.target_device(
        next(t for t in compile_check.TARGETS if t.name == target))]
  if target == "v5e:2x2":
    return topologies.get_topology_desc(topology_name="v5e:2x2", platform="tpu").devices
  if target == "h200x4":
    with open(os.path.join(_ROOT, "numerics", "kernels", "targets", "h200.txtpb")) as f:
      spec = f.read()
    return topologies.get_topology_desc(platform="cuda", topology_name="",
                                        target_config=spec, topology="1x1x4").devices
  raise ValueError(f"unknown target {target!r}; known: {', '.join(TARGETS)}")


def _param_spec(path, leaf, layout: str):
  from jax.sharding import PartitionSpec as P  # pylint: disable=g-import-not-at-top
  names = [str(getattr(k, "key", k)) for k in path]
  if layout == "data_tensor" and leaf.ndim == 2 and names[-1] == "kernel":
    if any(n in names for n in _COLUMNS):
      return P(None, "model")
    if any(n in names for n in _ROWS):
      return P("model", None)
  return P()


_KERNEL_CALLS = ("tpu_custom_call", "__gpu$xla.gpu.triton")  # Pallas' Mosaic and Triton


def _costs(compiled, gemms, calls) -> dict:
  """FLOPs and bytes of a compiled program: XLA's cost analysis plus its custom calls
  (``gemms`` and ``calls``: :func:`hlo_program.gemms` and :func:`hlo_program.custom_calls`
  of its text).

  The TPU compiler fills ``cost_analysis()``; the GPU one returns nothing deviceless,
  so the optimized GPU module goes through XLA's generic HLO cost analysis (fusions and
  the gemm fusions' dots included). Both count a custom call as unknown (the generic
  one as -1, undone here), so the Pallas kernels' and the GEMM library calls' operand
  and result bytes, and those GEMMs' FLOPs, are added from the HLO text
  (:mod:`numerics.kernels.hlo_program`); other custom calls (the TPU's gather
  annotations) are left out. A loop's body counts once."""
  from lowprec.numerics.kernels import hlo_program  # pylint: disable=g-import-not-at-top
  analysis, source = compiled.cost_analysis(), "cost_analysis()"
  undo = 0
  if not analysis:
    import jax  # pylint: disable=g-import-not-at-top
    from jax._src.lib import xla_client  # pylint: disable=g-import-not-at-top
    module = compiled.runtime_executable().hlo_modules()[0]
    analysis = xla_client._xla.hlo_module_cost_analysis(  # pylint: disable=protected-access
        jax.extend.backend.get_backend("cpu"), module)
    source, undo = "generic HLO cost analysis", len(calls)
  if isinstance(analysis, list):
    analysis = analysis[0] if analysis else {}
  xla_flops = float(analysis.get("flops") or 0.0) + undo
  xla_bytes = float(analysis.get("bytes accessed") or 0.0) + undo
  kernel_bytes = sum(c.operand_bytes + c.result_bytes for c in calls
                     if c.target in _KERNEL_CALLS)
  call_bytes = sum(c.operand_bytes + c.result_bytes for c in calls
                   if hlo_program.is_gemm_call(c.target))
  call_flops = sum(g.flops or 0.0 for g in gemms if g.op == "custom-call")
  return dict(xla_flops=xla_flops, xla_bytes=xla_bytes, kernel_bytes=kernel_bytes,
              library_call_bytes=call_bytes, library_call_flops=call_flops,
              flops=xla_flops + call_flops, bytes=xla_bytes + kernel_bytes + call_bytes,
              cost_source=source)


def _abstract_args(model, opt, mesh, layout: str, size: Size):
  """``(state, tokens, key)`` of the step as ShapeDtypeStructs placed on ``mesh``."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from jax.sharding import NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top
  from experiments.benchmarks import qtrain_step  # pylint: disable=g-import-not-at-top

  def abstract(spec_of, tree):
    return jax.tree_util.tree_map_with_path(lambda p, a: jax.ShapeDtypeStruct(
        a.shape, a.dtype, sharding=NamedSharding(mesh, spec_of(p, a))), tree)

  batch = size.batch * mesh.devices.size
  state = jax.eval_shape(lambda: qtrain_step.lm_train_state(
      model, opt, jnp.zeros((batch, size.seq_len), jnp.int32), jax.random.key(1)))
  return (abstract(lambda p, a: _param_spec(p, a, layout), state),
          abstract(lambda p, a: P("data"),
                   jax.ShapeDtypeStruct((batch, size.seq_len + 1), jnp.int32)),
          abstract(lambda p, a: P(), jax.eval_shape(lambda: jax.random.key(0))))


def compile_step(case: Case, size: Size) -> dict:
  """Compiles ``case`` in this process (a child with ``JAX_PLATFORMS=cpu``); returns
  ``{ok, seconds, cpu_s, trace_s, lower_s, error, kernel_calls, gemms, narrow_gemms,
  flops, bytes, ...}`` (:func:`_costs`)."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  from jax.sharding import Mesh  # pylint: disable=g-import-not-at-top
  from experiments.benchmarks import qtrain_step  # pylint: disable=g-import-not-at-top
  from experiments.common.trainers import recipe_flag  # pylint: disable=g-import-not-at-top
  from lowprec.models import transformer  # pylint: disable=g-import-not-at-top
  from lowprec.numerics import kernels  # pylint: disable=g-import-not-at-top
  from lowprec.numerics import recipes  # pylint: disable=g-import-not-at-top
  from lowprec.numerics.kernels import hlo_program  # pylint: disable=g-import-not-at-top

  devices = np.array(_devices(case.target))
  if (case.layout == "single") != (len(devices) == 1) or case.layout not in (
      ("single",) + LAYOUTS):
    raise ValueError(f"layout {case.layout!r} does not fit target {case.target!r}")
  mesh = (Mesh(devices.reshape(2, 2), ("data", "model")) if case.layout == "data_tensor"
          else Mesh(devices, ("data",)))
  recipe = recipes.get(case.recipe)
  if case.native:
    recipe = recipes.with_native_gemm(recipe)
  cfg = transformer.TransformerConfig(
      vocab_size=size.vocab_size, d_model=size.d_model, num_layers=size.num_layers,
      num_heads=size.num_heads, d_ff=size.d_ff, max_len=size.seq_len)
  model = recipe_flag.quantized_model(transformer.DecoderLM(cfg), recipe)
  opt = optax.adamw(1e-3)
  args = _abstract_args(model, opt, mesh, case.layout, size)
  step = qtrain_step.lm_train_step(model, opt)

  t0, cpu0 = time.perf_counter(), time.process_time()
  stages = {}
  try:
    with kernels.implementation("pallas"):
      traced = jax.jit(step).trace(*args)
      stages["trace_s"] = time.perf_counter() - t0
      lowered = traced.lower()
      stages["lower_s"] = time.perf_counter() - t0 - stages["trace_s"]
      compiled = lowered.compile()
  except Exception as e:  # pylint: disable=broad-except  (reported, not hidden)
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return dict(ok=False, seconds=time.perf_counter() - t0,
                cpu_s=time.process_time() - cpu0, **stages,
                error=f"{type(e).__name__}: {first}"[:400], kernel_calls=0, gemms={},
                narrow_gemms=0, flops=None, bytes=None)
  seconds, stages["cpu_s"] = time.perf_counter() - t0, time.process_time() - cpu0
  text = compiled.as_text()
  gemms, calls = hlo_program.gemms(text), hlo_program.custom_calls(text)
  return dict(ok=True, seconds=seconds, error=None, **stages,
              kernel_calls=sum(c.target in _KERNEL_CALLS for c in calls),
              gemms=hlo_program.summary(gemms), narrow_gemms=sum(g.narrow for g in gemms),
              **_costs(compiled, gemms, calls))


def run_child(cases: Sequence[Case], *, toolchain: str | None, size: str = "ci",
              timeout_s: float | None = None) -> list[dict]:
  """Compiles ``cases`` in one child process (the compile toolchain's environment,
  :func:`numerics.kernels.compile_check._child_env`); one dict per case: the case's
  fields and :func:`compile_step`'s."""
  env = compile_check._child_env(toolchain)  # pylint: disable=protected-access
  # The kernel check fails a kernel that spills registers; a whole step also holds
  # XLA's own fusions, which XLA compiles with a spill where it must (fp8_delayed's amax
  # reductions spill 12 bytes on H200): not a failure here.
  env["XLA_FLAGS"] = " ".join(f for f in env["XLA_FLAGS"].split()
                              if f != compile_check._SPILL_FLAG)  # pylint: disable=protected-access
  env["PYTHONPATH"] = os.pathsep.join([p for p in [env.get("PYTHONPATH"), _ROOT] if p])
  with tempfile.TemporaryDirectory() as tmp:
    spec, out = os.path.join(tmp, "cases.json"), os.path.join(tmp, "results.json")
    with open(spec, "w") as f:
      json.dump([dataclasses.asdict(c) for c in cases], f)
    cmd = [sys.executable, "-m", "experiments.benchmarks.step_compile", "--child",
           f"--case_file={spec}", f"--size={size}", f"--json={out}"]
    proc = subprocess.run(cmd, env=env, cwd=_ROOT, capture_output=True, text=True,
                          timeout=timeout_s, check=False)
    if proc.returncode != 0 or not os.path.exists(out):
      raise RuntimeError(f"the step compile's child failed (rc={proc.returncode}):\n"
                         f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    with open(out) as f:
      return json.load(f)


def product(recipes: Sequence[str], targets: Sequence[str], layouts: Sequence[str],
            native: bool) -> list[Case]:
  """Every recipe on every target (every layout of a sharded one); with ``native``,
  also each native-capable recipe's variant on the GPU targets."""
  natives = set(native_recipes(recipes)) if native else set()
  out = []
  for t in targets:
    for layout in (["single"] if t in SINGLE else layouts):
      for r in recipes:
        out.append(Case(r, t, layout))
        if r in natives and t in ("H200", "B200", "h200x4"):
          out.append(Case(r, t, layout, native=True))
  return out


def define_flags() -> None:
  """This script's flags (defined only when it runs as a script)."""
  flags.DEFINE_list("recipes", None, "Recipes to compile (default: every built-in one).")
  flags.DEFINE_list("targets", list(SINGLE), "Targets: " + ", ".join(TARGETS) + ".")
  flags.DEFINE_list("layouts", list(LAYOUTS), "Layouts of the 4-device targets.")
  flags.DEFINE_bool("native", False, "Also compile each recipe's with_native_gemm "
                    "variant on the GPU targets.")
  flags.DEFINE_enum("size", "ci", list(SIZES), "The LM's size (see SIZES).")
  flags.DEFINE_string("toolchain", None, "Directory holding the compile toolchain.")
  flags.DEFINE_string("json", None, "Write the results here.")
  flags.DEFINE_string("costs", None, "Write the cost table (markdown) here.")
  flags.DEFINE_bool("child", False, "The script's own child process (internal).")
  flags.DEFINE_string("case_file", None, "The child's cases (internal).")


def _child_main(f) -> int:
  with open(f.case_file) as spec:
    cases = [Case(**c) for c in json.load(spec)]
  results = [dict(dataclasses.asdict(c), **compile_step(c, SIZES[f.size])) for c in cases]
  with open(f.json, "w") as out:
    json.dump(results, out)
  return 0


def main(argv: Sequence[str]) -> int:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  f = flags.FLAGS
  if f.child:
    return _child_main(f)
  from experiments.common.trainers import recipe_flag  # pylint: disable=g-import-not-at-top
  recipes = f.recipes if f.recipes is not None else list(recipe_flag.available_recipes())
  for name, given, known in (("--targets", f.targets, TARGETS),
                             ("--layouts", f.layouts, LAYOUTS),
                             ("--recipes", recipes, recipe_flag.available_recipes())):
    unknown = [v for v in given if v not in known]
    if unknown or not given:
      what = f"unknown {', '.join(unknown)}" if unknown else "none given"
      print(f"error: {name}: {what}; known: {', '.join(known)}", file=sys.stderr)
      return 2
  if f.toolchain is None and (why := compile_check.toolchain_missing()):
    print(f"error: {why}", file=sys.stderr)
    return 2
  t0 = time.perf_counter()
  results = run_child(product(recipes, f.targets, f.layouts, f.native),
                      toolchain=f.toolchain, size=f.size)
  import jax  # pylint: disable=g-import-not-at-top
  report = dict(  # the toolchain's path is this machine's, not part of the command
      command=" ".join(["python -m experiments.benchmarks.step_compile"] + [
          "--toolchain=DIR" if a.startswith("--toolchain=") else a for a in sys.argv[1:]]),
      jax=jax.__version__, date=datetime.date.today().isoformat(),
      seconds=time.perf_counter() - t0, size=dataclasses.asdict(SIZES[f.size]),
      results=results)
  print(f"{len(results)} compiles in {report['seconds']:.0f} s (size {f.size}: "
        f"{SIZES[f.size]})\n")
  print("| recipe | target | layout | compiles | kernel calls | narrow GEMMs | seconds |")
  print("|---|---|---|---|---|---|---|")
  for r in results:
    print(f"| {r['recipe']}{' native' if r['native'] else ''} | {r['target']} | "
          f"{r['layout']} | {'yes' if r['ok'] else 'FAILS: ' + r['error']} | "
          f"{r['kernel_calls']} | {r['narrow_gemms']} | {r['seconds']:.1f} |")
  if f.json:
    with open(f.json, "w") as out:
      json.dump(report, out, indent=1)
  if f.costs:
    from experiments.benchmarks import step_costs  # pylint: disable=g-import-not-at-top
    with open(f.costs, "w") as out:
      out.write(step_costs.markdown(report))
  return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
  define_flags()
  app.run(lambda argv: sys.exit(main(argv)), flags_parser=parse_flags)
