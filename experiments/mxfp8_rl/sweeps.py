"""The ``mxfp8_rl`` sweeps: learner x sampler precision, and planted sync faults.

    python -m launch.sweep --sweep=mxfp8_rl --sweep_dir=experiments/mxfp8_rl/report \
        --parallel=2
    python -m launch.sweep --sweep=mxfp8_rl_faults \
        --sweep_dir=experiments/mxfp8_rl/report_faults --parallel=2

GRPO on 3-digit addition (:mod:`experiments.mxfp8_rl`), the sampler synced every
update, token-level TIS, the seven weight-sync checks at every sync in record mode
(``sync_checks=record``: each check's statistic and whether it fired under the
library's current gates are logged at every sync, and no run stops on one). Every
seed has its own warm start (``warm_start_per_seed``, trained until its greedy accuracy
on its own held-out problems reaches 0.4, checked every 50 steps, at most 4000: the
stale_sampler sweep's rule, whose warm starts for seeds 1-4 these share).

**``mxfp8_rl``: matched vs crossed precision.** The four (learner, sampler) recipe
pairs in {bf16, mxfp8}^2, seeds 1-4, 128 updates, each arm its own rollout stream.
Claims (declared here, before the runs): a matched pair has a lower sampler-learner
mismatch on the sampled tokens than the crossed pair with the same sampler
(``mismatch/k3_mean_over_training``), paired by seed, for each sampler; the matched
pair learns more than that crossed pair (``accuracy/mean_over_training``); MXFP8 end
to end matches bf16 end to end in accuracy within 0.03 (8 of 256 held-out problems;
NeMo-RL's 0.613 vs 0.616 is the paper-side reference). Its clean runs are also the
out-of-sample check of the gates that ``mxfp8_rl_faults`` calibrates (other seeds).

**``mxfp8_rl_faults``: planted faults and calibrated gates.** Seeds 11-14 (disjoint
from the first sweep's, so that sweep's runs test the gates chosen here). Arms:
``clean_<pair>`` for all four pairs, and ``<fault>_<pair>`` for each of the seven
faults of :data:`experiments.mxfp8_rl.experiment.PLANTED_FAULTS` on the two pairs with
an MXFP8 sampler (matched ``L-mxfp8_S-mxfp8``, whose parity gate is exact, and crossed
``L-bf16_S-mxfp8``, whose gate was loosened 10x), planted at update
:data:`FAULT_UPDATE` of :data:`FAULT_UPDATES`. A fault arm shares its rollout stream
with the clean arm of its pair, so the two are the same run, bit for bit, until the
fault. The appendix (:mod:`experiments.mxfp8_rl.appendix`) gives the planted-fault
table (fault | check that fired | update | statistic vs gate), each gated statistic's
clean distribution, and the gates from the rule below.

**The gate rule, stated before the runs** (:func:`experiments.mxfp8_rl.appendix.gate`):
for each gated statistic (probe k3 and max |delta logp| for same-recipe and for
cross-recipe pairs; the padding check's largest logit change), the gate is
:data:`SAFETY` x the largest value over every sync of every clean run, rounded up to
one significant digit; where every clean value is 0 the gate stays the exact one in
use (same-recipe parity 1e-10 / 1e-5). The report states, at that gate, the
false-alarm rate on clean runs (leave one seed out: each seed's clean syncs against
the gate from the other seeds), the detection rate on the planted runs (the share of
(fault, seed) runs whose statistic crosses it at or after the fault), and the first
update it does. The checks gated at exactly 0 (coverage, plan, bitwise, version,
finite, MX scales) are reported by the update they fired at and their count.

Claims of ``mxfp8_rl_faults`` (declared here): each planted fault raises the probe
mismatch (``faults/max_after/parity_k3``, the largest probe k3 from the fault's sync
on) above the clean run's over the same updates, paired by seed.

**Sizing** (measured on calibration seed 100, never evaluated: ``python -m
experiments.mxfp8_rl --seed=100 --warm_start_per_seed --pretrain_target_accuracy=0.4
--pretrain_steps=4000 --num_updates=64 --eval_every=16 --learner_recipe=bf16
--sampler_recipe=mxfp8 --sync_checks=record --planted_fault=stale_sync_1
--fault_update=32``, its warm start cached, while three other sweeps loaded the 2
cores, load average 6.5): 51 s wall, of which 24 s start-up (imports, the cached warm
start, its evaluation), 17 s compiling and 0.15 s per update (median; the sync, the
seven checks in record mode, sampling and the update). So ``mxfp8_rl_faults`` is 18
arms x 4 seeds = 72 runs of 64 updates, about 55 s each: about 33 min at
``--parallel=2`` at that load; ``mxfp8_rl`` is 16 runs of 128 updates, about 65 s each:
about 9 min; plus a warm start per seed (8, about a minute each; seeds 1-4 are shared
with the stale_sampler sweep's cache when present). On that run the 1-update-stale
sync on the crossed pair was caught by the bit-exact check at update 32 (5751
differing elements), while its probe k3 after the fault (at most 0.0072) stayed
within the crossed pair's own spread (0.002-0.0045 at updates 29-40) and far below
the current cross-recipe gate of 0.5: the measurement this sweep makes on 4 seeds.
"""

