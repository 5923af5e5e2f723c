"""The ``stale_sampler`` sweep: Pan's staleness cliff and decoupled cooling in miniature.

    python -m launch.sweep --sweep=stale_sampler \
        --sweep_dir=experiments/stale_sampler/report --parallel=2

GRPO on 3-digit addition (:mod:`experiments.stale_sampler`), scaled down from the
paper (Qwen2.5-Math-1.5B on GSM8K, K = 96 / 192): a 2-block d_model 64 LM, 16
problems x 8 samples per update, the sampler refreshed every K learner updates.

**Seeds.** Every evaluation seed has its own warm start (``warm_start_per_seed``: the
supervised pretraining, its held-out problems and the RL problems all come from the
run's seed). A fixed number of pretraining steps is a lottery across seeds (1200 steps
gave greedy accuracy 0.43 on seed 0, 0.88 on seed 100 and 0.00 on seed 101), so the
warm start trains until its greedy accuracy on its own held-out problems reaches
``pretrain_target_accuracy`` = 0.4 (checked every 50 steps, at most 4000), which
leaves room to learn. Arms draw their rollouts from independent streams
(``sampling_stream``, from the arm's name): the K = 8 and K = 64 arms share their
sampler for the first 8 updates by construction, but not their samples, so they are
not the same run. Pairing is by seed: same warm start, same problems, same held-out set.

**Calibration** (seeds 100 and 101 only, never evaluated; single runs of
``python -m experiments.stale_sampler --seed=S --warm_start_per_seed
--pretrain_target_accuracy=0.4 --pretrain_steps=4000 --num_updates=384
--learning_rate=LR --refresh_interval=K``, TIS unless K = 1; greedy accuracy of the
learner on the 256 held-out problems). The warm starts reached 0.4375 in 850 steps
(seed 100) and 0.340 at the 4000-step cap (seed 101), 0.42 and 0.31 on the RL
evaluation set.

- On-policy (K = 1), 384 updates. lr 3e-4: learns on both seeds (0.42 -> 0.60-0.64;
  0.31 -> 0.37-0.41). lr 6e-4: learns on seed 100 (0.42 -> 0.52-0.58 by update 240),
  flat on seed 101 (0.31 -> 0.30, lowest evaluation 0.20, not degraded). lr 1e-3:
  learns on seed 100 (0.42 -> 0.56-0.64) but *degrades* on seed 101 (0.31 -> 0.08-0.23).
- TIS at lr 3e-4 shows no cliff within reach: K = 128 (384 updates) peaks at 0.55 on
  seed 100 and ends at 0.43-0.46 without crossing the 0.10 line; K = 256 (768 updates)
  still rises through its first cycle (0.42 -> 0.55 on seed 100; 0.28-0.32 on seed
  101). Three cycles of K >= 256 for 12 arms x 5 seeds do not fit the hour.
- TIS at lr 6e-4, K = 64: degrades in its first cycle on seed 101 (0.31 -> 0.17 by
  update 40, 0.14-0.16 at updates 80-112) and dips to 0.34 on seed 100 (0.08 below its
  warm start) at updates 24-40 before recovering.

So the sweep runs at **lr 6e-4**, the largest of {3e-4, 6e-4, 1e-3} at which
on-policy GRPO did not degrade on either calibration seed (it learned on one and held
on the other: "learns well" is only half met, which the report says), with **K_C =
64** the interval just past the cliff; the lower-lr arm is 2e-4 (lr / 3; at 3e-4 TIS
was safe up to K = 256).

**Decided before the runs.**

- *Degraded*: the learner's greedy accuracy on its 256 held-out problems falls more
  than 0.10 below the warm start's for 2 evaluations in a row (evaluated every 8
  updates; :func:`experiments.stale_sampler.appendix.degradation_update`).
- Metrics (from each run's evaluations after update 0): ``accuracy/min`` (the depth of
  the worst dip: what a cliff does), ``accuracy/last_quarter`` (the end of training:
  mean over the last quarter's evaluations), ``accuracy/mean_over_training``.
- The claims below, each a paired comparison over the evaluation seeds with the
  verdict rule of :class:`experiments.common.sweeps.sweep_spec.Claim` (95% t-interval;
  TOST at level 0.05 for "matches", with a margin of 0.05 accuracy: the paper's own
  tie is 0.857 vs 0.857, and 0.05 is about one evaluation's seed-to-seed spread here;
  non-superiority with a margin of 0.02 for "stronger cooling is not better").
- ``num_updates`` = 6 K_C, so the longest interval (2 K_C) completes three cycles.

**Sizing.** 12 arms x 5 seeds = 60 runs of 384 updates. A 384-update run costs about
35 s on an idle core (16 updates/s, 48 evaluations, compilation) plus, once per seed,
a warm start of up to 4000 supervised steps (about 60 s): about 40 core-minutes, so
within the hour at ``--parallel=2`` on 2 shared cores. The model and the task are the
old sweep's; the seeds went from 3 to 5 and the updates from 192 to 384 (three cycles
of the longest interval, 128). Measured: 4149 s (69 min) for the committed run, with
two other sweeps and a benchmark sharing the 2 cores (runs took 120-200 s under that
load, 35-45 s once it lifted).
"""

