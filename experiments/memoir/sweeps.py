"""The Memoir sweeps: coupled vs read-only pondering, and a no-write control, at two budgets.

The paper reports a 240-step and a 960-step budget, so the two budgets are two sweeps
of the same experiment; the long one's directory lies inside the short one's, whose
appendix (:mod:`experiments.memoir.appendix`) reports both:

    python -m launch.sweep --sweep=memoir --sweep_dir=experiments/memoir/report --parallel=1
    python -m launch.sweep --sweep=memoir_long --sweep_dir=experiments/memoir/report/long \
        --parallel=1
    python -m launch.report --sweep_dir=experiments/memoir/report/long

Arms (the same data, optimizer, schedule and seeds; ``coupled`` is the baseline, so the
paired difference ``read_only - coupled`` is the paper's "read-only lead"):

* ``coupled``: each pondering iteration rewrites the fast memory it then reads;
* ``read_only``: the same write goes to a shadow memory that is never read (same
  parameters and forward MACs as ``coupled``; its write heads get zero gradient, so it
  trains 4,225 fewer live parameters);
* ``no_write``: the control for that (issue 19): no write heads and no write, the core
  widened from 320 to 346 hidden units (:func:`models.memoir.matched_hidden`) so it
  trains 4,186 parameters in place of the 4,225 of the write heads (79,564 against the
  coupled arm's 79,603). Its declared forward
  MACs are lower (the writes are gone): it separates "read-only" from "fewer live
  parameters" at matched parameters, not at matched MACs.

The task is harder than the earlier sweep's (8 pairs, shared 0.3, query noise 0.1, where
both budgets reached the 0.98 ceiling): TASK below (12 pairs, shared-prototype weight
0.5, query noise 0.3), evaluated on 1024 fixed queries per seed (16 batches of 64).

Calibration of the task (seed 100 only, before the long sweep; final eval recall,
chance 0.0625):

* 16 pairs, shared 0.5, noise 0.3: ``read_only`` at 960 steps 0.801; at 240 steps
  ``coupled`` 0.060, ``read_only`` 0.062 (chance: the short budget does not learn).
* 12 pairs: at 960 steps ``read_only`` 0.862, ``coupled`` 0.864 (both leave chance near
  step 200 and are still rising slowly at the end: 0.849 at 720); at 240 steps
  ``coupled`` 0.150, ``read_only`` 0.177, ``no_write`` 0.063.
* 10 pairs: at 240 steps ``coupled`` 0.070, ``read_only`` 0.077.

Chosen: 12 pairs, whose long budget ends below the ceiling (0.86).

Calibration of the short budget (2026-12-05, after the long sweep; ``coupled`` only,
calibration seeds 100-102, never evaluated). On this task a run sits at chance until a
seed-dependent step, then recall jumps to about 0.7 within 80 steps. With a schedule
of its own (warm-up and cosine over the budget) a short run decays its learning rate
before most seeds take off: at 360 steps 0.651 / 0.062 / 0.068, at 480 steps 0.755 /
0.099 / 0.069 (seeds 100 / 101 / 102). On the long run's 960-step schedule the seeds
take off near steps 220, 380 and 460 (mean recall 0.227 at 240, 0.318 at 360, 0.449 at
400, 0.528 at 440, 0.696 at 480; final 0.80 / 0.81 / 0.78). The short budget therefore
stops the long schedule early (``schedule_steps`` 960): the short run is the first
``SHORT_STEPS`` steps of the long run, bit for bit, so "a fixed budget" compares the
arms at the same point of the same schedule. Rule (declared before looking at any arm
but ``coupled``, and only at calibration seeds): the budget, among the evaluation steps
240-480, whose mean ``coupled`` recall is closest to halfway between chance and the
calibration seeds' final recall ((0.0625 + 0.79) / 2 = 0.43): 400 steps (0.449). The
long sweep's curves (evaluation seeds 0-7, which are also evaluation seeds here) had
been seen before this rule was set: there all arms left chance between steps 160 and
240. The short sweep evaluates every 40 steps, so its curves also give each arm's
recall at the paper's 240 steps.

Sizing: a 960-step run took 72-90 s on the shared 2-core machine (one core, pinned,
while another sweep ran), so 24 runs come to about 30-35 min at ``--parallel=1``.
Measured (2026-12-05): 11.2 min, 675 s (the compilation cache was warm from the calibration
and a discarded first run; runs of about 30 s). A 400-step calibration-sized run took
about 15 s (one pinned core, next to the temperon sweep), so the short sweep's 36 runs
come to about 10-15 min. Measured (2026-12-05): 708 s (11.8 min).

Claims (margins fixed here before the runs; recall is a fraction of 1024 queries). The
equivalence margin is 0.05 recall: well under the paper's short-budget lead (0.135), so
a tie within it is a tie at the paper's own effect scale:

1. (short) Read-only pondering recalls better than coupled: ``read_only`` better than
   ``coupled`` on ``eval/recall`` at 400 steps. The appendix's per-step table gives the
   same paired difference at every evaluation step; its row at step 240 (the paper's
   budget) is decided by the same rule (interval excludes 0) and reported beside it.
2. (short) The lead is not from fewer live parameters: ``no_write`` equivalent to
   ``read_only`` within 0.05.
3. (short) Not writing beats writing at matched live parameters: ``no_write`` better
   than ``coupled``.
4. (long) A learning-speed penalty, not a capability penalty: ``coupled`` equivalent to
   ``read_only`` within 0.05.
5. (long) ``no_write`` equivalent to ``read_only`` within 0.05.
"""

