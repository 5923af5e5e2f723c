"""The mxfp8_rl sweeps: their declarations, the gate rule on hand-made distributions,
and the appendices on planted runs."""

import dataclasses
import math

import pytest

from experiments.common.evidence.tensorboard_writer import MetricWriter
from experiments.mxfp8_rl import appendix, sweeps
from experiments.mxfp8_rl import experiment as mxfp8_rl
from experiments.mxfp8_rl.experiment import PLANTED_FAULTS
from launch import registry
from launch.manifest import expand, write_manifest
from experiments.mxfp8_rl.weight_sync import CHECKS


def _rows(md):
  return {l.split("|")[1].strip(): [c.strip() for c in l.split("|")[2:-1]]
          for l in md.splitlines() if l.startswith("| `")}


def _table(md, title):
  part = md.split(f"## {title}")[1].split("\n## ")[0]
  rows = [[c.strip() for c in l.split("|")[1:-1]] for l in part.splitlines()
          if l.startswith("| ")]
  return rows[1:]  # without the header


def test_declarations():
  matched, faults = registry.get("mxfp8_rl"), registry.get("mxfp8_rl_faults")
  for sweep in (matched, faults):
    assert len(sweep.seeds) >= 4 and not set(sweep.seeds) & set(sweep.calibration_seeds)
    assert sweep.base.warm_start_per_seed and sweep.base.sync_checks == "record"
    assert {c.metric for c in sweep.claims} <= set(sweep.metrics)
  assert not set(matched.seeds) & set(faults.seeds)  # the gates are tested elsewhere
  # Matched vs crossed: a paired claim for each sampler, not only against bf16/bf16.
  pairs = {(c.arm, c.baseline) for c in matched.claims}
  assert ("L-mxfp8_S-mxfp8", "L-bf16_S-mxfp8") in pairs
  assert ("L-bf16_S-bf16", "L-mxfp8_S-bf16") in pairs
  assert len({a.overrides["sampling_stream"] for a in matched.arms}) == 4
  # Faults: clean runs of every pair, every fault on both MXFP8-sampler pairs, a fault
  # arm on its pair's clean rollout stream.
  by_name = {a.name: a.overrides for a in faults.arms}
  planted = {(o["planted_fault"], o["learner_recipe"], o["sampler_recipe"])
             for o in by_name.values()}
  assert {f for f, _, _ in planted} == set(PLANTED_FAULTS)
  assert len(faults.arms) == 4 + 7 * 2
  for name, o in by_name.items():
    clean = sweeps.fault_arm_name("none", o["learner_recipe"], o["sampler_recipe"])
    assert o["sampling_stream"] == by_name[clean]["sampling_stream"], name
  assert faults.base.fault_update < faults.base.num_updates
  assert set(sweeps.INTENDED_CHECK) == set(PLANTED_FAULTS) - {"none"}
  assert {c for c in sweeps.INTENDED_CHECK.values() if c} <= set(CHECKS)


def test_gate_rule_on_hand_made_distributions():
  assert appendix.round_up(0.0123) == 0.02 and appendix.round_up(0.95) == 1.0
  assert appendix.round_up(3.0) == 3.0 and appendix.round_up(9.01) == 10.0
  # SAFETY x the largest clean value, rounded up to one significant digit.
  assert appendix.gate([0.001, 0.004, 0.0026]) == 0.008
  assert appendix.gate([0.0, 0.0], exact=1e-10) == 1e-10  # all zero: the exact gate
  assert math.isnan(appendix.gate([]))
  # Leave one seed out: seed 2's outlier is above the gate from seeds 1 and 3.
  clean = {1: [0.01, 0.02], 2: [0.01, 0.09], 3: [0.02, 0.01]}
  assert appendix.false_alarms(clean) == (1, 6)  # gates 0.2, 0.04 (0.09 > it), 0.2
  planted = {("a", 1): [(32, 0.01), (33, 0.5)], ("a", 2): [(32, 0.03)],
             ("b", 1): [(32, 0.7), (40, 0.9)]}
  assert appendix.detections(planted, 0.2) == (2, 3, [33, 32])


def _faults_sweep(tmp_path, num_updates=8, fault_update=4):
  full = registry.get("mxfp8_rl_faults")
  keep = ("clean_L-mxfp8_S-mxfp8", "clean_L-bf16_S-mxfp8", "stale_sync_1_L-bf16_S-mxfp8",
          "transposed_block_axis_L-mxfp8_S-mxfp8")
  base = dataclasses.replace(full.base, num_updates=num_updates, fault_update=fault_update)
  sweep = dataclasses.replace(full, base=base, seeds=(11, 12),
                              arms=tuple(a for a in full.arms if a.name in keep),
                              claims=(), baseline=keep[0])
  runs = expand(sweep, str(tmp_path))
  write_manifest(sweep, runs, str(tmp_path))
  return runs