from __future__ import annotations

import dataclasses
import zlib

from experiments.common.sweeps.confirmatory import Pilot
from experiments.common.sweeps.sequential import SequentialPlan
from experiments.common.sweeps.sweep_spec import Arm, Claim, Sweep
from experiments.mxfp8_rl.experiment import PLANTED_FAULTS, MXFP8RLConfig

SEEDS = (1, 2, 3, 4)
FAULT_SEEDS = (11, 12, 13, 14)
CALIBRATION_SEEDS = (100,)  # timed the runs (see SIZING); never evaluated
PAIRS = (("bf16", "bf16"), ("mxfp8", "mxfp8"), ("bf16", "mxfp8"), ("mxfp8", "bf16"))
FAULT_PAIRS = (("mxfp8", "mxfp8"), ("bf16", "mxfp8"))
BASELINE = "L-bf16_S-bf16"
NUM_UPDATES = 128
FAULT_UPDATES = 64
FAULT_UPDATE = 32
FAULTS = tuple(f for f in PLANTED_FAULTS if f != "none")
SAFETY = 2.0
EQUIVALENCE_MARGIN = 0.03
# The check each planted fault is meant to trip at its sync (the tests hold a tiny run
# to it). None for transposed_block_axis: with E4M3 elements a block's scale only
# sets which elements fall below the normal range (2^-15 of the block's amax and
# less), so MX blocks along the output axis serve the same bits as along the
# contraction axis except for such tiny elements (a tiny model: none at all); the
# sweep measures how many differ and whether any check sees them.
INTENDED_CHECK = {"stale_sync_1": "bitwise", "stale_sync_4": "bitwise",
                  "dropped_tensor": "bitwise", "wrong_bf16_list": "plan",
                  "floor_vs_rceil": "bitwise", "transposed_block_axis": None,
                  "corrupted_scale": "bitwise"}
_WARM = dict(warm_start_per_seed=True, pretrain_target_accuracy=0.4,
             pretrain_check_every=50, pretrain_steps=4000)


def pair_name(learner: str, sampler: str) -> str:
  return f"L-{learner}_S-{sampler}"


def _stream(name: str) -> int:
  return 1 + zlib.crc32(name.encode()) % (1 << 28)


def _pair(learner: str, sampler: str) -> dict[str, str]:
  return {"learner_recipe": learner, "sampler_recipe": sampler}