from __future__ import annotations

import dataclasses

from experiments.common.sweeps.confirmatory import Pilot
from experiments.common.sweeps.sequential import SequentialPlan
from experiments.common.sweeps.sweep_spec import Arm, Claim, Sweep
from experiments.memoir.experiment import MemoirExperimentConfig
from lowprec.models import memoir as memoir_lib

SHORT_STEPS = 400
LONG_STEPS = 960
PAPER_SHORT_STEPS = 240
SHORT_SEEDS = tuple(range(12))
LONG_SEEDS = tuple(range(8))
CALIBRATION_SEEDS = (100, 101, 102)
LONG_CALIBRATION_SEEDS = (100,)
RECALL = "eval/recall"
MARGIN = 0.05
PAPER = "Memoir abstract (arXiv 2607.20792)"
TASK = {"num_pairs": 12, "shared": 0.5, "query_noise": 0.3}

BASE = MemoirExperimentConfig(num_steps=SHORT_STEPS, schedule_steps=LONG_STEPS,
                              eval_batches=16, eval_every=40, **TASK)
ARMS = (
    Arm("coupled", {"mode": "coupled"}),
    Arm("read_only", {"mode": "read_only"}),
    Arm("no_write", {"mode": "no_write",
                     "d_hidden": memoir_lib.matched_hidden(BASE.model())}),
)
SHORT_CLAIMS = (
    Claim("read-only pondering recalls better at a fixed (short) budget", "better",
          "read_only", "coupled", RECALL, source=PAPER),
    Claim("the read-only lead is not fewer live parameters (no-write control ties "
          "read-only)", "equivalent", "no_write", "read_only", RECALL, margin=MARGIN,
          source="issue 19 control"),
    Claim("not writing beats writing at matched live parameters", "better", "no_write",
          "coupled", RECALL, source="issue 19 control"),
)
LONG_CLAIMS = (
    Claim("a learning-speed penalty, not a capability penalty (arms tie at the long "
          "budget)", "equivalent", "coupled", "read_only", RECALL, margin=MARGIN,
          source=PAPER),
    Claim("the no-write control ties read-only at the long budget", "equivalent",
          "no_write", "read_only", RECALL, margin=MARGIN, source="issue 19 control"),
)


def memoir() -> Sweep:
  """Short budget: coupled, read-only and no-write, the first 400 steps of the 960-step
  schedule, 12 seeds (36 runs)."""
  return Sweep(
      name="memoir", module="experiments.memoir", base=BASE, arms=ARMS,
      seeds=SHORT_SEEDS, calibration_seeds=CALIBRATION_SEEDS, baseline="coupled",
      metrics=(RECALL, "eval/energy_margin", "train/recall", "eval/expected_depth",
               "eval/memory_drift"),
      higher_is_better=(RECALL, "eval/energy_margin", "train/recall"),
      curves=(RECALL, "train/energy_margin", "eval/energy_margin", "train/loss",
              "train/expected_depth"),
      claims=SHORT_CLAIMS,
      description="Memoir in miniature: does rewriting the fast memory while pondering "
                  "(coupled) hurt recall against read-only pondering at a fixed budget, "
                  "and is a read-only lead more than fewer live parameters (no_write)?",
      appendix="experiments.memoir.appendix:memoir_appendix",
      report_dir="experiments/memoir/report")


