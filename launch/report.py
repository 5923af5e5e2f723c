"""Builds ``REPORT.md`` for a sweep from its results rows and TensorBoard curves.

    python -m launch.report --sweep_dir=experiments/lm/report

The report has the ablation table (mean ± sample std over seeds), paired differences
against the baseline arm with 95% t-intervals, curve plots, per-run rows, the sweep's
appendix (``experiments/<paper>/appendix.py``, declared in the sweep) and the
hand-written ``FINDINGS.md``; building it also rebuilds the sweep's arm view for
TensorBoard (``<sweep_dir>/arms``, :mod:`launch.tensorboard_views`), whose command the
"Reproduce" section gives first. It is a function of the sweep directory's files alone:
no time of day, no machine path (paths are the ones ``sweep.json`` recorded, relative
to the repository root), so rebuilding a committed report reproduces it exactly.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
import shlex
import sys
import urllib.parse
from typing import Any, Callable, Mapping

from absl import app, flags

from experiments.common.evidence.curve_plots import plot_curves
from experiments.common.evidence.stats import decide_claim, paired_difference, summarize
from experiments.common.evidence.tensorboard_reader import has_event_files, read_scalars
from experiments.common.harness.config_flags import flag_value, parse_flags
from experiments.common.harness import log_filters
from experiments.common.sweeps.sweep_data import (read_manifest, read_sweep_info,
                                                  read_sweep_results, run_dir)
from launch import registry
from launch import sequential_runner
from launch import tensorboard_views

# A hand-written reading of the results, kept in the sweep dir and appended to the report.
FINDINGS = "FINDINGS.md"


def _number(x: Any) -> float | None:
  """``x`` as a finite float, or None (missing, null, NaN, Inf, or not a number)."""
  if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
    return None
  return float(x)


def _fmt(x: Any, digits: int = 4) -> str:
  x = _number(x)
  return "n/a" if x is None else f"{x:.{digits}f}"


def _slug(tag: str) -> str:
  return tag.replace("/", "_")


def provenance(info: dict[str, Any], rows: dict[str, dict[str, Any]]) -> list[str]:
  """Markdown lines: the commit the sweep ran from, and any run that ran elsewhere."""
  git = info.get("git", {})
  commit = git.get("commit", "unknown")
  lines = [f"- git commit `{commit}`"
           + (" (**dirty**: tracked files differed from the commit)" if git.get("dirty")
              else " (clean tree)")]
  others = collections.defaultdict(list)
  for name, row in sorted(rows.items()):
    g = row.get("git", {})
    if g.get("commit", commit) != commit or g.get("dirty"):
      others[(g.get("commit", "unknown"), bool(g.get("dirty")))].append(name)
  for (c, dirty), names in sorted(others.items()):
    lines.append(f"- **{len(names)} run(s) ran from commit `{c}`"
                 + (" (dirty)" if dirty else "") + "**: " + ", ".join(f"`{n}`" for n in names))
  spanning = [f"`{name}` ({span})" for name, row in sorted(rows.items())
              if (span := _commit_span(row.get("git_segments") or []))]
  if spanning:
    lines.append(f"- **{len(spanning)} run(s) span commits** (resumed from other code than "
                 "their earlier steps ran): " + "; ".join(spanning))
  return lines


def _commit_span(segments: list[dict[str, Any]]) -> str:
  """``steps 0-: `abc`, steps 40-: `def` (dirty)`` where a run's segments ran from more
  than one (commit, dirty) state; empty where they all ran from one."""
  merged: list[dict[str, Any]] = []
  for s in segments:
    if not merged or (merged[-1].get("commit"), bool(merged[-1].get("dirty"))) != (
        s.get("commit"), bool(s.get("dirty"))):
      merged.append(s)
  if len(merged) < 2:
    return ""
  return ", ".join(f"steps {s.get('step', '?')}-: `{str(s.get('commit'))[:12]}`"
                   + (" (dirty)" if s.get("dirty") else "") for s in merged)


def _curve_count_note(arm: str, tag: str, plotted: list[str], in_table: list[str]) -> str:
  """How the runs averaged in ``arm``'s ``tag`` curve differ from its runs in the table
  (empty when they are the same runs)."""
  lacking = sorted(set(in_table) - set(plotted))
  unlisted = sorted(set(plotted) - set(in_table))
  if not lacking and not unlisted:
    return ""
  parts = ([f"no `{tag}` events in " + ", ".join(f"`{n}`" for n in lacking)]
           if lacking else [])
  parts += (["no results row for " + ", ".join(f"`{n}`" for n in unlisted)]
            if unlisted else [])
  return (f"`{arm}` is the mean of {len(plotted)} run(s), not the table's "
          f"{len(in_table)} (" + "; ".join(parts) + ")")


def drawn_curves(info: dict[str, Any], scalars_by_run: Mapping[str, Mapping[str, Any]]
                 ) -> list[str]:
  """The sweep's declared curves that some run logged at two or more steps: a tag
  logged once (a final evaluation) draws no line in Time Series, and a card pinned
  for it opens empty."""
  return [t for t in info.get("curves", [])
          if any(len({step for step, _ in scalars[t]}) > 1
                 for scalars in scalars_by_run.values() if t in scalars)]


def tensorboard_lines(info: dict[str, Any], recorded_dir: str, arms: int, runs: int,
                      curves: list[str] | None = None) -> list[str]:
  """Markdown lines: the TensorBoard commands of the arm view, then of the per-seed runs
  (:mod:`launch.tensorboard_views`). ``curves``: the tags pinned on top of Time Series
  (default: the sweep's declared curves; :func:`drawn_curves` keeps those that draw)."""
  curves = info.get("curves", []) if curves is None else curves
  pinned = urllib.parse.quote(json.dumps([{"plugin": "scalars", "tag": t} for t in curves],
                                         separators=(",", ":")), safe="")
  link = (f" and open <http://127.0.0.1:6006/?pinnedCards={pinned}#timeseries> "
          "(Time Series with the curves pinned on top)" if curves else "")
  return [f"- **Arm view**: `tensorboard --logdir {recorded_dir}/{tensorboard_views.ARMS_DIR}"
          f" --host 127.0.0.1`{link}: one run per arm that ran ({arms}), each tag the "
          f"mean over the arm's seeds, `<tag>{tensorboard_views.LOWER}` and "
          f"`<tag>{tensorboard_views.UPPER}` its 95% t-interval (the Custom Scalars "
          "dashboard draws them as a band); the HParams table has a row per arm.",
          f"- **Per-seed runs**: `tensorboard --logdir {recorded_dir}/runs --host 127.0.0.1`"
          f": every run ({runs}), the HParams table a row per run with a filter on every "
          "seed and swept field.", ""]


def claim_verdict(claim: dict[str, Any], arm: dict[int, float], baseline: dict[int, float],
                  higher_is_better: bool) -> tuple[str, str]:
  """(statistics cell, verdict) of one declared claim (see
  :class:`experiments.common.sweeps.sweep_spec.Claim`); ``arm``/``baseline`` map seed -> value.
  The verdict is :func:`experiments.common.evidence.stats.decide_claim`'s."""
  c = decide_claim(claim["kind"], claim.get("margin") or 0.0, arm, baseline,
                   higher_is_better)
  d, e = c.difference, c.equivalence
  stats_cell = (f"{_fmt(d.mean)} [{_fmt(d.ci_low)}, {_fmt(d.ci_high)}], n = {d.n}, "
                f"arm better on {c.better}/{d.n}")
  if d.n >= 2 and claim["kind"] == "equivalent":
    stats_cell += (f"; TOST margin ±{claim['margin']:g}: 90% CI [{_fmt(e.ci_low)}, "
                   f"{_fmt(e.ci_high)}], p = {_fmt(e.p, 4)}")
  elif d.n >= 2 and claim["kind"] == "not_better":
    stats_cell += (f"; non-superiority margin {claim['margin']:g}: one-sided 95% bound "
                   f"on the gain {_fmt(c.gain_bound)}")
  return stats_cell, c.verdict


def claims_table(info: dict[str, Any], values_of) -> list[str]:
  """Markdown lines: the sweep's declared claims with their statistics and verdicts.

  ``values_of(arm, metric) -> {seed: value}`` over the evaluation runs."""
  claims = info.get("claims", [])
  if not claims:
    return []
  higher = set(info.get("higher_is_better", []))
  # The not_better rule is stated only where a sweep declares one (the other committed
  # reports rebuild byte for byte).
  not_better = (", *not_better* claims by the one-sided non-superiority test at level "
                "0.05 with the stated margin"
                if any(c["kind"] == "not_better" for c in claims) else "")
  lines = ["## Claims", "",
           "Declared in the sweep before the runs. Paired by seed: `arm − baseline`, mean "
           "and 95% t-interval; *better*/*worse* claims are held when the interval "
           "excludes 0 on the claimed side, *equivalent* claims by a paired TOST at "
           f"level 0.05 with the stated margin{not_better}. With few seeds, *not decided* "
           "means the sweep lacked the power, not that the claim failed. *Arm better on "
           "k/n*: the seeds where the arm beats the baseline in the metric's direction "
           "(lower is better for a loss or a cost).", "",
           "| claim | comparison | paired difference | verdict |", "|---|---|---|---|"]
  for c in claims:
    cell, verdict = claim_verdict(c, values_of(c["arm"], c["metric"]),
                                  values_of(c["baseline"], c["metric"]),
                                  c["metric"] in higher)
    source = f" ({c['source']})" if c.get("source") else ""
    lines.append(f"| {c['text']}{source} | `{c['arm']}` {c['kind']} than/as "
                 f"`{c['baseline']}` on `{c['metric']}` | {cell} | **{verdict}** |")
  return lines + [""]


class UntrustedAppendix(ValueError):
  """A ``sweep.json`` names report code its registered declaration does not."""


def registered_appendix(info: dict[str, Any]) -> Callable[[str], str] | None:
  """The appendix function of the sweep ``info`` (``sweep.json``) records, taken from
  the sweep's registered declaration (:mod:`launch.registry`: code in the repository),
  never from the data: a sweep directory is data, and rebuilding a report someone sent
  must not run code it names. None when the sweep declares no appendix.

  Raises :class:`UntrustedAppendix` when ``sweep.json`` names an appendix and the sweep
  is not registered, or names another appendix than its declaration does."""
  recorded = info.get("appendix")
  if not recorded:
    return None
  name = info.get("name")
  if name not in registry.names():
    raise UntrustedAppendix(
        f"sweep.json names the appendix {recorded!r}, but {name!r} is not a registered "
        "sweep (launch.registry); an appendix runs only from a registered declaration, "
        "never from a sweep directory's data. Remove \"appendix\" to build the rest.")
  declared = registry.get(name).appendix
  if recorded != declared:
    raise UntrustedAppendix(
        f"sweep.json names the appendix {recorded!r}, but the registered sweep {name!r} "
        f"declares {declared!r}; refusing to run code a sweep directory names.")
  return registry.appendix_function(declared) if declared else None


@dataclasses.dataclass
class SweepData:
  """What a report reads from a sweep directory, and the per-arm values it computes
  from the results rows (evaluation seeds only; calibration runs are listed, never
  counted)."""

  sweep_dir: str
  info: dict[str, Any]
  manifest: list[dict[str, Any]]
  results: Any  # sweep_data.SweepResults
  calibration: set[str]
  # arm -> metric -> seed -> value; arm -> completed runs; (arm, metric) -> runs lacking it
  values: dict[str, dict[str, dict[int, float]]]
  completed: dict[str, list[str]]
  lacking: dict[tuple[str, str], list[str]]

  @property
  def rows(self) -> dict[str, dict[str, Any]]:
    return self.results.rows

  @property
  def arms(self) -> list[str]:
    return [a["name"] for a in self.info["arms"]]

  @property
  def recorded_dir(self) -> str:
    return self.info.get("sweep_dir", "<sweep_dir>")

  def values_of(self, arm: str, metric: str) -> dict[int, float]:
    """``seed -> value`` of ``metric`` over ``arm``'s completed evaluation runs (any
    metric, declared or not: claims may name one the tables do not show)."""
    by_name = {m["run_name"]: m for m in self.manifest}
    out = {}
    for name, row in self.rows.items():
      m = by_name[name]
      if name in self.calibration or m["arm"] != arm:
        continue
      v = _number((row.get("metrics") or {}).get(metric))
      if v is not None:
        out[m["seed"]] = v
    return out


def read_sweep(sweep_dir: str) -> SweepData:
  """Reads ``sweep.json``, the manifest and the results rows of ``sweep_dir`` and
  tabulates each arm's declared metrics by seed."""
  info = read_sweep_info(sweep_dir)
  manifest = read_manifest(sweep_dir)
  by_name = {m["run_name"]: m for m in manifest}
  results = read_sweep_results(sweep_dir)
  calibration = {m["run_name"] for m in manifest if m.get("calibration")}
  arms = [a["name"] for a in info["arms"]]
  values: dict[str, dict[str, dict[int, float]]] = {a: collections.defaultdict(dict)
                                                    for a in arms}
  completed: dict[str, list[str]] = {a: [] for a in arms}
  lacking: dict[tuple[str, str], list[str]] = collections.defaultdict(list)
  for name, row in results.rows.items():
    if name in calibration:
      continue
    m = by_name[name]
    completed[m["arm"]].append(name)
    row_metrics = row.get("metrics") if isinstance(row.get("metrics"), dict) else {}
    for metric in info["metrics"]:
      v = _number(row_metrics.get(metric))
      if v is None:
        lacking[(m["arm"], metric)].append(name)
      else:
        values[m["arm"]][metric][m["seed"]] = v
  return SweepData(sweep_dir, info, manifest, results, calibration, values, completed,
                   lacking)


def _override_flags(info: dict[str, Any]) -> str:
  overrides = info.get("overrides") or {}
  return "".join(" " + shlex.quote(f"--override={k}={flag_value(v)}")
                 for k, v in sorted(overrides.items()))


def _header_lines(d: SweepData) -> list[str]:
  """The title, the description, provenance and what is missing or damaged."""
  info, rows, manifest = d.info, d.rows, d.manifest
  lines = [f"# Sweep `{info['name']}`", ""]
  if info.get("description"):
    lines += [info["description"], ""]
  cal_seeds = info.get("calibration_seeds", [])
  lines += [
      f"- experiment: `python -m {info['module']}`; arms: "
      f"{', '.join(f'`{a}`' for a in d.arms)} (baseline `{info['baseline']}`); "
      f"evaluation seeds: {info['seeds']}"
      + (f"; calibration seeds (never evaluated): {cal_seeds}" if cal_seeds else ""),
      f"- runs completed: {len(rows)} of {len(manifest)}", *provenance(info, rows),
      f"- sweep directory: `{d.recorded_dir}`"]
  overrides = info.get("overrides") or {}
  if overrides:
    lines.append("- overrides applied to every run over the declared sweep (`--override`): "
                 + ", ".join(f"`{k}={flag_value(v)}`" for k, v in sorted(overrides.items())))
  lines.append("")
  missing = [m["run_name"] for m in manifest if m["run_name"] not in rows]
  if missing:
    lines += ["**Missing runs** (no results row; see their `launch.log`): "
              + ", ".join(f"`{n}`" for n in missing), ""]
  if d.results.problems:
    lines += ["**Damaged results lines, skipped:** "
              + "; ".join(f"`{p}`" for p in d.results.problems), ""]
  if d.results.duplicates:
    lines += ["**Runs with more than one results row** (rows are keyed by run name; the "
              "newest complete row is used): " + ", ".join(
                  f"`{n}` ({k} rows)" for n, k in sorted(d.results.duplicates.items())), ""]
  if d.calibration:
    lines += ["Runs on calibration seeds (listed below, left out of every statistic): "
              + ", ".join(f"`{n}`" for n in sorted(d.calibration)), ""]
  for a in info["arms"]:
    lines.append(f"- arm `{a['name']}` overrides: `{a['overrides']}`")
  return lines + [""]


def _ablation_lines(d: SweepData) -> list[str]:
  """Mean ± std per arm and metric, with the runs that lack a metric named."""
  metrics, higher = d.info["metrics"], set(d.info.get("higher_is_better", []))
  lines = ["## Ablation table", "",
           "Mean ± sample std over seeds (n = completed runs; a cell is given only when "
           "every one of them has the metric). "
           + ", ".join(f"`{m}` {'higher' if m in higher else 'lower'} is better"
                       for m in metrics) + ".", ""]
  lines.append("| arm | n | " + " | ".join(f"`{m}`" for m in metrics) + " |")
  lines.append("|---|---|" + "---|" * len(metrics))
  notes = []
  for a in d.arms:
    cells = []
    for metric in metrics:
      if d.lacking.get((a, metric)):
        cells.append(f"n/a ({len(d.lacking[(a, metric)])} of {len(d.completed[a])} runs "
                     "lack it)")
        notes.append(f"`{a}` / `{metric}`: missing in "
                     + ", ".join(f"`{n}`" for n in sorted(d.lacking[(a, metric)])))
        continue
      s = summarize(list(d.values[a][metric].values()))
      cells.append(f"{_fmt(s.mean)} ± {_fmt(s.std)}" if s.n else "n/a")
    lines.append(f"| `{a}`{' (baseline)' if a == d.info['baseline'] else ''} | "
                 f"{len(d.completed[a])} | " + " | ".join(cells) + " |")
  lines.append("")
  if notes:
    lines += ["Runs that lack a metric: " + "; ".join(notes) + ".", ""]
  return lines


def _paired_lines(d: SweepData, confidence: float) -> list[str]:
  """Each arm's paired difference to the baseline, per metric."""
  baseline, pct = d.info["baseline"], int(round(confidence * 100))
  lines = [f"## Paired differences against `{baseline}`", "",
           f"Per seed `arm − {baseline}`, then mean and a {pct}% t-interval "
           "(mean ± t·sd/√n, n − 1 degrees of freedom). An interval that excludes 0 is "
           "marked *.", ""]
  lines.append("| arm | metric | mean diff | " + f"{pct}% CI | n pairs |")
  lines.append("|---|---|---|---|---|")
  for a in d.arms:
    if a == baseline:
      continue
    for metric in d.info["metrics"]:
      p = paired_difference(d.values[a][metric], d.values[baseline][metric], confidence)
      star = "*" if p.excludes_zero else ""
      lines.append(f"| `{a}` | `{metric}` | {_fmt(p.mean)}{star} | "
                   f"[{_fmt(p.ci_low)}, {_fmt(p.ci_high)}] | {p.n} |")
  return lines + [""]


def _read_curves(d: SweepData) -> tuple[dict[str, dict[str, list]],
                                       dict[str, dict[str, list[str]]],
                                       dict[str, dict[str, list]], list[str], list[Any]]:
  """(tag -> arm -> curves, tag -> arm -> their runs, run -> every scalar (the arm view
  reuses them), completed runs without events, damaged event files)."""
  curves_by_tag: dict[str, dict[str, list]] = {t: collections.defaultdict(list)
                                              for t in d.info.get("curves", [])}
  curve_runs: dict[str, dict[str, list[str]]] = {t: collections.defaultdict(list)
                                                for t in curves_by_tag}
  without_events, damaged = [], []
  scalars_by_run: dict[str, dict[str, list]] = {}
  for m in d.manifest:
    directory = run_dir(d.sweep_dir, m["run_name"])
    if m["run_name"] in d.calibration:
      continue
    if not has_event_files(directory):
      if m["run_name"] in d.rows:  # a run without a row is named under Missing runs
        without_events.append(m["run_name"])
      continue
    scalars = read_scalars(directory, damaged)
    scalars_by_run[m["run_name"]] = scalars
    for tag in curves_by_tag:
      if tag in scalars:
        curves_by_tag[tag][m["arm"]].append(scalars[tag])
        curve_runs[tag][m["arm"]].append(m["run_name"])
  return curves_by_tag, curve_runs, scalars_by_run, without_events, damaged


def _curve_lines(d: SweepData) -> tuple[list[str], dict[str, dict[str, list]]]:
  """The Curves section (plots written under ``plots/``) and every run's scalars."""
  curves_by_tag, curve_runs, scalars_by_run, without_events, damaged = _read_curves(d)
  lines = ["## Curves", ""]
  if without_events:
    lines += ["**Completed runs without events** (no event file in their run directory, "
              "so no curves): " + ", ".join(f"`{n}`" for n in without_events), ""]
  if damaged:
    lines += ["**Damaged event files** (the bytes named hold no readable record and are "
              "skipped; every record after them is read): " + "; ".join(
                  f"`{x._replace(path=os.path.relpath(x.path, d.sweep_dir))}`"
                  for x in damaged), ""]
  for tag, curves in curves_by_tag.items():
    if not curves:
      lines += [f"(no `{tag}` events found)", ""]
      continue
    ordered = {a: curves[a] for a in d.arms if a in curves}
    rel = os.path.join("plots", f"{_slug(tag)}.png")
    plot_curves(tag, ordered, os.path.join(d.sweep_dir, rel), baseline=d.info["baseline"])
    lines += [f"![{tag}]({rel})", ""]
    short = [_curve_count_note(a, tag, curve_runs[tag][a], d.completed[a])
             for a in ordered]
    if any(short):
      lines += [f"`{tag}` curves not over the table's runs: "
                + "; ".join(n for n in short if n) + ".", ""]
  return lines, scalars_by_run


def _runs_lines(d: SweepData) -> list[str]:
  """One row per run of the manifest: its metrics, speed and wall time."""
  metrics = d.info["metrics"]
  lines = ["## Runs", "", "| run | arm | seed | " + " | ".join(f"`{m}`" for m in metrics)
           + " | steps/s | wall s |", "|---|---|---|" + "---|" * (len(metrics) + 2)]
  for m in d.manifest:
    row = d.rows.get(m["run_name"])
    seed = f"{m['seed']} (calibration)" if m["run_name"] in d.calibration else m["seed"]
    if row is None:
      lines.append(f"| `{m['run_name']}` | `{m['arm']}` | {seed} | "
                   + " | ".join("missing" for _ in metrics) + " | | |")
      continue
    row_metrics = row.get("metrics") if isinstance(row.get("metrics"), dict) else {}
    vals = [_fmt(row_metrics.get(metric)) for metric in metrics]
    lines.append(f"| `{m['run_name']}` | `{m['arm']}` | {seed} | " + " | ".join(vals)
                 + f" | {_fmt(row.get('steps_per_s'), 2)} | {_fmt(row.get('wall_s'), 1)} |")
  return lines


def _reproduce_lines(d: SweepData, arm_runs: int, curves: list[str]) -> list[str]:
  """How to view (the arm view first, ``curves`` pinned), rerun and rebuild the sweep."""
  info, recorded_dir = d.info, d.recorded_dir
  return ["", "## Reproduce", "",
          *tensorboard_lines(info, recorded_dir, arm_runs, len(d.manifest), curves),
          f"`python -m launch.sweep --sweep={info['name']} --sweep_dir={recorded_dir}"
          f"{_override_flags(info)}` "
          f"reruns it (every run's full command is in `{recorded_dir}/manifest.jsonl`); "
          f"`python -m launch.report --sweep_dir={recorded_dir}` rebuilds this report "
          "and the arm view from the committed data.", ""]


def build_report(sweep_dir: str, confidence: float = 0.95) -> str:
  """Writes ``<sweep_dir>/REPORT.md``, ``<sweep_dir>/plots/*.png`` and the arm view
  (:mod:`launch.tensorboard_views`); returns the report path.

  Read (:func:`read_sweep`), then each section rendered from what was read. The
  sweep's appendix (if declared) follows the generated sections, then the contents of
  ``<sweep_dir>/FINDINGS.md`` (if present), so a rebuild keeps the hand-written reading.
  Runs on calibration seeds are listed but kept out of every statistic. A metric is
  averaged only over all of an arm's completed runs: if some lack it, its cell says
  so and the runs are named. Damaged results lines are skipped and listed.
  """
  d = read_sweep(sweep_dir)
  lines = _header_lines(d)
  if d.info.get("sequential"):  # repeated intervals, looks and seeds used
    lines += sequential_runner.claims_table(sweep_dir, d.info, d.values_of)
  else:
    lines += claims_table(d.info, d.values_of)
  lines += _ablation_lines(d) + _paired_lines(d, confidence)
  curve_lines, scalars_by_run = _curve_lines(d)
  lines += curve_lines + _runs_lines(d)
  view = tensorboard_views.write_arm_view(sweep_dir, scalars_by_run)  # rebuilt with it
  lines += _reproduce_lines(d, len(os.listdir(view)), drawn_curves(d.info, scalars_by_run))
  appendix = registered_appendix(d.info)
  if appendix is not None:
    lines += [appendix(sweep_dir)]
  findings = os.path.join(sweep_dir, FINDINGS)
  if os.path.exists(findings):  # hand-written reading of the results survives rebuilds
    with open(findings) as f:
      lines += ["", f.read().rstrip("\n"), ""]
  path = os.path.join(sweep_dir, "REPORT.md")
  with open(path, "w") as f:
    f.write("\n".join(lines))
  return path


def define_flags() -> None:
  """Defines this script's flags (only when run as a script)."""
  flags.DEFINE_string("sweep_dir", None, "The sweep's output directory.")
  flags.DEFINE_float("confidence", 0.95, "Confidence level of the intervals.")


def main(argv: list[str]) -> int:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  log_filters.quiet_library_info()  # TensorBoard's reader: a line per run directory
  try:
    print(build_report(flags.FLAGS.sweep_dir, flags.FLAGS.confidence))
  except UntrustedAppendix as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  define_flags()
  flags.mark_flag_as_required("sweep_dir")
  app.run(lambda argv: sys.exit(main(argv)), flags_parser=parse_flags)