from __future__ import annotations

import zlib
from typing import Any

from experiments.common.sweeps.confirmatory import Pilot
from experiments.common.sweeps.sequential import SequentialPlan
from experiments.common.sweeps.sweep_spec import Arm, Claim, Sweep
from experiments.stale_sampler.experiment import StaleSamplerConfig

SEEDS = (1, 2, 3, 4, 5)
CALIBRATION_SEEDS = (100, 101)
LR = 6e-4      # chosen on the calibration seeds (see the module docstring)
K_C = 64       # the TIS cliff at LR on the calibration seeds: the K just past it
LOW_LR = LR / 3
BASELINE = "tis_K1"

_NONE = {"is_method": "none", "ratio_against": "learner"}
_TIS = {"is_method": "token_tis"}


def _lr_label(lr: float) -> str:
  mantissa, exponent = f"{lr:.0e}".split("e")
  return f"lr{mantissa}e{int(exponent)}"


def _arm(method: str, k: int, **overrides: Any) -> Arm:
  """``<method>[_T<temperature>][_lr<lr>]_K<k>`` with the method's IS settings and its
  own rollout stream (a function of the name, so adding an arm changes no other)."""
  name = method
  if "sampler_temperature" in overrides:
    name += f"_T{overrides['sampler_temperature']}"
  if "learning_rate" in overrides:
    name += "_" + _lr_label(overrides["learning_rate"])
  name += f"_K{k}"
  stream = 1 + zlib.crc32(name.encode()) % (1 << 28)
  return Arm(name, {**(_TIS if method == "tis" else _NONE), "refresh_interval": k,
                    "sampling_stream": stream, **overrides})


def _claims() -> tuple[Claim, ...]:
  k, half, quarter, double = K_C, K_C // 2, K_C // 4, 2 * K_C
  cooled, low = f"tis_T0.8_K{k}", f"tis_{_lr_label(LOW_LR)}_K{k}"
  src = "Pan, abstract"
  out = [
      Claim(f"Importance-corrected GRPO refreshed every K = {k} degrades before the "
            "refresh (the cliff), against on-policy GRPO at the same lr", "worse",
            f"tis_K{k}", BASELINE, "accuracy/min", source=src),
      Claim(f"Cooling the sampler (T = 0.8) moves the cliff: at K = {k} the cooled run "
            "survives where the uncooled one degrades", "better", cooled, f"tis_K{k}",
            "accuracy/min", source=src),
      Claim(f"Cooled at K = {k} matches uncooled at the safe K = {half} at the end of "
            "training", "equivalent", cooled, f"tis_K{half}", "accuracy/last_quarter",
            margin=0.05, source=src),
      Claim(f"Cooled at K = {k} matches uncooled at the safe K = {half} averaged over "
            "training", "equivalent", cooled, f"tis_K{half}",
            "accuracy/mean_over_training", margin=0.05, source=src),
      Claim(f"A cooled run at 2K = {double} survives where an uncooled run at K = {k} "
            "fails", "better", f"tis_T0.8_K{double}", f"tis_K{k}", "accuracy/min",
            source="issue 17's reading of Pan"),
      Claim(f"At 2K = {double} (4x the safe interval) cooling delays degradation but "
            "does not prevent it (worse than on-policy)", "worse", f"tis_T0.8_K{double}",
            BASELINE, "accuracy/min", source=src),
      Claim(f"Lowering the learning rate to a safe value ({LOW_LR:.1e}) instead of "
            "cooling ends lower", "worse", low, cooled, "accuracy/last_quarter",
            source=src),
      Claim("Cooling without the IS correction collapses", "worse", f"none_T0.8_K{k}",
            cooled, "accuracy/last_quarter", source=src),
      Claim("Stronger cooling (T = 0.6) is not better than T = 0.8", "not_better",
            f"tis_T0.6_K{k}", cooled, "accuracy/last_quarter", margin=0.02, source=src),
  ]
  for interval in (quarter, half, k):
    out.append(Claim(f"The truncated importance weight lets the sampler lag: TIS beats "
                     f"no correction at K = {interval}", "better", f"tis_K{interval}",
                     f"none_K{interval}", "accuracy/mean_over_training",
                     source="Pan, abstract (the method's premise)"))
  return tuple(out)