def mxfp8_rl() -> Sweep:
  """The four (learner, sampler) recipe pairs, seeds 1-4, 128 updates."""
  # fault_update 1: the faults/max_after/* statistics cover every sync after update 0.
  base = MXFP8RLConfig(num_updates=NUM_UPDATES, eval_every=16, sync_checks="record",
                       fault_update=1, **_WARM)
  arms = tuple(Arm(pair_name(l, s), {**_pair(l, s), "sampling_stream":
                                     _stream(pair_name(l, s))}) for l, s in PAIRS)
  mm, bb = pair_name("mxfp8", "mxfp8"), pair_name("bf16", "bf16")
  crossed = {"mxfp8": pair_name("bf16", "mxfp8"), "bf16": pair_name("mxfp8", "bf16")}
  claims = []
  for sampler, matched in (("mxfp8", mm), ("bf16", bb)):
    claims.append(Claim(f"matched precision lowers the mismatch ({sampler} sampler)",
                        "better", matched, crossed[sampler],
                        "mismatch/k3_mean_over_training",
                        source="MXFP8 RL, as summarized; LMSYS unified FP8"))
    claims.append(Claim(f"matched precision learns more ({sampler} sampler)", "better",
                        matched, crossed[sampler], "accuracy/mean_over_training",
                        source="MXFP8 RL, as summarized"))
  claims.append(Claim("MXFP8 end to end matches bf16 end to end", "equivalent", mm, bb,
                      "accuracy/mean_over_training", margin=EQUIVALENCE_MARGIN,
                      source="NeMo-RL FP8: 0.613 vs 0.616"))
  return Sweep(
      name="mxfp8_rl", module="experiments.mxfp8_rl", base=base, arms=arms, seeds=SEEDS,
      calibration_seeds=CALIBRATION_SEEDS, baseline=BASELINE, claims=tuple(claims),
      metrics=("mismatch/k3_mean_over_training", "accuracy/mean_over_training",
               "accuracy/last_quarter", "reward/mean_over_training",
               "faults/max_after/parity_k3", "faults/max_after/padding_max_abs_diff"),
      higher_is_better=("accuracy/mean_over_training", "accuracy/last_quarter",
                        "reward/mean_over_training"),
      curves=("train/mismatch_k3", "sync/stat/parity_k3", "eval/greedy_accuracy"),
      appendix="experiments.mxfp8_rl.appendix:mxfp8_rl_appendix",
      description="MXFP8 RL in miniature: the learner trains in one recipe and the "
      "sampler serves in another (MXFP8: the projections' kernels quantized at each "
      "sync, 1x32 blocks along the contraction axis; head bf16; embeddings and norms "
      "float32). Arms are L-<learner>_S-<sampler>. Each seed has its own warm start; "
      "each arm its own rollout stream; the sync checks record (never stop a run).",
      report_dir="experiments/mxfp8_rl/report")


def fault_arm_name(fault: str, learner: str, sampler: str) -> str:
  return f"{'clean' if fault == 'none' else fault}_{pair_name(learner, sampler)}"


def mxfp8_rl_faults() -> Sweep:
  """Clean runs of the four pairs and each fault on the two MXFP8-sampler pairs."""
  base = MXFP8RLConfig(num_updates=FAULT_UPDATES, eval_every=16, sync_checks="record",
                       fault_update=FAULT_UPDATE, **_WARM)

  def arm(fault, learner, sampler):
    return Arm(fault_arm_name(fault, learner, sampler),
               {**_pair(learner, sampler), "planted_fault": fault,
                "sampling_stream": _stream(pair_name(learner, sampler))})

  arms = [arm("none", l, s) for l, s in PAIRS]
  arms += [arm(f, l, s) for l, s in FAULT_PAIRS for f in FAULTS]
  claims = tuple(
      Claim(f"{f} raises the probe mismatch ({pair_name(l, s)})", "worse",
            fault_arm_name(f, l, s), fault_arm_name("none", l, s),
            "faults/max_after/parity_k3", source="issue 18: the live parity check")
      for l, s in FAULT_PAIRS for f in FAULTS)
  return Sweep(
      name="mxfp8_rl_faults", module="experiments.mxfp8_rl", base=base, arms=tuple(arms),
      seeds=FAULT_SEEDS, calibration_seeds=CALIBRATION_SEEDS,
      baseline=fault_arm_name("none", "mxfp8", "mxfp8"), claims=claims,
      metrics=("faults/max_after/parity_k3", "faults/max_after/parity_max_abs_delta_logp",
               "faults/max_after/padding_max_abs_diff",
               "faults/max_after/bitwise_differing", "faults/fired_fraction/bitwise",
               "faults/fired_fraction/parity"),
      curves=("sync/stat/parity_k3", "sync/stat/padding_max_abs_diff"),
      appendix="experiments.mxfp8_rl.appendix:mxfp8_rl_faults_appendix",
      description="Sync faults planted at run time through the real export, at update "
      f"{FAULT_UPDATE} of {FAULT_UPDATES}, with every check recording its statistic "
      "at every sync: which check fires, when, and by how much; the clean runs' "
      "distribution of each gated statistic and the gates chosen from it. Arms are "
      "<fault or clean>_L-<learner>_S-<sampler>; a fault arm shares its rollout "
      "stream with its pair's clean arm.",
      report_dir="experiments/mxfp8_rl/report_faults")


