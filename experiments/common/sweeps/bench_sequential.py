"""Timing claims decided by rounds: a sequential benchmark on one pinned core.

A speed claim ("A's step is slower than B's") is a property of the code, not of a
training run's seed, so it is decided by rounds of an interleaved timing in one
process (:func:`numerics.benchmarking.interleaved`: each round calls every method
``repeats`` times, in an order rotated from round to round, and keeps the fastest
call). The paired unit is the round: the difference of log times ``arm − baseline``
(a log ratio), tested look by look with the repeated intervals of
:mod:`experiments.common.sweeps.sequential` (rounds in place of seeds) under a plan declared
before the first round. The machine is shared, so the load average is recorded
before and after each look.

Used by :mod:`experiments.qlora.bench_confirm` and
:mod:`experiments.looped_rl.bench_confirm`; each supplies its methods (jitted calls),
claims and plan, and writes its own report from the JSON record with the pieces here.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from experiments.common.sweeps.sequential import SequentialPlan, claim_outcome
from lowprec.numerics import benchmarking


def cpu_error(cpu: int) -> str | None:
  """Why ``--cpu`` cannot be pinned to (None when it can): -1 or an allowed CPU."""
  allowed = sorted(os.sched_getaffinity(0))
  if cpu == -1 or cpu in allowed:
    return None
  return f"--cpu={cpu}: not one of the CPUs this process may run on {allowed} (or -1)"


@contextlib.contextmanager
def pinned(cpu: int) -> Iterator[tuple[int, list[int]]]:
  """Pins this process to ``cpu`` (-1: the last allowed one) for the block; yields
  (the CPU, the CPUs allowed before) and restores the affinity after."""
  allowed = sorted(os.sched_getaffinity(0))
  cpu = allowed[-1] if cpu < 0 else cpu
  os.sched_setaffinity(0, {cpu})
  try:
    yield cpu, allowed
  finally:
    os.sched_setaffinity(0, set(allowed))


def outcomes(claims: Sequence[dict[str, Any]], plan: SequentialPlan,
             log_s: dict[str, list[float]], looks_done: int) -> list:
  """Every claim's sequential outcome on the rounds so far (rounds are the pairs)."""
  rounds = tuple(range(plan.cap))
  return [claim_outcome(c, dict(enumerate(log_s[c["arm"]])),
                        dict(enumerate(log_s[c["baseline"]])), False, plan, rounds,
                        looks_done) for c in claims]


def log_times(per_round_s: dict[str, list[float]]) -> dict[str, list[float]]:
  """Natural log of every round's time, per method."""
  return {m: [math.log(t) for t in ts] for m, ts in per_round_s.items()}


def run_looks(fns: dict[str, Callable[[], Any]], claims: Sequence[dict[str, Any]],
              plan: SequentialPlan, repeats: int, record: dict[str, Any]) -> dict[str, Any]:
  """Times look after look of rounds until every claim is decided or the cap; fills
  ``record["per_round_s"]`` and ``record["looks"]`` (returned)."""
  record["per_round_s"] = {n: [] for n in fns}
  record["looks"] = []
  done = 0
  schedule = plan.looks()
  for k, n in enumerate(schedule, start=1):
    load_before = [round(x, 2) for x in os.getloadavg()]
    t1 = time.perf_counter()
    times = benchmarking.interleaved(fns, n - done, repeats, first=done)
    for name, ts in times.items():
      record["per_round_s"][name] += ts
    done = n
    now = outcomes(claims, plan, log_times(record["per_round_s"]), k)
    record["looks"].append({
        "look": k, "rounds": n, "wall_s": round(time.perf_counter() - t1, 1),
        "load_average_before": load_before,
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "decided": [{"claim": i, "verdict": o.verdict} for i, o in enumerate(now)
                    if o.decided_look == k]})
    print(f"look {k} of {len(schedule)} ({n} rounds): "
          + "; ".join(f"claim {i + 1}: {o.verdict}" for i, o in enumerate(now)))
    if all(o.decided_look for o in now):
      break
  return record


