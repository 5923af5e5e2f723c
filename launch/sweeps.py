"""The registry of declared sweeps: ``name -> Sweep``.

Add a sweep by writing a function that returns a :class:`launch.sweep_spec.Sweep` and
listing it in ``_REGISTRY``.
"""

from __future__ import annotations

from typing import Callable

from launch.sweep_spec import Arm, Sweep


def lm_recipes() -> Sweep:
  """bf16 vs mxfp8 training of the char-level LM, 2 seeds (needs numerics.recipes)."""
  from experiments.lm import LMConfig  # pylint: disable=import-outside-toplevel
  return Sweep(
      name="lm_recipes", module="experiments.lm",
      # Smaller than the experiment's default so 4 runs finish in minutes on 2 CPU cores
      # (mxfp8's quantize/dequantize costs several times a bf16 GEMM there).
      # lr 1e-2 was measured to get past the bigram plateau (eval loss 1.86 at step 800
      # vs 2.19 with 3e-3) in the same steps.
      base=LMConfig(num_steps=800, warmup_steps=50, learning_rate=1e-2, seq_len=64,
                    d_model=64, num_layers=2, num_heads=4, d_ff=256, eval_every=200,
                    checkpoint_every=400, histogram_every=400, log_every=10),
      arms=(Arm("bf16", {"recipe": "bf16"}), Arm("mxfp8", {"recipe": "mxfp8"})),
      seeds=(0, 1), baseline="bf16",
      metrics=("eval/loss", "eval/accuracy", "train/loss"),
      higher_is_better=("eval/accuracy",),
      description="Does mxfp8 (MX block-scaled e4m3) training match bf16 on a tiny LM?")


def lm_builtin_recipes() -> Sweep:
  """fp32 vs bf16 on a tiny LM, 2 seeds: needs no numerics.recipes (a harness check)."""
  from experiments.lm import LMConfig  # pylint: disable=import-outside-toplevel
  return Sweep(
      name="lm_builtin_recipes", module="experiments.lm",
      base=LMConfig(num_steps=40, warmup_steps=5, seq_len=32, batch_size=8, d_model=32,
                    num_layers=1, num_heads=2, d_ff=64, eval_every=20, eval_batches=2,
                    log_every=5, checkpoint_every=20, histogram_every=20,
                    max_chars=200_000, progress_every_s=5.0),
      arms=(Arm("fp32", {"recipe": "fp32"}), Arm("bf16", {"recipe": "bf16"})),
      seeds=(0, 1), baseline="fp32",
      metrics=("eval/loss", "eval/accuracy", "train/loss"),
      higher_is_better=("eval/accuracy",),
      description="Built-in recipes only; exercises the whole launch/report path quickly.")


def temperon() -> Sweep:
  """Temperon in miniature (declared in launch/sweep_temperon.py)."""
  from launch import sweep_temperon  # pylint: disable=import-outside-toplevel
  return sweep_temperon.temperon()


def memoir() -> Sweep:
  """Memoir coupled vs read-only pondering (declared in launch/sweep_memoir.py)."""
  from launch import sweep_memoir  # pylint: disable=import-outside-toplevel
  return sweep_memoir.memoir()


def alto() -> Sweep:
  """ALTO's MXFP4 recipe ladder and negative results (declared in launch/sweep_alto.py)."""
  from launch import sweep_alto  # pylint: disable=import-outside-toplevel
  return sweep_alto.alto()


def fair_cast() -> Sweep:
  """Fair Cast: bf16 export rounding of float32 masters (launch/sweep_fair_cast.py)."""
  from launch import sweep_fair_cast  # pylint: disable=import-outside-toplevel
  return sweep_fair_cast.fair_cast()


def mxfp8_rl() -> Sweep:
  """Learner x sampler recipe in {bf16, mxfp8}^2 (launch/sweep_mxfp8_rl.py)."""
  from launch import sweep_mxfp8_rl  # pylint: disable=import-outside-toplevel
  return sweep_mxfp8_rl.mxfp8_rl()


def stale_sampler() -> Sweep:
  """Pan's staleness cliff and decoupled cooling (declared in launch/sweep_stale_sampler.py)."""
  from launch import sweep_stale_sampler  # pylint: disable=import-outside-toplevel
  return sweep_stale_sampler.stale_sampler()


_REGISTRY: dict[str, Callable[[], Sweep]] = {
    "alto": alto,
    "fair_cast": fair_cast,
    "lm_recipes": lm_recipes,
    "lm_builtin_recipes": lm_builtin_recipes,
    "mxfp8_rl": mxfp8_rl,
    "stale_sampler": stale_sampler,
    "temperon": temperon,
    "memoir": memoir,
}


def names() -> tuple[str, ...]:
  return tuple(sorted(_REGISTRY))


def get(name: str) -> Sweep:
  """The sweep registered as ``name``."""
  if name not in _REGISTRY:
    raise KeyError(f"unknown sweep {name!r}; known: {', '.join(names())}")
  return _REGISTRY[name]()
