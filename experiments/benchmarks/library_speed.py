"""Speed of the quantization library as a user meets it: ratios measured in one run.

    python -m experiments.benchmarks.library_speed                  # all three parts
    python -m experiments.benchmarks.library_speed --repeats=10 --size=16777216

1. Training step of a plain 4-layer, 1024-wide linen MLP (batch 512, Adam) quantized
   with ``models.quantize_model`` (one rule for every layer), per recipe, divided by
   the bf16 step. ``fp32`` (no quantization, float32 GEMMs) is the floor of the
   recipes whose GEMMs run in float32 (``nvfp4``, ``fp8``): the rest of their step is
   quantization.
2. Telemetry: the nvfp4 step with ``telemetry=True`` (sown and returned) and with
   ``telemetry=False``, each divided by the same step with numerics.qdot's dot_general
   injected by hand into ``nn.Dense`` (no interception machinery): off should be 1.
3. Operands (``--parts=operands``, not run by default): what the nvfp4 recipe adds to
   one layer, per ``(batch, width)`` operand -- NVFP4 quantize-dequantize to nearest
   and stochastically (block values and tensor scale, as the GEMM takes them) and the
   16-point RHT along the token axis -- each divided by the layer's bf16 forward GEMM.
4. ``quantize_nvfp4`` (codes + scales), NVFP4 quantize-dequantize and ``quantize_mx``
   on ``--size`` float32 elements, as elements/s relative to a plain copy (``x + 1``:
   one read, one write) -- the metric of ``experiments.benchmarks.numerics_throughput``.

The timed functions of a part are called in turn, ``--repeats`` rounds, after a
warm-up, and every figure is a ratio to a baseline timed in the same rounds, so machine
load cancels to first order: the ratio of the fastest calls, and (step part) the median
and range of the per-round ratios, which a slow spell during one call moves less. On a
shared machine run it more than once and report the spread.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from absl import app
from absl import flags
from flax import linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from experiments.common.harness.config_flags import parse_flags
from lowprec import models
from lowprec import numerics
from lowprec.numerics import kernels
from lowprec.numerics import qdot
from lowprec.numerics import quantizer
from lowprec.numerics.rounding import Stochastic


class MLP(nn.Module):
  """``layers`` Dense layers with GELU; ``dot_general`` injects a matmul (part 2)."""

  width: int
  layers: int
  dot_general: Any = None

  @nn.compact
  def __call__(self, x):
    kw = {} if self.dot_general is None else dict(dot_general=self.dot_general)
    for i in range(self.layers - 1):
      x = nn.gelu(nn.Dense(self.width, name=f"dense_{i}", **kw)(x))
    return nn.Dense(self.width, name=f"dense_{self.layers - 1}", **kw)(x)


def interleaved_times(fns: dict[str, Callable[[], Any]], repeats: int
                      ) -> dict[str, np.ndarray]:
  """Seconds of each call of each function (``repeats`` each), calling them in turn."""
  for f in fns.values():
    jax.block_until_ready(f())  # compile and warm up
  times = {name: np.zeros(repeats) for name in fns}
  for i in range(repeats):
    for name, f in fns.items():
      t0 = time.perf_counter()
      jax.block_until_ready(f())
      times[name][i] = time.perf_counter() - t0
  return times


def interleaved_min(fns: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
  """Seconds of the fastest call of each function, calling them in turn each round."""
  return {name: float(t.min()) for name, t in interleaved_times(fns, repeats).items()}


def train_step(model: nn.Module, sow: bool = False) -> Callable[[], Any]:
  """A no-argument call of one jitted Adam training step of ``model``."""
  x = jax.random.normal(jax.random.key(0), (flags.FLAGS.batch, flags.FLAGS.width))
  y = jax.random.normal(jax.random.key(1), (flags.FLAGS.batch, flags.FLAGS.width))
  rngs = {"params": jax.random.key(2), "quant": jax.random.key(3)}
  variables = model.init(rngs, x)
  opt = optax.adam(1e-3)
  mutable = [models.quantization.NUMERICS] if sow else False

  @jax.jit
  def step(params, opt_state, x, y, k):  # data as arguments: no constant folding
    def loss(p):
      out = model.apply({**variables, "params": p}, x, rngs={"quant": k},
                        mutable=mutable)
      out, sown = out if sow else (out, {})
      return jnp.mean((out - y) ** 2), sown
    (l, sown), g = jax.value_and_grad(loss, has_aux=True)(params)
    updates, opt_state = opt.update(g, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, l, sown

  params = variables["params"]
  state = (params, opt.init(params))
  key = jax.random.key(4)
  return lambda: step(*state, x, y, key)


def quantized_mlp(recipe: Any, telemetry: bool = False) -> nn.Module:
  return models.quantize_model(MLP(flags.FLAGS.width, flags.FLAGS.layers),
                               [models.Rule(".*", recipe)], telemetry=telemetry)


def define_flags() -> None:
  """Defines this script's flags; called only when it runs as a script, so that
  importing the module (a test, another script) defines no flag names."""
  flags.DEFINE_list("recipes", ["bf16", "fp32", "mxfp8", "nvfp4"],
                    "recipes to time")
  flags.DEFINE_integer("width", 1024, "MLP width")
  flags.DEFINE_integer("layers", 4, "MLP layers")
  flags.DEFINE_integer("batch", 512, "batch size")
  flags.DEFINE_integer("size", 16 * 1024 * 1024, "float32 elements to quantize")
  flags.DEFINE_integer("repeats", 5, "rounds of timed calls")
  flags.DEFINE_list("parts", ["step", "telemetry", "quantize"],
                    "what to time: step, telemetry, operands, quantize")


def main(argv):
  del argv
  r = flags.FLAGS.repeats
  print(f"{jax.devices()[0].platform}; MLP {flags.FLAGS.layers} x {flags.FLAGS.width}, batch "
        f"{flags.FLAGS.batch}; fastest of {r} interleaved rounds")
  if "step" in flags.FLAGS.parts:
    times = interleaved_times({name: train_step(quantized_mlp(name))
                               for name in flags.FLAGS.recipes}, r)
    base_name = "bf16" if "bf16" in times else next(iter(times))
    base = times[base_name]
    print(f"{'train step':20s} {'fastest ms':>10s} {'/ ' + base_name:>8s}   per-round "
          f"ratio: median [min, max]")
    for name, t in times.items():
      ratio = t / base
      print(f"{name:20s} {t.min() * 1e3:10.1f} {t.min() / base.min():8.2f}   "
            f"{np.median(ratio):.2f} [{ratio.min():.2f}, {ratio.max():.2f}]")
  if "telemetry" in flags.FLAGS.parts:
    recipe = "nvfp4"
    by_hand = MLP(flags.FLAGS.width, flags.FLAGS.layers,
                  dot_general=qdot.make_dot_general(recipe, key=jax.random.key(5)))
    t = interleaved_min({"by hand": train_step(by_hand),
                         "off": train_step(quantized_mlp(recipe)),
                         "on": train_step(quantized_mlp(recipe, telemetry=True), sow=True)},
                        r)
    print(f"{recipe} step, quantize_model telemetry off / qdot injected by hand: "
          f"{t['off'] / t['by hand']:.2f}")
    print(f"{recipe} step, telemetry on / off: {t['on'] / t['off']:.2f}")
  if "operands" in flags.FLAGS.parts:
    x = jax.random.normal(jax.random.key(0), (flags.FLAGS.batch, flags.FLAGS.width))
    w = jax.random.normal(jax.random.key(1), (flags.FLAGS.width, flags.FLAGS.width))
    k = jax.random.key(2)
    nearest = quantizer.QuantSpec("nvfp4")
    stochastic = quantizer.QuantSpec("nvfp4", rounding=Stochastic())
    ops = {
        "bf16 GEMM": jax.jit(lambda x, w, k: jnp.dot(  # w an argument: no folding
            x.astype(jnp.bfloat16), w.astype(jnp.bfloat16),
            preferred_element_type=jnp.float32)),
        "nvfp4 qdq, nearest": jax.jit(
            lambda x, w, k: kernels.quantize_dequantize_split(x, nearest)),
        "nvfp4 qdq, stochastic": jax.jit(
            lambda x, w, k: kernels.quantize_dequantize_split(x, stochastic, key=k)),
        "RHT, 16-point, axis 0": jax.jit(
            lambda x, w, k: numerics.random_hadamard(x, key=k, block_shape=16, axis=0)),
    }
    t = interleaved_min({name: (lambda f=f: f(x, w, k)) for name, f in ops.items()}, r)
    gemm = t["bf16 GEMM"]
    print(f"per ({flags.FLAGS.batch}, {flags.FLAGS.width}) operand {'ms':>8s} {'/ GEMM':>8s}")
    for name, v in t.items():
      print(f"{name:36s} {v * 1e3:8.3f} {v / gemm:8.2f}")
  if "quantize" in flags.FLAGS.parts:
    x = jax.random.normal(jax.random.key(0), (flags.FLAGS.size // 1024, 1024))
    spec = quantizer.QuantSpec("nvfp4")
    ops = {
        "copy (x + 1)": jax.jit(lambda x: x + 1.0),
        "quantize_nvfp4 (codes + scales)": jax.jit(
            lambda x: (lambda q: (q.codes, q.scales, q.tensor_scale))(
                numerics.quantize_nvfp4(x))),
        "nvfp4 quantize-dequantize": jax.jit(
            lambda x: quantizer.quantize_dequantize(x, spec)),
        "quantize_mx e4m3 (codes + scales)": jax.jit(
            lambda x: (lambda q: (q.codes, q.scales))(numerics.quantize_mx(x, "e4m3"))),
    }
    t = interleaved_min({name: (lambda f=f: f(x)) for name, f in ops.items()}, r)
    copy = t.pop("copy (x + 1)")
    print(f"{flags.FLAGS.size} float32 elements; copy {copy * 1e3:.1f} ms")
    print(f"{'op':36s} {'time / copy':>12s} {'copy / time':>12s}")
    for name, v in t.items():
      print(f"{name:36s} {v / copy:12.2f} {copy / v:12.2f}")


if __name__ == "__main__":
  define_flags()
  app.run(main, flags_parser=parse_flags)