def memoir_long() -> Sweep:
  """Long budget: the same arms at 960 steps, 8 seeds (24 runs)."""
  short = memoir()
  return dataclasses.replace(short, name="memoir_long",
                             base=dataclasses.replace(short.base, num_steps=LONG_STEPS,
                                                      schedule_steps=0, eval_every=80),
                             seeds=LONG_SEEDS, claims=LONG_CLAIMS,
                             # Only seed 100 calibrated before the long sweep (its task);
                             # 101 and 102 calibrated the short budget after it.
                             calibration_seeds=LONG_CALIBRATION_SEEDS,
                             report_dir="experiments/memoir/report/long")


# ---- The confirmatory round (issue 36) ------------------------------------------------

# Fresh: the pilots used 0-11 and calibrated on 100-102.
CONFIRM_SEEDS = tuple(range(201, 241))
CONFIRM_PLAN = SequentialPlan(batch=8, cap=40)  # looks at 8, 16, 24, 32, 40 seeds
_AT_PAPER = {"num_steps": PAPER_SHORT_STEPS}  # the first 240 steps of the same schedule

CONFIRM_CLAIMS = (
    Claim(f"read-only pondering recalls better at the paper's {PAPER_SHORT_STEPS} steps",
          "better", f"read_only_{PAPER_SHORT_STEPS}", f"coupled_{PAPER_SHORT_STEPS}",
          RECALL, source=PAPER),
    SHORT_CLAIMS[2],  # not writing beats writing at matched live parameters (400 steps)
)
CONFIRM_PILOTS = {
    CONFIRM_CLAIMS[0].text: Pilot(
        "experiments/memoir/report", "read_only", "coupled", step=PAPER_SHORT_STEPS,
        note="the pilot's declared row at step 240 of its per-step table"),
    CONFIRM_CLAIMS[1].text: Pilot("experiments/memoir/report", "no_write", "coupled"),
}


def memoir_confirm() -> Sweep:
  """The confirmatory round of the two short-budget claims the pilot left undecided."""
  short = memoir()
  by_name = {a.name: a for a in short.arms}
  arms = (Arm(f"coupled_{PAPER_SHORT_STEPS}", {**by_name["coupled"].overrides, **_AT_PAPER}),
          Arm(f"read_only_{PAPER_SHORT_STEPS}",
              {**by_name["read_only"].overrides, **_AT_PAPER}),
          by_name["coupled"], by_name["no_write"])
  return dataclasses.replace(
      short, name="memoir_confirm", arms=arms, seeds=CONFIRM_SEEDS, calibration_seeds=(),
      baseline="coupled", claims=CONFIRM_CLAIMS, sequential=CONFIRM_PLAN,
      appendix="experiments.memoir.appendix:confirm_appendix",
      description="Confirmatory round (issue 36) of the two claims the short-budget "
      "pilot (`experiments/memoir/report`, seeds 0-11) left undecided, on fresh seeds "
      "201-240 with the pilot's model, task and 960-step schedule: read-only pondering "
      "recalls better than coupled at the paper's 240 steps (arms `*_240`: the first 240 "
      "steps of the schedule, bit for bit the pilot's runs at that step; the pilot "
      "declared that step's row of its per-step table beside its 400-step claim), and "
      "the no-write control beats coupled at the pilot's 400 steps. The 240-step arms "
      "are shortened because the claim is about that budget; nothing else was shrunk. "
      "**Plan** (declared before the first run): O'Brien-Fleming-type spending at level "
      "0.05, looks at 8, 16, 24, 32 and 40 seeds. **Sizing**: at the pilot's paired "
      "effects and spreads (0.57-0.58 sd: the take-off step varies by seed), a "
      "simulation of this plan decides each claim with probability 0.92-0.93. A pilot "
      "run took 7-12 s (400 steps, one pinned core): 4 arms x 40 seeds = 160 runs at "
      "most, about 15-25 min at --parallel=2.",
      report_dir="experiments/memoir/report_confirm")


