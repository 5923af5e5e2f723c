"""Sequential sweeps: the look-by-look loop, its record, and the report's claims table.

A sweep that declares a :class:`experiments.common.sweeps.sequential.SequentialPlan` runs in
looks (docs/sweeps.md, "Sequential sweeps"). :func:`run_sequential`, called by
``launch.sweep``, repeats: schedule the next batch of the plan's seeds for the arms
that an undecided claim names (as arm or baseline), run them (runs that already have
a results row are skipped), decide every undecided claim on all the seeds so far, and
append the look to ``<sweep_dir>/looks.jsonl``. It stops when every claim is decided
or the cap is reached. The manifest lists the runs scheduled so far.

A look is recorded only once every run it scheduled has a results row, and the
schedule of look ``k + 1`` is a function of the results of looks ``1..k``, so a rerun
after a failure or an interrupt schedules the same runs and runs only what is missing.
The report recomputes every decision from ``results.jsonl`` (the record is the audit
trail of what was run and decided when) and says so if the two disagree.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Callable, NamedTuple, Sequence

from experiments.common.sweeps.confirmatory import LOOKS_FILE, read_looks
from experiments.common.sweeps.sequential import (ClaimOutcome, SequentialPlan, arms_needed,
                                                  interval_cell, sweep_outcomes)
from experiments.common.sweeps.sweep_data import evaluation_metrics, read_sweep_results
from experiments.common.sweeps.sweep_spec import Sweep
from launch.manifest import RunSpec


def declaration(sweep: Sweep) -> dict[str, Any]:
  """What the looks were decided under: a rerun must declare the same to resume."""
  plan = sweep.sequential
  return {"plan": dataclasses.asdict(plan), "seeds": list(sweep.seeds[:plan.cap]),
          "claims": [dataclasses.asdict(c) for c in sweep.claims]}


def _values(sweep_dir: str) -> Callable[[str, str], dict[int, float]]:
  _, runs = evaluation_metrics(sweep_dir)
  return lambda arm, metric: {s: m[metric] for s, m in runs.get(arm, {}).items()
                              if metric in m}


def _outcomes(sweep: Sweep, values_of, looks_done: int) -> list[ClaimOutcome]:
  return sweep_outcomes(sweep.sequential, [dataclasses.asdict(c) for c in sweep.claims],
                        sweep.seeds[:sweep.sequential.cap], sweep.higher_is_better,
                        values_of, looks_done)


def sweep_outcomes_now(sweep: Sweep, sweep_dir: str, looks_done: int) -> list[ClaimOutcome]:
  """Every claim's outcome after the first ``looks_done`` looks, from the results."""
  values_of = _values(sweep_dir) if looks_done else (lambda arm, metric: {})
  return _outcomes(sweep, values_of, looks_done)


def _decision_record(index: int, claim: dict[str, Any], outcome: ClaimOutcome
                     ) -> dict[str, Any]:
  last = outcome.last
  return {"claim": index, "text": claim["text"], "verdict": outcome.verdict,
          "n": last.n, "seeds": list(last.seeds), "mean": last.mean, "ci": list(last.ci),
          "inner": list(last.inner), "critical": [last.two_sided, last.one_sided]}


class SequentialRun(NamedTuple):
  """Where :func:`run_sequential` stopped: every recorded look; ``missing``, the runs
  of the unfinished look without a results row (empty when it stopped for good);
  ``done``, every claim decided or the cap reached."""

  looks: list[dict[str, Any]]
  missing: list[str]
  done: bool


def _check_resumable(records: Sequence[dict[str, Any]], sweep: Sweep,
                     names: set[str], path: str) -> None:
  expected = declaration(sweep)
  schedule = sweep.sequential.looks()
  for i, rec in enumerate(records):
    if (rec.get("look") != i + 1 or i >= len(schedule) or rec.get("n") != schedule[i]
        or rec.get("declaration") != expected):
      raise ValueError(f"{path} records look {i + 1} of another plan, seeds or claims than "
                       f"sweep {sweep.name!r} declares now; a changed declaration needs a "
                       "fresh --sweep_dir (its looks were decided under the old one)")
    unknown = sorted(set(rec.get("runs", [])) - names)
    if unknown:
      raise ValueError(f"{path} look {i + 1} ran {unknown[:3]}, which are not runs of this "
                       "sweep with these overrides; rerun with the overrides it was started "
                       "with, or use a fresh --sweep_dir")


def next_batch(sweep: Sweep, runs: Sequence[RunSpec], outcomes: Sequence[ClaimOutcome],
               looks_done: int) -> list[RunSpec]:
  """The runs of look ``looks_done + 1``: the next seeds of the plan for every arm an
  undecided claim names (empty when every claim is decided or the cap is reached)."""
  plan = sweep.sequential
  schedule = plan.looks()
  needed = arms_needed([dataclasses.asdict(c) for c in sweep.claims], outcomes)
  if looks_done >= len(schedule) or not needed:
    return []
  previous = schedule[looks_done - 1] if looks_done else 0
  new_seeds = sweep.seeds[previous:schedule[looks_done]]
  by_key = {(r.arm, r.seed): r for r in runs if not r.calibration}
  return [by_key[(a.name, s)] for a in sweep.arms if a.name in needed for s in new_seeds]