# ---- The confirmatory round (issue 36) ------------------------------------------------

# Fresh: the pilots used 1-4 and 11-14 and timed on 100. The same fresh seeds as the
# stale_sampler and fair_cast confirmatory rounds, whose warm starts (same fields) these
# share when the cache holds them.
CONFIRM_SEEDS = tuple(range(201, 211))
CONFIRM_PLAN = SequentialPlan(batch=3, first=4, cap=10)  # looks at 4, 7, 10 seeds


def _confirm_claims() -> tuple[Claim, ...]:
  """The pilot's three undecided claims, as the pilot declared them."""
  pilot = mxfp8_rl().claims
  return tuple(c for c in pilot if c.text in (
      "matched precision learns more (mxfp8 sampler)",
      "matched precision learns more (bf16 sampler)",
      "MXFP8 end to end matches bf16 end to end"))


CONFIRM_PILOTS = {c.text: Pilot("experiments/mxfp8_rl/report", c.arm, c.baseline)
                  for c in _confirm_claims()}


def mxfp8_rl_confirm() -> Sweep:
  """The confirmatory round of the pilot's three undecided claims on fresh seeds."""
  pilot = mxfp8_rl()
  return dataclasses.replace(
      pilot, name="mxfp8_rl_confirm", seeds=CONFIRM_SEEDS, calibration_seeds=(),
      claims=_confirm_claims(), sequential=CONFIRM_PLAN,
      appendix="experiments.mxfp8_rl.appendix:confirm_appendix",
      description="Confirmatory round (issue 36) of the three claims the pilot "
      "(`experiments/mxfp8_rl/report`, seeds 1-4) left undecided: matched precision "
      "learns more, for each sampler, and MXFP8 end to end ties bf16 end to end (TOST "
      "0.03), on fresh seeds 201-210 with the pilot's four arms, model, task and 128 "
      "updates. **Plan** (declared before the first run): O'Brien-Fleming-type "
      "spending at level 0.05, looks at 4, 7 and 10 seeds. **Sizing**: at the pilot's "
      "paired effects and spreads, a simulation of this plan decides the tie with "
      "probability 1.00 (held 0.60, differs 0.40) and each 'learns more' claim with "
      "probability 0.55-0.61 (the mxfp8-sampler one towards the opposite); 12 seeds would "
      "add 10 points for 8 more runs. All four arms are named by the 'learns more' "
      "claims, so all run until both decide. A pilot run took 89-321 s at the pilot's "
      "load (median over arms about 160 s), plus one warm start per seed: 4 arms x 10 "
      "seeds = 40 runs at most, about 55-65 min at --parallel=2. Nothing was shrunk.",
      report_dir="experiments/mxfp8_rl/report_confirm")


# ---- The faults' confirmatory round (issue 50) ----------------------------------------

# Fresh: the mxfp8_rl sweeps used 1-4, 11-14, 201-210 and timed on 100.
FAULTS_CONFIRM_SEEDS = tuple(range(301, 309))
FAULTS_CONFIRM_PLAN = SequentialPlan(batch=2, first=4, cap=8)  # looks at 4, 6, 8 seeds
FAULTS_CONFIRM_PAIR = ("mxfp8", "mxfp8")
# The pilot's undecided matched-pair faults whose probe can see them (stale_sync_1,
# corrupted_scale) and its subtlest decided one (floor_vs_rceil: about 500 elements).
# Cut for time (about an hour at --parallel=1): stale_sync_4 (stale_sync_1's mechanism,
# twice the footprint), wrong_bf16_list (the plan check compares two plans: caught by
# construction), dropped_tensor (a whole stale tensor, decided in the pilot), and
# transposed_block_axis (its footprint, elements below 2^-15 of a block's amax, is the
# warm start's, not the check's; the probe never saw it: k3 exactly 0 on 3 of 4 seeds).
FAULTS_CONFIRM_FAULTS = ("stale_sync_1", "floor_vs_rceil", "corrupted_scale")
BITWISE = "faults/max_after/bitwise_differing"
PARITY_K3 = "faults/max_after/parity_k3"