def fmt(x: float, digits: int = 4) -> str:
  return f"{x:.{digits}f}"


def claims_lines(claims: Sequence[dict[str, Any]], claim_outcomes: list,
                 plan: SequentialPlan,
                 margin_note: Callable[[dict[str, Any]], str]) -> list[str]:
  """The claims table's rows (header included): mean log ratio with its repeated
  interval, the ratio, the deciding look, the rounds used and the verdict.
  ``margin_note(claim)`` says what a ``not_better`` claim's margin is."""
  lines = ["| claim | comparison | mean log ratio [repeated 95%] | ratio | look decided | "
           "rounds used | verdict |", "|---|---|---|---|---|---|---|"]
  for i, (c, o) in enumerate(zip(claims, claim_outcomes), start=1):
    last = o.last
    extra = ""
    if c["kind"] == "not_better":
      extra = (f"; repeated one-sided 95% bound on `{c['arm']}`'s gain "
               f"{fmt(-last.inner[0])} ({margin_note(c)})")
    look = f"{o.decided_look} of {len(plan.looks())}" if o.decided_look else "—"
    lines.append(
        f"| {i}. {c['text']} ({c['source']}) | `{c['arm']}` {c['kind']} than/as "
        f"`{c['baseline']}` on `{c['metric']}` | {fmt(last.mean)} [{fmt(last.ci[0])}, "
        f"{fmt(last.ci[1])}] (c = {last.two_sided:.2f}){extra} | {math.exp(last.mean):.3f} "
        f"[{math.exp(last.ci[0]):.3f}, {math.exp(last.ci[1]):.3f}] | {look} | {last.n} | "
        f"**{o.verdict}** |")
  return lines


def distribution_free_lines(claims: Sequence[dict[str, Any]],
                            log_s: dict[str, list[float]], claim_outcomes: list
                            ) -> list[str]:
  """The claims' per-round log ratios (the rounds each claim's verdict read, from its
  sequential outcome) checked without the t-test's normality: their excess kurtosis,
  the sign-test interval of the median (exact coverage), and, for a claim the t-test
  left undecided, the rounds its observed mean would need."""
  from scipy import stats as scipy_stats  # pylint: disable=import-outside-toplevel
  from experiments.common.evidence.stats import median_interval, seeds_needed  # pylint: disable=import-outside-toplevel
  lines = ["", "## Without the normal assumption", "",
           "The per-round log ratios are heavy-tailed (a shared machine: a round that "
           "coincides with another process's burst is far off), which a t-interval "
           "assumes away. Beside it: the excess kurtosis (0 for a normal), the sign-test "
           "interval of the median log ratio with its exact coverage over the rounds the "
           "verdict read, which assumes only independent rounds "
           "(`experiments.common.evidence.stats.median_interval`), and the "
           "rounds a fixed-n paired t-test would need to decide the observed mean with "
           "80% power were it the true effect (`experiments.common.evidence.stats.seeds_needed`).",
           "", "| claim | rounds | excess kurtosis | median log ratio [sign-test interval] "
           "(coverage) | median ratio | rounds needed (80% power, fixed n) |",
           "|---|---|---|---|---|---|"]
  for i, (c, o) in enumerate(zip(claims, claim_outcomes), start=1):
    d = [a - b for a, b in zip(log_s[c["arm"]], log_s[c["baseline"]])][:o.last.n]
    m = median_interval(d)
    need = (seeds_needed(sum(d) / len(d), float(np.std(d, ddof=1)))
            if o.verdict.startswith("not decided") and c["kind"] in ("better", "worse")
            else "— (decided)" if not o.verdict.startswith("not decided") else "n/a")
    lines.append(f"| {i} | {len(d)} | {scipy_stats.kurtosis(d):.1f} | {fmt(m.median)} "
                 f"[{fmt(m.ci_low)}, {fmt(m.ci_high)}] ({100 * m.coverage:.1f}%) | "
                 f"{math.exp(m.median):.3f} [{math.exp(m.ci_low):.3f}, "
                 f"{math.exp(m.ci_high):.3f}] | {need if need is not None else 'n/a'} |")
  return lines


