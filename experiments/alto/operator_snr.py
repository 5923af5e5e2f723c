"""ALTO's operator-level SNR table: forward / dgrad / wgrad SNR (dB) per recipe.

    python -m experiments.alto.operator_snr
    python -m experiments.alto.operator_snr --recipes=mxfp4_1d2d,mxfp4_rht,mxfp4 --tokens=4096
    python -m experiments.alto.operator_snr --table_dir=experiments/alto/report

``--table_dir`` measures the ALTO report's table (:data:`experiments.alto.appendix.SNR_RECIPES`
at its shapes) into ``<dir>/operator_snr.json``, which the report reads when it rebuilds.

Operands are drawn as in ALTO: N(0, 1) + Bernoulli(0.005) * N(0, 1e4) for X, W and dO;
the reference is the unquantized float32 GEMM (see numerics.operator_snr.snr). ALTO reports,
for a Linear layer: 1d2d 13.48 / 11.80 / 13.02, +RHT 13.48 / 11.80 / 13.25,
+RHT+SR 13.48 / 11.02 / 13.04 (their shapes are not stated, so expect offsets).
"""

from __future__ import annotations

from absl import app
from absl import flags
import jax

from experiments.common.harness import log_filters
from experiments.common.harness.config_flags import parse_flags
from lowprec.numerics import operator_snr


def define_flags() -> None:
  """Defines this script's flags; called only when it runs as a script, so that
  importing the module (a test, another script) defines no flag names."""
  flags.DEFINE_list(
      "recipes", ["bf16", "fp8", "mxfp8", "mxfp4_1d2d", "mxfp4_rht", "mxfp4", "nvfp4"],
      "recipes to measure")
  flags.DEFINE_integer("tokens", 2048, "rows of X and dO")
  flags.DEFINE_integer("k", 1024, "input features")
  flags.DEFINE_integer("n", 1024, "output features")
  flags.DEFINE_integer("repeats", 3, "independent draws averaged")
  flags.DEFINE_float("outlier_rate", 0.005, "Bernoulli outlier rate")
  flags.DEFINE_integer(
      "experts", 0, "0: a Linear GEMM; E > 0: also a grouped expert GEMM over E experts "
      "(X E x tokens x K, W E x K x N)")
  flags.DEFINE_string("table_dir", None, "Write the ALTO report's SNR table data to "
                      "<dir>/operator_snr.json instead (the other flags are not used).")


def main(argv):
  del argv
  log_filters.quiet_library_info()
  if flags.FLAGS.table_dir:
    from experiments.alto import appendix  # pylint: disable=import-outside-toplevel
    print(f"wrote {appendix.write_snr_data(flags.FLAGS.table_dir)}")
    return
  print(f"X {flags.FLAGS.tokens}x{flags.FLAGS.k}, W {flags.FLAGS.k}x{flags.FLAGS.n}, outlier rate "
        f"{flags.FLAGS.outlier_rate}, mean of {flags.FLAGS.repeats} draws")
  print(f"{'recipe':12s} {'GEMM':8s} {'forward':>8s} {'dgrad':>8s} {'wgrad':>8s}")
  for r in flags.FLAGS.recipes:
    for gemm, experts in (("linear", 0),) + ((("grouped", flags.FLAGS.experts),)
                                             if flags.FLAGS.experts else ()):
      s = operator_snr.snr(r, tokens=flags.FLAGS.tokens, k=flags.FLAGS.k,
                           n=flags.FLAGS.n, experts=experts, key=jax.random.key(0),
                           outlier_rate=flags.FLAGS.outlier_rate,
                           repeats=flags.FLAGS.repeats)
      print(f"{r:12s} {gemm:8s} {s['forward']:8.2f} {s['dgrad']:8.2f} {s['wgrad']:8.2f}")


if __name__ == "__main__":
  define_flags()
  app.run(main, flags_parser=parse_flags)