def _reindexed(runs: Sequence[RunSpec]) -> list[RunSpec]:
  # A manifest's indices are 0..n-1 (commands.txt lines, SLURM array tasks).
  return [dataclasses.replace(r, index=i) for i, r in enumerate(runs)]


def scheduled_runs(runs: Sequence[RunSpec], records: Sequence[dict[str, Any]]) -> list[RunSpec]:
  """The runs of the recorded looks, in look order."""
  by_name = {r.run_name: r for r in runs}
  return _reindexed([by_name[n] for rec in records for n in rec["runs"]])


def run_sequential(sweep: Sweep, sweep_dir: str, runs: Sequence[RunSpec],
                   run_batch: Callable[[list[RunSpec]], object],
                   prepare_look: Callable[[list[RunSpec]], object],
                   say: Callable[[str], object] = print) -> SequentialRun:
  """Runs ``sweep`` (which declares a sequential plan) look by look from where its
  ``looks.jsonl`` stops.

  ``runs``: the expansion of every arm on every declared seed (with the overrides in
  force). Each look calls ``prepare_look(scheduled)`` with every run scheduled so far
  (write the manifest) and then ``run_batch(scheduled)`` (run those without a results
  row). Returns at the end, or as soon as a look's runs do not all have a results row
  (the look is then not recorded; a rerun resumes it).
  """
  plan: SequentialPlan = sweep.sequential
  if plan is None:
    raise ValueError(f"sweep {sweep.name!r} declares no sequential plan")
  path = os.path.join(sweep_dir, LOOKS_FILE)
  records = read_looks(sweep_dir)
  _check_resumable(records, sweep, {r.run_name for r in runs}, path)
  schedule = plan.looks()
  scheduled = scheduled_runs(runs, records)
  claims = [dataclasses.asdict(c) for c in sweep.claims]
  if records:  # a resume: the recorded looks must still be what the results say
    values_of = _values(sweep_dir)
    for k, rec in enumerate(records, start=1):
      recorded = {d["claim"] for d in rec["decided"]}
      now = {i for i, o in enumerate(_outcomes(sweep, values_of, k)) if o.decided_look == k}
      if recorded != now:
        raise ValueError(f"{path}: look {k} decided claims {sorted(recorded)}, but the "
                         f"results now decide {sorted(now)} there; results.jsonl changed "
                         "after the look was recorded")
  outcomes = sweep_outcomes_now(sweep, sweep_dir, len(records))
  while True:
    k = len(records)
    batch = next_batch(sweep, runs, outcomes, k)
    if not batch:
      reason = "every claim is decided" if k < len(schedule) else "the cap is reached"
      say(f"sequential sweep {sweep.name}: stopped after look {k} of {len(schedule)} "
          f"({reason})")
      return SequentialRun(records, [], True)
    previous = schedule[k - 1] if k else 0
    arms = sorted({r.arm for r in batch}, key=[a.name for a in sweep.arms].index)
    say(f"sequential sweep {sweep.name}: look {k + 1} of {len(schedule)}: seeds "
        f"{list(sweep.seeds[previous:schedule[k]])} for arms {arms}")
    current = _reindexed([*scheduled, *batch])
    prepare_look(current)
    run_batch(current)
    rows = read_sweep_results(sweep_dir).rows
    missing = [r.run_name for r in current if r.run_name not in rows]
    if missing:
      return SequentialRun(records, missing, False)
    outcomes = _outcomes(sweep, _values(sweep_dir), k + 1)
    record = {"look": k + 1, "of": len(schedule), "n": schedule[k],
              "seeds": list(sweep.seeds[:schedule[k]]),
              "new_seeds": list(sweep.seeds[previous:schedule[k]]), "arms": arms,
              "runs": [r.run_name for r in batch],
              "decided": [_decision_record(i, claims[i], o) for i, o in enumerate(outcomes)
                          if o.decided_look == k + 1],
              "undecided": [i for i, o in enumerate(outcomes) if not o.decided_look],
              "declaration": declaration(sweep)}
    with open(path, "a") as f:
      f.write(json.dumps(record, sort_keys=True) + "\n")
    for d in record["decided"]:
      say(f"  decided at look {k + 1}: {d['text']!r}: {d['verdict']}")
    records.append(record)
    scheduled = current


# ---- The report's claims table -------------------------------------------------------

def _percent(level: float) -> str:
  return f"{100 * level:g}%"


def _interval(claim: dict[str, Any], outcome: ClaimOutcome, plan: SequentialPlan,
              higher_is_better: bool) -> str:
  if outcome.last is None:
    return "n/a (fewer than 2 paired seeds)"
  return interval_cell(claim, outcome.last, plan, higher_is_better, constants=True)