def _faults_confirm_claims() -> tuple[Claim, ...]:
  """Per fault: the bitwise count rises above clean (not declared by the pilot), and the
  pilot's own probe-k3 claim (same-recipe parity, exact gate)."""
  pilot = {(c.arm, c.metric): c for c in mxfp8_rl_faults().claims}
  clean = fault_arm_name("none", *FAULTS_CONFIRM_PAIR)
  out = []
  for f in FAULTS_CONFIRM_FAULTS:
    arm = fault_arm_name(f, *FAULTS_CONFIRM_PAIR)
    out.append(Claim(f"{f} raises the bitwise check's differing elements "
                     f"({pair_name(*FAULTS_CONFIRM_PAIR)})", "worse", arm, clean, BITWISE,
                     source="issue 18: the bit-exact sync check"))
    out.append(pilot[(arm, PARITY_K3)])
  return tuple(out)


FAULTS_CONFIRM_PILOTS = {
    c.text: Pilot("experiments/mxfp8_rl/report_faults", c.arm, c.baseline,
                  declared=c.metric == PARITY_K3) for c in _faults_confirm_claims()}


def mxfp8_rl_faults_confirm() -> Sweep:
  """The planted-fault claims on the matched pair, sequentially, on fresh seeds."""
  pilot = mxfp8_rl_faults()
  claims = _faults_confirm_claims()
  named = {a for c in claims for a in (c.arm, c.baseline)}
  return dataclasses.replace(
      pilot, name="mxfp8_rl_faults_confirm", seeds=FAULTS_CONFIRM_SEEDS,
      calibration_seeds=(), arms=tuple(a for a in pilot.arms if a.name in named),
      baseline=fault_arm_name("none", *FAULTS_CONFIRM_PAIR), claims=claims,
      sequential=FAULTS_CONFIRM_PLAN,
      appendix="experiments.mxfp8_rl.appendix:faults_confirm_appendix",
      description="Confirmatory round (issue 50) of the planted-fault claims of the "
      "pilot (`experiments/mxfp8_rl/report_faults`, seeds 11-14), on fresh seeds 301-308 "
      "with the pilot's model, task, 64 updates, fault at update 32, and arm configs, on "
      "the matched pair L-mxfp8_S-mxfp8 only (whose parity gate is exact; the crossed "
      "pair's probe cannot tell a fault from its own noise, as the pilot found). Three "
      "faults: stale_sync_1 and corrupted_scale (the pilot's probe-k3 claims left them "
      "undecided) and floor_vs_rceil (decided, the subtlest). Per fault two claims, "
      "paired by seed against the clean run on the same rollout stream: the bitwise "
      "check's differing served elements after the fault rise above clean "
      "(`faults/max_after/bitwise_differing`, never declared by the pilot: 56 of 56 "
      "there), and the pilot's claim that the probe k3 rises "
      "(`faults/max_after/parity_k3`). The appendix counts, per run, the check that "
      "fired at the fault's sync and every alarm on the clean runs (declared counts: "
      "the bitwise check fires at update 32 in every fault run; no check fires at any "
      "clean sync), with exact 95% bounds. The runs record under the library's gates "
      "now (padding 0.7, the pilot's 0.1); the claims' statistics do not depend on "
      "gates. **Plan** (declared before the first run): O'Brien-Fleming-type spending "
      "at level 0.05, looks at 4, 6 and 8 seeds. **Sizing**: at the pilot's paired "
      "effects and spreads, a simulation of this plan (4000 sweeps) decides each bitwise "
      "claim at the first look (probability 1.00; corrupted_scale's 32 elements had sd "
      "0) and the k3 claims with probability 0.99 (floor_vs_rceil, 1.9 sd), 0.82 "
      "(corrupted_scale, 1.2 sd) and 0.55 (stale_sync_1, 0.9 sd, one seed's 0.024 "
      "against 0.001-0.006: heavy-tailed). **In time**: a pilot run of these arms took "
      "38-136 s (median about 90 s) at --parallel=1 on a loaded 2-core machine, plus a "
      "warm start per seed (800-2200 steps): the first look is 16 runs and 4 warm "
      "starts (about 30 min), each later look at most 8 runs and 2 warm starts (about "
      "15 min): at most 32 runs (29 expected in the simulation), about 60 min. Cut "
      "to fit: the crossed pair and four of the seven faults (`FAULTS_CONFIRM_FAULTS` "
      "says why each), not the runs' length or the seeds.",
      report_dir="experiments/mxfp8_rl/report_confirm_faults")