def test_faults_appendix_on_planted_runs(tmp_path):
  runs = _faults_sweep(tmp_path)
  for r in runs:
    cross, stale = "bf16_S" in r.arm, r.arm.startswith("stale")
    w = MetricWriter(r.workdir)
    w.write_scalars(0, {"eval/greedy_accuracy": 0.4})
    for u in range(0, 8):  # the sync before update u is logged at step u + 1 (0: 0)
      step = u + 1 if u else 0
      after = u >= 4
      k3 = (0.001 + 0.0005 * (r.seed - 11) if cross else 0.0) + (0.05 if stale and after else 0.0)
      values = {f"sync/fired/{c}": 0.0 for c in CHECKS}
      values.update({"sync/stat/parity_k3": k3,
                     "sync/stat/parity_max_abs_delta_logp": 10 * k3,
                     "sync/stat/padding_max_abs_diff": 0.001,
                     "sync/stat/bitwise_differing": 100.0 if stale and after else 0.0,
                     "sync/stat/version_offset": 0.0})
      if stale and after:
        values["sync/fired/bitwise"] = 1.0
        values["sync/fired/parity"] = float(u >= 6)
      w.write_scalars(step, values)
      if u:
        w.write_scalars(u, {"train/reward": 0.3})
    w.write_scalars(8, {"train/reward": 0.3, "eval/greedy_accuracy": 0.45})
    w.close()
  md = appendix.mxfp8_rl_faults_appendix(str(tmp_path))
  faults = {row[0]: row for row in _table(md, "Planted faults")}
  stale = faults["stale_sync_1"]
  assert stale[1:7] == ["L-bf16_S-mxfp8", "bitwise", "bitwise (2/2)", "4, 4",
                        "parity (2/2)", "bitwise_differing 100 vs 0"]
  # Clean cross k3 up to 0.0015: calibrated gate 0.003; the stale peaks cross it.
  assert stale[7] == "max 0.0515 vs current 0.5 / calibrated 0.003 (2/2)"
  transposed = faults["transposed_block_axis"]
  assert transposed[3] == "none" and transposed[4] == "-, -"
  gates = {(row[0], row[1]): row for row in _table(md, "Clean distributions")}
  cross = gates[("`parity_k3`", "cross")]
  assert cross[2] == "16" and cross[5] == "0.0015" and cross[6:8] == ["0.5", "0.003"]
  # Leave one seed out: seed 11's 0.001 against 0.003, seed 12's 0.0015 against 0.002.
  assert cross[8] == "0/16" and cross[10] == "2/2" and cross[11] == "0/2"
  every_check = {row[0]: row[1:] for row in _table(md, "Clean distributions")
                 if row[0] in CHECKS}
  assert every_check["bitwise"] == ["0/32", "2/4"]  # 2 clean arms x 2 seeds x 8 syncs
  assert every_check["parity"] == ["0/32", "2/4"] and every_check["plan"] == ["0/32", "0/4"]
  same = gates[("`parity_k3`", "same")]
  assert same[7] == "1e-10"  # all clean values 0: the exact gate stays
  defaults = {row[0]: row[1:] for row in _table(md, "Calibrated defaults")}
  # The planted sweep's config is the library's defaults: "these runs" = "library now".
  now = mxfp8_rl.MXFP8RLConfig()
  k3_now, pad_now = f"{now.cross_k3_tolerance:.3g}", f"{now.padding_atol:.3g}"
  assert defaults["`MXFP8RLConfig.cross_k3_tolerance`"] == [k3_now, "0.003", k3_now]
  assert defaults["`MXFP8RLConfig.padding_atol`"] == [pad_now, "0.002", pad_now]
  assert defaults["`PARITY_TOLERANCES` MXFP8 cross-recipe `k3`"][:2] == [k3_now, "0.003"]