# ---- The energy margin (issue 50): "the energy margin grew and held" ------------------

ENERGY = "eval/energy_margin"
ENERGY_SEEDS = tuple(range(301, 313))  # fresh: the pilots used 0-11, 100-102, 201-232
ENERGY_PLAN = SequentialPlan(batch=4, cap=12)  # looks at 4, 8, 12 seeds
ENERGY_MARGIN = 0.05
_ENERGY_AT = {"schedule_steps": LONG_STEPS}  # every arm on the 960-step schedule

ENERGY_CLAIMS = (
    Claim("the energy margin grows (coupled, step 960 against step 80)", "better",
          "coupled", "coupled_80", ENERGY, source=PAPER + ": the margin 'grew'"),
    Claim("the energy margin holds (coupled: at step 480 it is not above its step-960 "
          "value by the margin or more)", "not_better", "coupled_480", "coupled", ENERGY,
          margin=ENERGY_MARGIN, source=PAPER + ": the margin '... and held'"),
    Claim("rewriting does not corrupt the energy signal (read-only's margin is not "
          "above coupled's by the margin or more at step 960)", "not_better", "read_only",
          "coupled", ENERGY, margin=ENERGY_MARGIN,
          source=PAPER + ": 'a predicted failure did not occur'"),
)


def memoir_energy() -> Sweep:
  """The coupled arm's energy margin over training, and coupled vs read-only at the end."""
  long = memoir_long()
  by_name = {a.name: a for a in long.arms}
  coupled = by_name["coupled"].overrides
  arms = (Arm("coupled", {**coupled, **_ENERGY_AT}),
          Arm("coupled_80", {**coupled, **_ENERGY_AT, "num_steps": 80}),
          Arm("coupled_480", {**coupled, **_ENERGY_AT, "num_steps": 480}),
          Arm("read_only", {**by_name["read_only"].overrides, **_ENERGY_AT}))
  return dataclasses.replace(
      long, name="memoir_energy", arms=arms, seeds=ENERGY_SEEDS, calibration_seeds=(),
      baseline="coupled", claims=ENERGY_CLAIMS, sequential=ENERGY_PLAN,
      metrics=(ENERGY, RECALL, "eval/e_pos", "eval/e_neg"),
      higher_is_better=(ENERGY, RECALL), curves=(ENERGY, RECALL),
      appendix="experiments.memoir.appendix:energy_appendix",
      description="The paper's untested remark that 'the energy margin grew and held' "
      "(issue 50), declared before its runs, on fresh seeds 301-312 with the long "
      "sweep's model, task and 960-step schedule (`experiments/memoir/report/long`, the "
      "pilot: seeds 0-7). `eval/energy_margin` is E(neg) - E(pos) on the 1024 fixed "
      "evaluation queries (the hinge's target is 1.0). Arms `coupled_80` and "
      "`coupled_480` are the first 80 and 480 steps of the same schedule (bit for bit "
      "the 960-step run at those steps), so 'grows' is coupled at 960 against itself at "
      "80 and 'holds' compares 480 with 960, both paired by seed; 'not corrupted' "
      "compares coupled with read-only at 960. Margin 0.05 (declared here): the recall "
      "margin of the other memoir claims, 4% of the pilot's final margin (1.24-1.31). "
      "**Plan**: O'Brien-Fleming-type spending at level 0.05, looks at 4, 8, 12 seeds. "
      "**Sizing** from the pilot's curves (n = 8): growth +0.849 (sd 0.062), step 480 "
      "minus step 960 -0.042 (sd 0.010), read-only minus coupled +0.008 (sd 0.003); a "
      "simulation of this plan decides each with probability 1.00 (4.8, 4.3 and 4.0 "
      "seeds expected). The pilot shows the paper's picture; the point of the round is "
      "that it is declared and decided on seeds no one has looked at. A 960-step run "
      "took about 30 s: 4 arms x 4 seeds is about 5 min at --parallel=2.",
      report_dir="experiments/memoir/report_energy")