def _unnamed_arms(info: dict[str, Any], claims: Sequence[dict[str, Any]]) -> str:
  named = {a for c in claims for a in (c["arm"], c["baseline"])}
  unnamed = [a["name"] for a in info["arms"] if a["name"] not in named]
  if not unnamed:
    return ""
  return (" Arms that no claim names are not run: "
          + ", ".join(f"`{a}`" for a in unnamed) + ".")


def _seed_list(seeds: Sequence[int]) -> str:
  return "[" + ", ".join(str(s) for s in seeds) + "]"


def claims_table(sweep_dir: str, info: dict[str, Any],
                 values_of: Callable[[str, str], dict[int, float]]) -> list[str]:
  """Markdown lines: a sequential sweep's claims with their repeated intervals, the
  look that decided each and the seeds it used, then the looks as run."""
  plan = SequentialPlan(**info["sequential"])
  schedule = plan.looks()
  claims = info.get("claims", [])
  records = read_looks(sweep_dir)
  done = len(records)
  higher = set(info.get("higher_is_better", []))
  outcomes = sweep_outcomes(plan, claims, info["seeds"][:plan.cap], sorted(higher),
                            values_of, done)
  spending = {"obrien_fleming": "O'Brien-Fleming-type",
              "pocock": "Pocock-type"}[plan.spending]
  lines = ["## Claims", "",
           f"Declared in the sweep before the runs, with a sequential plan: looks at "
           f"{', '.join(map(str, schedule))} evaluation seeds (the declared seeds in order, "
           f"cap {plan.cap}), {spending} Lan-DeMets alpha spending at level {plan.alpha:g}. "
           "At each look every undecided claim is tested on all its paired seeds so far "
           "(`arm − baseline` by seed) with a *repeated* confidence interval, mean ± c·sd/√n "
           "with c calibrated for the paired t statistic at this look schedule (wider than "
           "the fixed-n interval), so the chance of a false decision over all looks stays "
           "within the level. A claim keeps the verdict of the look that decided it; an arm "
           "stops running once every claim that names it is decided. *better*/*worse*: held "
           f"when the repeated {_percent(1 - plan.alpha)} interval excludes 0 on the claimed "
           f"side; *equivalent*: held when the repeated {_percent(1 - 2 * plan.alpha)} "
           "interval lies within the margin, *differs* when the repeated "
           f"{_percent(1 - plan.alpha)} interval excludes 0; *not_better*: held when the "
           f"repeated one-sided {_percent(1 - plan.alpha)} bound on the arm's gain is below "
           "the margin, *opposite* when the repeated interval shows a gain. *Not decided* "
           "at the cap means the sweep lacked the power, not that the claim failed. "
           f"Looks completed: {done} of {len(schedule)}. The paired differences further down "
           "are fixed-n intervals over every seed each arm ran: descriptive, not decisions "
           "(docs/sweeps.md, \"Sequential sweeps\")." + _unnamed_arms(info, claims), ""]
  mismatched = []
  for rec in records:
    for d in rec.get("decided", []):
      o = outcomes[d["claim"]] if d["claim"] < len(outcomes) else None
      if o is None or o.decided_look != rec["look"] or o.verdict != d["verdict"]:
        mismatched.append(f"claim {d['claim'] + 1} at look {rec['look']}")
  if mismatched:
    lines += [f"**{LOOKS_FILE} records decisions that the results no longer give** ("
              + ", ".join(mismatched) + "); the table shows what the results give.", ""]
  lines += ["| claim | comparison | adjusted interval (at the deciding look) | look decided "
            "| seeds used | verdict |", "|---|---|---|---|---|---|"]
  for i, (c, o) in enumerate(zip(claims, outcomes), start=1):
    source = f" ({c['source']})" if c.get("source") else ""
    look = (f"{o.decided_look} of {len(schedule)} (n = {o.last.n})" if o.decided_look
            else "—")
    seeds = _seed_list(o.last.seeds) if o.last else "—"
    lines.append(f"| {i}. {c['text']}{source} | `{c['arm']}` {c['kind']} than/as "
                 f"`{c['baseline']}` on `{c['metric']}` | "
                 f"{_interval(c, o, plan, c['metric'] in higher)} | {look} | {seeds} | "
                 f"**{o.verdict}** |")
  lines.append("")
  if records:
    lines += ["### Looks", "", "As run (`looks.jsonl`): the seeds each look added, the arms "
              "that ran them, and the claims it decided.", "",
              "| look | new seeds | arms run | decided at this look |", "|---|---|---|---|"]
    for rec in records:
      decided = ", ".join(f"{d['claim'] + 1} ({d['verdict']})" for d in rec["decided"])
      lines.append(f"| {rec['look']} of {rec['of']} | {_seed_list(rec['new_seeds'])} "
                   f"(n = {rec['n']}) | {', '.join(f'`{a}`' for a in rec['arms'])} | "
                   f"{decided or '—'} |")
    lines.append("")
  return lines