def stale_sampler() -> Sweep:
  """On-policy control; TIS and no correction at K_C/4, K_C/2, K_C; cooled TIS at K_C
  and 2 K_C; cooling without IS, stronger cooling and a lower lr at K_C."""
  base = StaleSamplerConfig(
      num_updates=6 * K_C, learning_rate=LR, eval_every=8, log_every=4,
      warm_start_per_seed=True,
      pretrain_target_accuracy=0.4, pretrain_check_every=50, pretrain_steps=4000)
  arms = [_arm("tis", 1)]
  for k in (K_C // 4, K_C // 2, K_C):
    arms += [_arm("tis", k), _arm("none", k)]
  arms += [_arm("tis", K_C, sampler_temperature=0.8),
           _arm("tis", 2 * K_C, sampler_temperature=0.8),
           _arm("none", K_C, sampler_temperature=0.8),
           _arm("tis", K_C, sampler_temperature=0.6),
           _arm("tis", K_C, learning_rate=LOW_LR)]
  return Sweep(
      name="stale_sampler", module="experiments.stale_sampler", base=base,
      arms=tuple(arms), seeds=SEEDS, calibration_seeds=CALIBRATION_SEEDS,
      baseline=BASELINE, claims=_claims(),
      metrics=("accuracy/last_quarter", "accuracy/mean_over_training", "accuracy/min",
               "reward/mean_over_training", "train/mismatch_k3"),
      higher_is_better=("accuracy/last_quarter", "accuracy/mean_over_training",
                        "accuracy/min", "reward/mean_over_training"),
      curves=("eval/greedy_accuracy", "train/mismatch_k3"),
      appendix="experiments.stale_sampler.appendix:stale_sampler_appendix",
      description="Pan, 'Cool the Sampler, Not the Learner', in miniature: GRPO on "
      "3-digit addition with the sampler refreshed every K updates. Arms are named "
      "<correction>[_T<sampler temperature>][_lr<learning rate>]_K<interval>; 'none' "
      "treats the stale samples as on-policy, 'tis' is token-level TIS (C = 2) with "
      "the learner and its importance weights at temperature 1. Each seed has its "
      "own warm start; each arm its own rollout stream.",
      report_dir="experiments/stale_sampler/report")


# ---- The confirmatory round (issue 36) ------------------------------------------------

CONFIRM_SEEDS = tuple(range(201, 213))  # fresh: no pilot or calibration seed of Pan's
CONFIRM_PLAN = SequentialPlan(batch=4, cap=12)  # looks at 4, 8, 12 seeds


def _confirm_claims() -> tuple[Claim, ...]:
  """The pilot's undecided claims that its effect sizes say 12 seeds can decide, as the
  pilot declared them (text, kind, metric, margin)."""
  pilot = {c.text: c for c in _claims()}
  k = K_C
  texts = (f"Cooling the sampler (T = 0.8) moves the cliff: at K = {k} the cooled run "
           "survives where the uncooled one degrades",
           f"Cooled at K = {k} matches uncooled at the safe K = {k // 2} at the end of "
           "training",
           f"A cooled run at 2K = {2 * k} survives where an uncooled run at K = {k} fails",
           "Stronger cooling (T = 0.6) is not better than T = 0.8")
  return tuple(pilot[t] for t in texts)


def stale_sampler_confirm() -> Sweep:
  """The confirmatory round of the pilot's four undecided claims on fresh seeds."""
  pilot = stale_sampler()
  claims = _confirm_claims()
  named = {a for c in claims for a in (c.arm, c.baseline)}
  return Sweep(
      name="stale_sampler_confirm", module=pilot.module, base=pilot.base,
      arms=tuple(a for a in pilot.arms if a.name in named), seeds=CONFIRM_SEEDS,
      baseline=f"tis_K{K_C}", claims=claims, sequential=CONFIRM_PLAN,
      metrics=pilot.metrics, higher_is_better=pilot.higher_is_better,
      curves=pilot.curves,
      appendix="experiments.stale_sampler.appendix:confirm_appendix",
      description="Confirmatory round (issue 36) of Pan's four claims the pilot "
      "(`experiments/stale_sampler/report`, seeds 1-5) left undecided, on fresh seeds "
      "201-212 with the pilot's model, task, lr, budget (384 updates) and arm configs. "
      "Only the five arms the claims name run. **Plan** (declared before the first "
      "run): O'Brien-Fleming-type spending at level 0.05, looks at 4, 8 and 12 seeds. "
      "**Sizing**: at the pilot's paired effects and spreads, a simulation of this plan "
      "decides the cliff claim and the end-of-training tie (both towards the opposite "
      "or *differs*) with probability 0.95 each, 'stronger cooling is not better' 0.84 "
      "and the 2K claim 0.71, using 10-11 seeds on average. A pilot run took 100-200 s "
      "at the pilot's load (median 127 s over these arms), plus one warm start per seed "
      "(about a minute): 5 arms x 12 seeds = 60 runs at most, about 65-70 min at "
      "--parallel=2, less as claims decide and their arms stop. Nothing was shrunk.",
      report_dir="experiments/stale_sampler/report_confirm")


# Each confirmatory claim's pilot: the same comparison in the committed pilot report.
CONFIRM_PILOTS = {c.text: Pilot("experiments/stale_sampler/report", c.arm, c.baseline)
                  for c in _confirm_claims()}