def test_mxfp8_rl_table_on_planted_runs(tmp_path):
  sweep = dataclasses.replace(registry.get("mxfp8_rl"), seeds=(1, 2),
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
                          "sync/stat/parity_k3": 0.001 * crossed,
                          "sync/stat/parity_max_abs_delta_logp": 0.1,
                          "sync/stat/padding_max_abs_diff": 0.0,
                          **{f"sync/fired/{c}": float(crossed and c == "parity" and u == 4)
                             for c in CHECKS}})
    w.write_scalars(4, {"eval/greedy_accuracy": 0.5})
    w.close()
  md = appendix.mxfp8_rl_appendix(str(tmp_path))
  rows = _rows(md.split("## The sync checks")[0])
  assert rows["`L-mxfp8_S-mxfp8`"][0] == "0.00015 ± 0.00007"
  assert rows["`L-bf16_S-mxfp8`"][0] == "0.00215 ± 0.00007"
  assert rows["`L-bf16_S-mxfp8`"][2] == "0.001000 ± 0.000000"
  assert rows["`L-bf16_S-mxfp8`"][4] == "0.625 ± 0.000"
  assert rows["`L-bf16_S-mxfp8`"][5] == "0.500 ± 0.000"
  assert rows["`L-bf16_S-bf16`"] == [""] * 6  # no completed runs
  checks = _rows(md.split("## The sync checks")[1])
  assert checks["`L-bf16_S-mxfp8`"][:2] == ["8", "parity 2"]
  assert checks["`L-mxfp8_S-mxfp8`"][1] == "none"
  # Against the library's gates now: the matched pair's max |dlogp| of 0.1 at each of
  # its 8 syncs is over the exact same-recipe gate; the crossed pair's values are under
  # any cross-recipe gate.
  assert checks["`L-mxfp8_S-mxfp8`"][5] == "0 / 8 / 0"
  assert checks["`L-bf16_S-mxfp8`"][5] == "0 / 0 / 0"


@pytest.mark.parametrize("name", ["mxfp8_rl", "mxfp8_rl_faults"])
def test_every_arm_is_a_valid_config(name):
  sweep = registry.get(name)
  for arm in sweep.arms:
    dataclasses.replace(sweep.base, **arm.overrides, seed=sweep.seeds[0])


def test_faults_confirm_declaration():
  """The matched pair only, each kept fault with its bitwise and its pilot k3 claim."""
  sweep = registry.get("mxfp8_rl_faults_confirm")
  assert sweep.base == registry.get("mxfp8_rl_faults").base
  assert {a.name for a in sweep.arms} == {"clean_L-mxfp8_S-mxfp8"} | {
      f"{f}_L-mxfp8_S-mxfp8" for f in sweeps.FAULTS_CONFIRM_FAULTS}
  assert sorted((c.arm, c.metric) for c in sweep.claims) == sorted(
      (f"{f}_L-mxfp8_S-mxfp8", m) for f in sweeps.FAULTS_CONFIRM_FAULTS
      for m in (sweeps.BITWISE, sweeps.PARITY_K3))
  assert all(c.kind == "worse" and c.baseline == sweep.baseline for c in sweep.claims)
  assert {c.metric for c in sweep.claims} <= set(sweep.metrics)
  assert sweep.sequential.looks() == (4, 6, 8)


def test_detection_counts_on_planted_runs(tmp_path):
  """Made-up events: a fault caught at its sync on one seed and a sync late on the
  other; one clean seed with a false alarm (an independent count of each row)."""
  full = registry.get("mxfp8_rl_faults_confirm")
  keep = ("clean_L-mxfp8_S-mxfp8", "stale_sync_1_L-mxfp8_S-mxfp8")
  base = dataclasses.replace(full.base, num_updates=8, fault_update=4)
  sweep = dataclasses.replace(full, base=base, arms=tuple(
      a for a in full.arms if a.name in keep), claims=(), sequential=None)
  runs = expand(sweep, str(tmp_path))
  write_manifest(sweep, runs, str(tmp_path))
  for r in runs:
    if r.seed not in (301, 302):
      continue
    stale = r.arm.startswith("stale")
    w = MetricWriter(r.workdir)
    for u in range(8):
      values = {f"sync/fired/{c}": 0.0 for c in CHECKS}
      if stale and u >= (4 if r.seed == 301 else 5):
        values["sync/fired/bitwise"] = 1.0
      if not stale and r.seed == 302 and u == 2:
        values["sync/fired/padding"] = 1.0
      w.write_scalars(u + 1 if u else 0, values)
      if u:
        w.write_scalars(u, {"train/reward": 0.3})
    w.write_scalars(8, {"train/reward": 0.3})
    w.close()
  rows = {row[0]: row[1:] for row in _table(appendix.detection_counts(str(tmp_path)),
                                            "Detections")}
  assert rows["stale_sync_1: bitwise fired at update 4"] == ["1 of 2", "0.975"]
  assert rows["every fault: parity fired at update 4"] == ["**0 of 2**", "1.000"]
  assert rows["clean syncs: bitwise silent"] == ["16 of 16", f"{1 - 0.05 ** (1 / 16):.3f}"]
  assert rows["clean syncs: padding silent"][0] == "15 of 16"
