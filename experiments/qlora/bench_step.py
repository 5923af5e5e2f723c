"""Fine-tuning step time of NF4 + LoRA vs bf16 + LoRA (and the rest), in one process.

    python -m experiments.qlora.bench_step                       # writes bench_step.json
    python -m experiments.qlora.bench_step --rounds=3 --repeats=3 --out=/tmp/b.json

Per-run steps/s of a sweep are measured while other runs share the cores, so the
speed claim rests on this script instead. It builds the qlora sweep's model (the
quick-start LM, random weights: the step time does not depend on their values), one
batch, and the jitted train step of each method exactly as :mod:`experiments.qlora`
runs it (:func:`experiments.qlora.experiment.make_setup` and the harness's
``make_train_step``, AdamW, the frozen base as a jit argument). Every step is compiled
first; then, for ``rounds`` rounds, each method (the order rotated per round) is
called ``repeats`` times and its minimum kept. Printed and written: each method's time
per step (the median over rounds of its per-round minimum) and its ratio to
``bf16_lora`` within each round, as the median over rounds with the smallest and largest.

Methods: ``nf4_lora`` (QLoRA: NF4 base, double quantization, blocks of 64, dequantized
inside every projection and again in the backward pass), ``nf4_lora_materialize``
(the NF4 base dequantized once per step, outside the projections), ``bf16_lora``,
``fp32_lora`` and ``full_ft`` (every parameter, float32 masters).

The GEMM level (the same rounds): for each projection shape of the model, with
``batch * seq_len`` rows, ``x @ W`` as the model issues it (bf16 operands, float32
accumulation) from a bf16 weight, from an NF4 weight dequantized in the same jitted
function, and from a float32 weight with no conversion at all (what a dequantize fused
into the GEMM for free could at best reach), plus the NF4 dequantization alone. The
compiled HLO of the NF4 one is inspected: ``dequantize_materialized`` says whether XLA
writes the dequantized weight out as a whole array before the GEMM (a loop fusion with
the weight's shape) instead of fusing the decode into the GEMM.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import re
import time
from typing import Any, Callable

from absl import app, flags
import jax
import jax.numpy as jnp
import numpy as np

from experiments.common.evidence.results import write_benchmark
from experiments.common.harness import run_metadata
from experiments.common.harness.config_flags import parse_flags
from experiments.common.harness.train_loop import (init_train_state, make_train_step,
                                                   without_quant_state)
from experiments.qlora.experiment import (ARCH_FIELDS, QLoRAConfig, make_optimizer,
                                         make_setup)
from lowprec.models.transformer import bf16_dot_general
from lowprec.numerics import nf4
from lowprec.numerics.benchmarking import interleaved, ratio_summary


BASELINE = "bf16_lora"
METHODS = {
    "nf4_lora": {"method": "lora", "base_format": "nf4", "dequantize": "per_gemm"},
    "nf4_lora_materialize": {"method": "lora", "base_format": "nf4",
                             "dequantize": "materialize"},
    "bf16_lora": {"method": "lora", "base_format": "bf16"},
    "fp32_lora": {"method": "lora", "base_format": "fp32"},
    "full_ft": {"method": "full"},
}
VOCAB = 84  # the corpus's character vocabulary (the time barely depends on it)


def _step_fns(config: QLoRAConfig, params: Any, batch: dict[str, np.ndarray],
              methods: tuple[str, ...] = tuple(METHODS)) -> dict[str, Callable[[], Any]]:
  model = config.model(VOCAB)
  fns = {}
  for name in methods:
    overrides = METHODS[name]
    cfg = dataclasses.replace(config, **overrides)
    setup = make_setup(cfg, model, params)
    optimizer = make_optimizer(cfg)
    step = make_train_step(without_quant_state(setup.loss_fn), optimizer)
    b = {**batch, **({} if setup.frozen is None else {"base": setup.frozen})}
    holder = {"state": init_train_state(setup.trainable, optimizer)}
    key = jax.random.PRNGKey(0)

    def call(step=step, b=b, holder=holder, key=key):
      holder["state"], metrics = step(holder["state"], b, key)  # the state is donated
      return metrics["loss"]

    jax.block_until_ready(call())  # compile
    fns[name] = call
  return fns


def dequantize_materialized(compiled_text: str, n_in: int, n_out: int) -> bool:
  """Whether the compiled HLO writes a float32 weight-shaped array in a loop fusion."""
  shapes = (f"f32[{n_in},{n_out}]", f"f32[{n_out},{n_in}]")
  return any(re.search(re.escape(s) + r"\{[0-9,]*\} fusion\(.*kind=kLoop", compiled_text)
             for s in shapes)


def _gemm_fns(config: QLoRAConfig) -> tuple[dict[str, Callable[[], Any]], dict[str, Any]]:
  d, f = config.d_model, config.d_ff
  rows = config.batch_size * config.seq_len
  shapes = {"qkv": (d, 3 * d), "attn_out": (d, d), "ff_in": (d, f), "ff_out": (f, d)}
  dims = (((1,), (0,)), ((), ()))
  fns, info = {}, {}
  for i, (name, (n_in, n_out)) in enumerate(shapes.items()):
    kx, kw = jax.random.split(jax.random.PRNGKey(i))
    x = jax.random.normal(kx, (rows, n_in), jnp.float32)
    w = jax.random.normal(kw, (n_in, n_out), jnp.float32) * n_in ** -0.5
    q = nf4.quantize_nf4(w, axis=0, pad=True)
    w16 = w.astype(jnp.bfloat16)
    mm = jax.jit(lambda x, w: bf16_dot_general(x, w, dims, None))
    deq_mm = jax.jit(lambda x, q: bf16_dot_general(x, nf4.dequantize_nf4(q), dims, None))
    f32_mm = jax.jit(lambda x, w: jax.lax.dot_general(x, w, dims,
                                                      preferred_element_type=jnp.float32))
    deq = jax.jit(nf4.dequantize_nf4)
    text = deq_mm.lower(x, q).compile().as_text()
    info[name] = {"shape": [rows, n_in, n_out],
                  "dequantize_materialized": dequantize_materialized(text, n_in, n_out)}
    for label, fn in ((f"{name}/bf16_weight", lambda mm=mm, x=x, w=w16: mm(x, w)),
                      (f"{name}/nf4_dequantize_then_gemm",
                       lambda f_=deq_mm, x=x, q=q: f_(x, q)),
                      (f"{name}/f32_weight_no_conversion",
                       lambda f_=f32_mm, x=x, w=w: f_(x, w)),
                      (f"{name}/nf4_dequantize_only", lambda f_=deq, q=q: f_(q))):
      jax.block_until_ready(fn())
      fns[label] = fn
  return fns, info


def run(config: QLoRAConfig, rounds: int, repeats: int, gemms: bool = True
        ) -> dict[str, Any]:
  """The measurements as a JSON-able dict (see the module docstring)."""
  model = config.model(VOCAB)
  key = jax.random.PRNGKey(0)
  params = jax.jit(model.init)(key, jnp.zeros((1, config.seq_len), jnp.int32), key)["params"]
  tokens = np.asarray(jax.random.randint(jax.random.PRNGKey(1),
                                         (config.batch_size, config.seq_len + 1), 0, VOCAB))
  batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}
  t0 = time.perf_counter()
  steps = _step_fns(config, params, batch)
  out: dict[str, Any] = {
      "config": {k: getattr(config, k) for k in ARCH_FIELDS + ("rank", "alpha", "nf4_block_size",
                                                          "double_quant")},
      "rounds": rounds, "repeats": repeats, "baseline": BASELINE,
      "backend": jax.default_backend(), "jax": jax.__version__,
      "cpus": len(os.sched_getaffinity(0)), "machine": platform.machine(),
      "load_average_before": [round(x, 2) for x in os.getloadavg()],
      "git": run_metadata.git_state(),  # commit and dirty flag
  }
  fns = dict(steps)
  gemm_info: dict[str, Any] = {}
  if gemms:
    gemm_fns, gemm_info = _gemm_fns(config)
    fns.update(gemm_fns)
  out["compile_s"] = time.perf_counter() - t0
  times = interleaved(fns, rounds, repeats)
  out["train_step"] = ratio_summary({k: times[k] for k in steps}, BASELINE)
  if gemms:
    out["gemm"] = {}
    for name, info in gemm_info.items():
      sub = {k.split("/", 1)[1]: v for k, v in times.items() if k.startswith(name + "/")}
      out["gemm"][name] = {**info, "times": ratio_summary(sub, "bf16_weight")}
  out["per_round_s"] = {k: times[k] for k in steps}
  out["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
  return out


def format_table(result: dict[str, Any]) -> str:
  lines = [f"train step (min of {result['repeats']} per round, {result['rounds']} rounds; "
           f"ratio to {result['baseline']}: median [min, max] over rounds)"]
  for name, s in result["train_step"].items():
    lines.append(f"  {name:22s} {s['ms']:8.1f} ms   x{s['ratio']:.3f} "
                 f"[{s['ratio_min']:.3f}, {s['ratio_max']:.3f}]")
  for name, g in result.get("gemm", {}).items():
    lines.append(f"GEMM {name} {g['shape']} (dequantized weight materialized: "
                 f"{g['dequantize_materialized']}), ratio to bf16_weight:")
    for label, s in g["times"].items():
      lines.append(f"  {label:28s} {s['ms']:8.3f} ms   x{s['ratio']:.3f} "
                   f"[{s['ratio_min']:.3f}, {s['ratio_max']:.3f}]")
  return "\n".join(lines)


def define_flags() -> None:
  """Defines this script's flags; called only when it runs as a script, so that
  importing the module (a test, another script) defines no flag names."""
  flags.DEFINE_integer("rounds", 10, "Interleaved rounds.")
  flags.DEFINE_integer("repeats", 7, "Timed calls per method per round (min).")
  flags.DEFINE_string("out", "experiments/qlora/report/bench_step.json",
                      "Where to write the JSON ('' : nowhere).")
  flags.DEFINE_list("size", [], "name=value overrides of the QLoRAConfig "
                    "architecture fields (e.g. d_model=32 for a quick check).")
  flags.DEFINE_bool("gemms", True, "Also time the single projections.")


def main(argv):
  del argv
  overrides = {}
  for item in flags.FLAGS.size:
    k, v = item.split("=", 1)
    if k not in ARCH_FIELDS:
      raise app.UsageError(f"--size names architecture fields only ({ARCH_FIELDS}), got {k!r}")
    overrides[k] = int(v)
  config = dataclasses.replace(QLoRAConfig(), **overrides)
  result = run(config, flags.FLAGS.rounds, flags.FLAGS.repeats, flags.FLAGS.gemms)
  write_benchmark(flags.FLAGS.out, result, format_table(result))

if __name__ == "__main__":
  define_flags()
  app.run(main, flags_parser=parse_flags)