def looks_lines(record: dict[str, Any]) -> list[str]:
  """The looks table: rounds, wall time, load averages, what each look decided."""
  lines = ["", "## Looks", "", "| look | rounds | wall s | load average before → after "
           "| decided at this look |", "|---|---|---|---|---|"]
  for rec in record["looks"]:
    decided = ", ".join(f"{d['claim'] + 1} ({d['verdict']})" for d in rec["decided"])
    lines.append(f"| {rec['look']} | {rec['rounds']} | {rec['wall_s']:.1f} | "
                 f"{rec['load_average_before']} → {rec['load_average_after']} | "
                 f"{decided or '—'} |")
  return lines


def median(xs: Sequence[float]) -> float:
  xs = sorted(xs)
  return (xs[len(xs) // 2] + xs[(len(xs) - 1) // 2]) / 2


def ratio_row(per_round_s: dict[str, list[float]], method: str, baseline: str
              ) -> tuple[float, float, float, float]:
  """(median seconds, median, min, max of the per-round ratio to ``baseline``)."""
  ratios = sorted(math.exp(a - b) for a, b in zip(
      [math.log(t) for t in per_round_s[method]],
      [math.log(t) for t in per_round_s[baseline]]))
  return median(per_round_s[method]), median(ratios), ratios[0], ratios[-1]


def reproduce_lines(module: str, record: dict[str, Any]) -> list[str]:
  """The report's Reproduce section for the benchmark script ``module``."""
  minutes = sum(r["wall_s"] for r in record["looks"]) / 60
  return ["", "## Reproduce", "", f"`python -m {module}` reruns it (about {minutes:.0f} "
          f"min of rounds here); `python -m {module} --report_only` rebuilds this report "
          "from the committed JSON.", ""]


def write_report(out_dir: str, lines: list[str]) -> str:
  """Writes ``<out_dir>/REPORT.md``: ``lines``, then ``FINDINGS.md`` beside it (the
  hand-written reading survives a rebuild); returns its path."""
  findings = os.path.join(out_dir, "FINDINGS.md")
  if os.path.exists(findings):
    with open(findings) as f:
      lines = lines + ["", f.read().rstrip("\n"), ""]
  path = os.path.join(out_dir, "REPORT.md")
  with open(path, "w") as f:
    f.write("\n".join(lines))
  return path


def define_flags(out_dir: str, json_file: str) -> None:
  """A benchmark claim's flags: ``--out_dir`` (default ``out_dir``), ``--cpu``,
  ``--report_only``. Called only when it runs as a script."""
  from absl import flags  # pylint: disable=import-outside-toplevel
  flags.DEFINE_string("out_dir", out_dir, f"Where {json_file} and REPORT.md go.")
  flags.DEFINE_integer("cpu", -1, "The CPU to pin to (-1: the last one allowed).")
  flags.DEFINE_bool("report_only", False, "Rebuild REPORT.md from the JSON.")


def main_of(run: Callable[[str, int], Any], build_report: Callable[[str], str]
            ) -> Callable[[list[str]], None]:
  """The script's ``main``: unless ``--report_only``, refuse a CPU outside the allowed
  set (exit 2) or a dirty tree, then ``run(out_dir, cpu)``; always print the rebuilt
  report's path."""
  from absl import app, flags  # pylint: disable=import-outside-toplevel
  from experiments.common.harness import run_metadata  # pylint: disable=import-outside-toplevel

  def main(argv: list[str]) -> None:
    del argv
    fl = flags.FLAGS
    if not fl.report_only:
      if (error := cpu_error(fl.cpu)) is not None:
        raise app.UsageError(error, exitcode=2)
      git = run_metadata.git_state()
      if git.get("dirty"):
        raise app.UsageError(f"refusing to run: tracked files differ from commit "
                             f"{git['commit'][:12]}; commit first")
      run(fl.out_dir, fl.cpu)
    print(build_report(fl.out_dir))

  return main
