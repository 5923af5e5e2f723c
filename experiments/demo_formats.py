"""Quantizes one tensor to every format and prints the error table.

    python -m experiments.demo_formats [--rows=256 --cols=1024 --outlier_rate=0.005]

The tensor is ALTO's synthetic operand N(0, 1) + Bernoulli(p) * N(0, 1e4) (heavy
outliers, so per-tensor formats and block scaling separate). Every row is measured in
this run: SNR = 10 log10(sum x^2 / sum (x - q)^2), relative RMSE and max |error|.
"""

from __future__ import annotations

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from experiments.common.harness.config_flags import parse_flags
from lowprec import numerics
from lowprec.numerics import operator_snr
from lowprec.numerics.outlier_data import outlier_data
from lowprec.numerics.rounding import Stochastic


def error_row(x: np.ndarray, q: np.ndarray) -> dict:
  err = q.astype(np.float64) - x
  return dict(snr_db=operator_snr.snr_db(x, q),
              rel_rmse=np.sqrt(np.mean(err ** 2) / np.mean(x ** 2)),
              max_abs=np.max(np.abs(err)))


def table(x: jax.Array, key: jax.Array) -> list[tuple[str, str, dict]]:
  xs = np.asarray(x, np.float64)
  rows = []
  for name in numerics.formats.names():
    if name == "e8m0":
      continue
    q = numerics.cast(x, name)  # element-wise, no scaling, saturating
    rows.append((name, "cast", error_row(xs, np.asarray(q))))
  for name in numerics.blockscale.MX_ELEMENT_FORMATS:
    for rule in ("floor", "rceil"):
      q = numerics.dequantize(numerics.quantize_mx(x, name, scale_rule=rule))
      rows.append((name, f"MX 1x32 {rule}", error_row(xs, np.asarray(q))))
  q = numerics.dequantize(numerics.quantize_mx(x, "e2m1", block_shape=(32, 32)))
  rows.append(("e2m1", "MX 32x32 floor", error_row(xs, np.asarray(q))))
  q = numerics.dequantize(numerics.quantize_mx(x, "e2m1", rounding=Stochastic(), key=key))
  rows.append(("e2m1", "MX 1x32 floor SR", error_row(xs, np.asarray(q))))
  q = numerics.dequantize(numerics.quantize_nvfp4(x))
  rows.append(("nvfp4", "1x16 E4M3 + fp32", error_row(xs, np.asarray(q))))
  q = numerics.dequantize(numerics.quantize_nvfp4(x, block_shape=(16, 16)))
  rows.append(("nvfp4", "16x16 E4M3 + fp32", error_row(xs, np.asarray(q))))
  return rows


def define_flags() -> None:
  """Defines this script's flags; called only when it runs as a script, so that
  importing the module (a test, another script) defines no flag names."""
  flags.DEFINE_integer("rows", 256, "tensor rows")
  flags.DEFINE_integer("cols", 1024, "tensor columns (multiple of 32)")
  flags.DEFINE_float("outlier_rate", 0.005, "Bernoulli rate of N(0, 1e4) outliers")
  flags.DEFINE_integer("seed", 0, "PRNG seed")


def main(argv):
  del argv
  key = jax.random.key(flags.FLAGS.seed)
  x = outlier_data(key, (flags.FLAGS.rows, flags.FLAGS.cols), flags.FLAGS.outlier_rate)
  print(f"x: {flags.FLAGS.rows}x{flags.FLAGS.cols} float32, N(0,1) + "
        f"Bernoulli({flags.FLAGS.outlier_rate}) * N(0,1e4); max |x| = {float(jnp.max(jnp.abs(x))):.1f}")
  print(f"{'format':7s} {'scheme':20s} {'SNR dB':>8s} {'rel RMSE':>10s} "
        f"{'max |err|':>11s}")
  for name, scheme, r in table(x, jax.random.fold_in(key, 1)):
    print(f"{name:7s} {scheme:20s} {r['snr_db']:8.2f} {r['rel_rmse']:10.3e} "
          f"{r['max_abs']:11.3e}")


if __name__ == "__main__":
  define_flags()
  app.run(main, flags_parser=parse_flags)
