"""The mxfp8_rl sweep's appendix table on planted runs."""

import dataclasses

from experiments.common.tensorboard_writer import MetricWriter
from experiments.mxfp8_rl import appendix
from launch import registry
from launch.manifest import expand, write_manifest


def _rows(md):
  return {l.split("|")[1].strip(): [c.strip() for c in l.split("|")[2:-1]]
          for l in md.splitlines() if l.startswith("| `")}


def test_mxfp8_rl_table_on_planted_runs(tmp_path):
  sweep = dataclasses.replace(registry.get("mxfp8_rl"), seeds=(0, 1),
                              base=dataclasses.replace(registry.get("mxfp8_rl").base,
                                                       num_updates=4))
  assert [a.name for a in sweep.arms] == ["L-bf16_S-bf16", "L-mxfp8_S-mxfp8",
                                          "L-bf16_S-mxfp8", "L-mxfp8_S-bf16"]
  runs = expand(sweep, str(tmp_path))
  write_manifest(sweep, runs, str(tmp_path))
  for r in runs:
    if r.arm not in ("L-mxfp8_S-mxfp8", "L-bf16_S-mxfp8"):
      continue
    crossed = r.arm == "L-bf16_S-mxfp8"
    w = MetricWriter(r.workdir)
    w.write_scalars(0, {"eval/greedy_accuracy": 0.4})
    for u in range(1, 5):
      w.write_scalars(u, {"train/reward": 0.25 * u, "train/mismatch_k3":
                          0.002 * crossed + 0.0001 * r.seed,
                          "train/mismatch_max_abs_delta_logp": 0.5,
                          "sync/k3": 0.001 * crossed, "sync/max_abs_delta_logp": 0.1})
    w.write_scalars(4, {"eval/greedy_accuracy": 0.5})
    w.close()
  rows = _rows(appendix.mxfp8_rl_appendix(str(tmp_path)))
  assert rows["`L-mxfp8_S-mxfp8`"][0] == "0.00005 ± 0.00007"
  assert rows["`L-bf16_S-mxfp8`"][0] == "0.00205 ± 0.00007"
  assert rows["`L-bf16_S-mxfp8`"][2] == "0.001000 ± 0.000000"
  assert rows["`L-bf16_S-mxfp8`"][4] == "0.625 ± 0.000"
  assert rows["`L-bf16_S-bf16`"] == [""] * 6  # no completed runs
