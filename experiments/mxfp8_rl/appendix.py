"""The mxfp8_rl sweeps' report appendices.

``mxfp8_rl``: mismatch and reward by recipe pair, and what the recorded sync checks saw
on these clean runs. ``mxfp8_rl_faults``: the planted-fault table (fault | check that
fired | update | statistic vs gate), each gated statistic's distribution on the clean
runs, and the gates chosen from it by the rule stated in
:mod:`experiments.mxfp8_rl.sweeps` (:func:`gate`), with their false-alarm and
detection rates and the library defaults they should replace.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from experiments.common.trainers.rl.report import completed_runs, spread
from experiments.common.sweeps.sweep_data import config_value
from experiments.mxfp8_rl.experiment import sync_update
from experiments.mxfp8_rl.sweeps import INTENDED_CHECK, SAFETY
from experiments.mxfp8_rl import parity_tolerances
from experiments.mxfp8_rl.weight_sync import CHECKS

# Gated statistics: (sync/stat tag suffix, label, the config field or table it gates).
GATED = (("parity_k3", "probe k3", "k3"),
         ("parity_max_abs_delta_logp", "probe max |Δlogp|", "max_abs_delta_logp"),
         ("padding_max_abs_diff", "padding: max logit change", "padding_atol"))
# The statistic reported for a check gated at exactly 0 when it fires.
EXACT_STATISTIC = {"bitwise": "bitwise_differing", "version": "version_offset"}


# ----------------------------------------------------------------- the gate rule


def round_up(x: float) -> float:
  """``x`` rounded up to one significant digit (``x > 0``; the ratio to the power of
  ten is first rounded to 6 digits, so float32 noise in logged values (``2 *
  float32(0.002)``) does not round 0.004 up to 0.005)."""
  exponent = math.floor(math.log10(x))
  mantissa = math.ceil(round(x / 10.0 ** exponent, 6))
  if mantissa == 10:
    mantissa, exponent = 1, exponent + 1
  return float(f"{mantissa}e{exponent}")


def gate(clean: Sequence[float], exact: float = 0.0, safety: float = SAFETY) -> float:
  """The rule stated before the runs: ``safety`` x the largest clean value, rounded up
  to one significant digit; ``exact`` (the exact gate in use) where every clean value
  is 0; NaN without clean values."""
  values = [v for v in clean if not math.isnan(v)]
  if not values:
    return float("nan")
  worst = max(values)
  return exact if worst <= 0 else round_up(safety * worst)


def false_alarms(clean_by_seed: Mapping[int, Sequence[float]], exact: float = 0.0
                 ) -> tuple[int, int]:
  """Leave one seed out: (clean syncs above the gate chosen from the other seeds'
  clean syncs, clean syncs), over every seed (needs two seeds or more)."""
  alarms = total = 0
  for seed, values in clean_by_seed.items():
    others = [v for s, vs in clean_by_seed.items() if s != seed for v in vs]
    if not others:
      continue
    g = gate(others, exact)
    alarms += sum(v > g for v in values)
    total += len(values)
  return alarms, total


def detections(planted: Mapping[Any, Sequence[tuple[int, float]]], threshold: float
               ) -> tuple[int, int, list[int]]:
  """(planted runs whose statistic exceeds ``threshold`` at some sync, planted runs,
  the first such update of each detected run); ``planted`` maps a run to its
  ``[(update, value)]`` from the fault's sync on."""
  first = []
  for curve in planted.values():
    over = [u for u, v in curve if v > threshold]
    if over:
      first.append(over[0])
  return len(first), len(planted), first


# ----------------------------------------------------------------- reading the runs


def _recipes(info, arm: str) -> tuple[str, str]:
  return (str(config_value(info, arm, "learner_recipe")),
          str(config_value(info, arm, "sampler_recipe")))


def _stat(curves: Mapping[str, list], name: str) -> list[tuple[int, float]]:
  """``[(update, value)]`` of ``sync/stat/<name>`` (updates, not logged steps)."""
  return [(sync_update(step), v) for step, v in curves.get(f"sync/stat/{name}", [])]


def _fired(curves: Mapping[str, list], check: str) -> list[int]:
  return [sync_update(step) for step, v in curves.get(f"sync/fired/{check}", []) if v > 0]


def _current_gates(info) -> dict[tuple[str, str], float]:
  """(statistic, class) -> the gate the runs used: the same-recipe parity table entry,
  the config's cross-recipe tolerances, its padding_atol."""
  base = info["base"]
  exact = parity_tolerances.PARITY_TOLERANCES[("mxfp8", "mxfp8")]
  return {("parity_k3", "same"): exact.k3,
          ("parity_max_abs_delta_logp", "same"): exact.max_abs_delta_logp,
          ("parity_k3", "cross"): float(base["cross_k3_tolerance"]),
          ("parity_max_abs_delta_logp", "cross"): float(base["cross_max_dlogp_tolerance"]),
          ("padding_max_abs_diff", "all"): float(base["padding_atol"])}


def _classes(stat: str) -> tuple[str, ...]:
  return ("all",) if stat.startswith("padding") else ("same", "cross")


def _in_class(cls: str, learner: str, sampler: str) -> bool:
  return cls == "all" or (cls == "same") == (learner == sampler)


def _fmt(x: float) -> str:
  return "n/a" if x is None or math.isnan(x) else f"{x:.3g}"


# ----------------------------------------------------------------- mxfp8_rl_faults


def calibration(sweep_dir: str) -> dict[str, Any]:
  """Per (gated statistic, class): the clean values by seed, the planted runs'
  ``[(update, value)]`` from the fault on (by (arm, seed)), and the gates (current
  and calibrated by :func:`gate`)."""
  info, runs = completed_runs(sweep_dir)
  fault_update = int(info["base"]["fault_update"])
  current = _current_gates(info)
  out = {}
  for stat, _, _ in GATED:
    for cls in _classes(stat):
      clean: dict[int, list[float]] = {}
      planted: dict[tuple[str, int], list[tuple[int, float]]] = {}
      for arm, seeds in runs.items():
        learner, sampler = _recipes(info, arm)
        if not _in_class(cls, learner, sampler):
          continue
        fault = str(config_value(info, arm, "planted_fault"))
        for seed, curves in seeds.items():
          values = _stat(curves, stat)
          if fault == "none":
            clean.setdefault(seed, []).extend(v for _, v in values)
          else:
            planted[(arm, seed)] = [(u, v) for u, v in values if u >= fault_update]
      exact = current[(stat, cls)] if stat.startswith("parity") and cls == "same" else 0.0
      every = [v for vs in clean.values() for v in vs]
      out[(stat, cls)] = {"clean": clean, "planted": planted, "exact": exact,
                          "current": current[(stat, cls)], "calibrated": gate(every, exact)}
  return out


def gate_table(sweep_dir: str) -> str:
  """Markdown: each gated statistic's clean distribution, the calibrated gate, its
  false-alarm rate (leave one seed out) and detection rate, against the current gate."""
  cal = calibration(sweep_dir)
  lines = ["", "## Clean distributions and calibrated gates", "",
           "Per gated statistic and class of pair (*same*: learner and sampler in one "
           "recipe; *cross*: different recipes; the padding check has one gate), over "
           "every sync of every clean run: the median, 99th percentile and largest "
           "value. *Calibrated gate*: the rule stated before the runs "
           f"({SAFETY:g} x the largest clean value, rounded up to one significant digit; "
           "the exact gate where every clean value is 0). *False alarms*: clean syncs "
           "above the gate chosen from the other seeds' clean runs (leave one seed "
           "out) / clean syncs; at the current gate, clean syncs above it. "
           "*Detected*: planted runs (fault x seed, this class) whose statistic "
           "crosses the gate at or after the fault / planted runs.", "",
           "| statistic | class | clean syncs | median | p99 | max | current gate | "
           "calibrated gate | false alarms (calibrated, LOSO) | false alarms (current) "
           "| detected (calibrated) | detected (current) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for (stat, cls), c in cal.items():
    every = [v for vs in c["clean"].values() for v in vs]
    if not every:
      lines.append(f"| `{stat}` | {cls} | 0 | | | | {_fmt(c['current'])} | | | | | |")
      continue
    fa, n = false_alarms(c["clean"], c["exact"])
    cur = sum(v > c["current"] for v in every)
    d_cal, n_p, _ = detections(c["planted"], c["calibrated"])
    d_cur, _, _ = detections(c["planted"], c["current"])
    lines.append(
        f"| `{stat}` | {cls} | {len(every)} | {_fmt(float(np.median(every)))} | "
        f"{_fmt(float(np.percentile(every, 99)))} | {_fmt(max(every))} | "
        f"{_fmt(c['current'])} | {_fmt(c['calibrated'])} | {fa}/{n} | "
        f"{cur}/{len(every)} | {d_cal}/{n_p} | {d_cur}/{n_p} |")
  info, runs = completed_runs(sweep_dir)
  fault_update = int(info["base"]["fault_update"])
  clean_syncs, clean_fired, planted_runs, planted_caught = 0, {}, 0, {}
  for arm, seeds in runs.items():
    clean = config_value(info, arm, "planted_fault") == "none"
    for curves in seeds.values():
      if clean:
        clean_syncs += len(curves.get("sync/fired/coverage", []))
      else:
        planted_runs += 1
      for check in CHECKS:
        fired = [u for u in _fired(curves, check) if clean or u >= fault_update]
        if clean:
          clean_fired[check] = clean_fired.get(check, 0) + len(fired)
        elif fired:
          planted_caught[check] = planted_caught.get(check, 0) + 1
  lines += ["", "Every check under the gates the runs used: syncs of the clean runs at "
            "which it fired (false alarms) / clean syncs, and planted runs (fault x "
            "pair x seed) in which it fired at or after the fault / planted runs.", "",
            "| check | false alarms (clean syncs) | planted runs it fired in |",
            "|---|---|---|"]
  lines += [f"| {c} | {clean_fired.get(c, 0)}/{clean_syncs} | "
            f"{planted_caught.get(c, 0)}/{planted_runs} |" for c in CHECKS]
  return "\n".join(lines) + "\n"


def fault_table(sweep_dir: str) -> str:
  """Markdown: the planted-fault table (fault | pair | check that fired | update |
  statistic vs gate), per fault arm over its seeds."""
  info, runs = completed_runs(sweep_dir)
  fault_update = int(info["base"]["fault_update"])
  cal = calibration(sweep_dir)
  lines = ["", "## Planted faults: which check fired, when, by how much", "",
           f"Each fault is planted at update {fault_update} through the export; every "
           "check records at every sync (under the gates the runs used: the library's "
           "current ones). *First check*: the first check, in the order the checks run, "
           "to fire at the first sync any fired (seeds where it did / seeds); *update*: "
           "that sync's update per seed ('-' where no check fired); *also fired*: the "
           "other checks that fired after the fault (seeds). *Statistic vs gate*: for a "
           "check gated at 0, its count at that sync (largest over seeds); and for the "
           "probe parity, its largest value from the fault on against the current and "
           "the calibrated gate of its class (seeds above the calibrated gate).", "",
           "| fault | pair | intended check | first check | update | also fired | "
           "statistic vs gate | probe k3 after the fault vs gates |",
           "|---|---|---|---|---|---|---|---|"]
  for arm in [a["name"] for a in info["arms"]]:
    fault = str(config_value(info, arm, "planted_fault"))
    if fault == "none":
      continue
    learner, sampler = _recipes(info, arm)
    pair = f"L-{learner}_S-{sampler}"
    seeds = runs.get(arm, {})
    if not seeds:
      lines.append(f"| {fault} | {pair} | {INTENDED_CHECK.get(fault) or '—'} | | | | | |")
      continue
    firsts, updates, also, counts = {}, [], {}, []
    for seed in sorted(seeds):
      curves = seeds[seed]
      fired = {c: [u for u in _fired(curves, c) if u >= fault_update] for c in CHECKS}
      earliest = min((us[0] for us in fired.values() if us), default=None)
      updates.append("-" if earliest is None else str(earliest))
      if earliest is None:
        continue
      first = next(c for c in CHECKS if fired[c] and fired[c][0] == earliest)
      firsts[first] = firsts.get(first, 0) + 1
      for c in CHECKS:
        if fired[c] and c != first:
          also[c] = also.get(c, 0) + 1
      if first in EXACT_STATISTIC:
        counts.append(dict(_stat(curves, EXACT_STATISTIC[first])).get(earliest, math.nan))
    n = len(seeds)
    first_cell = ", ".join(f"{c} ({k}/{n})" for c, k in firsts.items()) or "none"
    also_cell = ", ".join(f"{c} ({k}/{n})" for c, k in also.items()) or "—"
    if counts:
      name = EXACT_STATISTIC[max(firsts, key=firsts.get)]
      stat_cell = f"{name} {max(counts):.0f} vs 0"
    elif firsts:
      stat_cell = f"{max(firsts, key=firsts.get)}: exact (0)"
    else:
      stat_cell = "—"
    cls = "same" if learner == sampler else "cross"
    c = cal[("parity_k3", cls)]
    peaks = [max((v for _, v in c["planted"].get((arm, s), [])), default=math.nan)
             for s in sorted(seeds)]
    above = sum(p > c["calibrated"] for p in peaks)
    parity_cell = (f"max {_fmt(float(np.nanmax(peaks)))} vs current "
                   f"{_fmt(c['current'])} / calibrated {_fmt(c['calibrated'])} "
                   f"({above}/{n})")
    lines.append(f"| {fault} | {pair} | {INTENDED_CHECK.get(fault) or '— (see note)'} | "
                 f"{first_cell} | {', '.join(updates)} | {also_cell} | {stat_cell} | "
                 f"{parity_cell} |")
  if any(config_value(info, a["name"], "planted_fault") == "transposed_block_axis"
         for a in info["arms"]):
    lines += ["", "*Note*: a transposed MX block axis serves the same E4M3 bits except "
              "for elements below 2^-15 of their block's amax; where no check fired, the "
              "bitwise statistic says how many elements differed."]
  return "\n".join(lines) + "\n"


def _library_gates():
  """The library's gates when the report is built: (``MXFP8RLConfig()``, the MXFP8
  same-recipe and the bf16 x MXFP8 cross-recipe entries of ``PARITY_TOLERANCES``)."""
  # Imported here: the experiment module pulls in the model stack, which the rest of
  # the appendix does not need.
  from experiments.mxfp8_rl.experiment import MXFP8RLConfig  # pylint: disable=import-outside-toplevel
  table = parity_tolerances.PARITY_TOLERANCES
  return MXFP8RLConfig(), table[("mxfp8", "mxfp8")], table[("bf16", "mxfp8")]


def calibrated_defaults(sweep_dir: str) -> str:
  """Markdown: per library default, the value these runs used, the one the gate rule
  gives from their clean runs, and the library's value when the report was built."""
  cal = calibration(sweep_dir)
  get = lambda stat, cls: cal[(stat, cls)]
  config, same, cross = _library_gates()
  rows = [("`MXFP8RLConfig.cross_k3_tolerance`", get("parity_k3", "cross"),
           config.cross_k3_tolerance),
          ("`MXFP8RLConfig.cross_max_dlogp_tolerance`",
           get("parity_max_abs_delta_logp", "cross"), config.cross_max_dlogp_tolerance),
          ("`MXFP8RLConfig.padding_atol`", get("padding_max_abs_diff", "all"),
           config.padding_atol),
          ("`PARITY_TOLERANCES` MXFP8 cross-recipe `k3`", get("parity_k3", "cross"),
           cross.k3),
          ("`PARITY_TOLERANCES` MXFP8 cross-recipe `max_abs_delta_logp`",
           get("parity_max_abs_delta_logp", "cross"), cross.max_abs_delta_logp),
          ("`PARITY_TOLERANCES` same-recipe `k3`", get("parity_k3", "same"), same.k3),
          ("`PARITY_TOLERANCES` same-recipe `max_abs_delta_logp`",
           get("parity_max_abs_delta_logp", "same"), same.max_abs_delta_logp)]
  lines = ["", "## Calibrated defaults", "",
           "*these runs*: the gate the runs were checked against (for the "
           "`PARITY_TOLERANCES` rows, the cross-recipe gate the config passed in). "
           "*calibrated*: the value the gate rule gives from these clean runs. *library "
           "now*: the default in `experiments.mxfp8_rl.experiment.MXFP8RLConfig` and "
           "`experiments.mxfp8_rl.parity_tolerances.PARITY_TOLERANCES` when this report was built.",
           "", "| default | these runs | calibrated | library now |", "|---|---|---|---|"]
  lines += [f"| {name} | {_fmt(c['current'])} | {_fmt(c['calibrated'])} | {_fmt(now)} |"
            for name, c, now in rows]
  return "\n".join(lines) + "\n"


def mxfp8_rl_faults_appendix(sweep_dir: str) -> str:
  """The faults sweep's appendix: :func:`fault_table`, :func:`gate_table` and
  :func:`calibrated_defaults`."""
  return fault_table(sweep_dir) + gate_table(sweep_dir) + calibrated_defaults(sweep_dir)


# ----------------------------------------------------------------- mxfp8_rl


def mismatch_table(sweep_dir: str) -> str:
  """Markdown: per pair, mismatch on sampled tokens and on the probe, and reward."""
  info, runs = completed_runs(sweep_dir)
  lines = ["", "## Mismatch by recipe pair", "",
           "Mean ± sample std over seeds of the per-update mean. *k3 (sampled)*: "
           "KL(sampler ‖ learner) by the k3 estimator on the sampled completion tokens, "
           "before the update; *k3 / max |Δlogp| (probe)*: on the fixed probe batch "
           "right after each sync (the parity check's statistics); reward: mean over "
           "training; learner accuracy: the learner's greedy accuracy, mean over the "
           "evaluations after update 0.", "",
           "| arm | k3 (sampled) | max abs Δlogp (sampled) | k3 (probe) | "
           "max abs Δlogp (probe) | reward | learner accuracy |",
           "|---|---|---|---|---|---|---|"]
  for arm in [a["name"] for a in info["arms"]]:
    seeds = runs.get(arm, {})
    if not seeds:
      lines.append(f"| `{arm}` | | | | | | |")
      continue
    mean = lambda tag, after=-1: [float(np.mean([v for u, v in s[tag] if u > after]))
                                  for s in seeds.values()]
    lines.append(
        f"| `{arm}` | {spread(mean('train/mismatch_k3'), 5)} | "
        f"{spread(mean('train/mismatch_max_abs_delta_logp'), 3)} | "
        f"{spread(mean('sync/stat/parity_k3'), 6)} | "
        f"{spread(mean('sync/stat/parity_max_abs_delta_logp'), 4)} | "
        f"{spread(mean('train/reward'))} | "
        f"{spread(mean('eval/greedy_accuracy', 0))} |")
  return "\n".join(lines) + "\n"


def clean_checks_table(sweep_dir: str) -> str:
  """Markdown: per pair, what the recorded checks saw on these clean runs: syncs at
  which each check fired (all seeds) and the largest parity and padding statistics,
  the out-of-sample test of the gates calibrated by ``mxfp8_rl_faults``."""
  info, runs = completed_runs(sweep_dir)
  lines = ["", "## The sync checks on these clean runs", "",
           "Every check recorded at every sync (none stops a run). *Fired*: syncs at "
           "which a check fired under the gates the runs used / syncs, summed over "
           "seeds (a check that fired on a clean run is a false alarm); then the "
           "largest probe k3, max |Δlogp| and padding logit change over every sync: "
           "compare them with the calibrated gates of the `mxfp8_rl_faults` report "
           "(chosen on other seeds). *Over the library's gates now*: syncs whose probe "
           "k3 / max |Δlogp| / padding change exceeds the library's default gate when "
           "this report was built (`MXFP8RLConfig`'s cross-recipe tolerances and "
           "`padding_atol`, the exact same-recipe entries of `PARITY_TOLERANCES`): the "
           "false alarms these clean runs would raise today.", "",
           "| arm | syncs | fired | max probe k3 | max probe max abs Δlogp | "
           "max padding change | over the library's gates now (k3 / Δlogp / padding) |",
           "|---|---|---|---|---|---|---|"]
  config, exact, _ = _library_gates()
  for arm in [a["name"] for a in info["arms"]]:
    seeds = runs.get(arm, {})
    if not seeds:
      lines.append(f"| `{arm}` | | | | | | |")
      continue
    learner, sampler = _recipes(info, arm)
    same = learner == sampler
    gates = {"parity_k3": exact.k3 if same else config.cross_k3_tolerance,
             "parity_max_abs_delta_logp": (exact.max_abs_delta_logp if same
                                           else config.cross_max_dlogp_tolerance),
             "padding_max_abs_diff": config.padding_atol}
    over = [sum(v > gates[stat] for s in seeds.values() for _, v in _stat(s, stat))
            for stat in gates]
    syncs = sum(len(s.get("sync/fired/coverage", [])) for s in seeds.values())
    fired = {c: sum(len(_fired(s, c)) for s in seeds.values()) for c in CHECKS}
    peak = lambda stat: max((v for s in seeds.values() for _, v in _stat(s, stat)),
                            default=math.nan)
    lines.append(f"| `{arm}` | {syncs} | "
                 + (", ".join(f"{c} {k}" for c, k in fired.items() if k) or "none")
                 + f" | {_fmt(peak('parity_k3'))} | "
                 f"{_fmt(peak('parity_max_abs_delta_logp'))} | "
                 f"{_fmt(peak('padding_max_abs_diff'))} | "
                 f"{' / '.join(str(n) for n in over)} |")
  return "\n".join(lines) + "\n"


def mxfp8_rl_appendix(sweep_dir: str) -> str:
  """The matched-vs-crossed sweep's appendix: :func:`mismatch_table` and
  :func:`clean_checks_table`."""
  return mismatch_table(sweep_dir) + clean_checks_table(sweep_dir)


def detection_counts(sweep_dir: str) -> str:
  """Markdown: the faults confirmatory round's declared counts, from the runs' events:
  per fault arm, the runs whose bitwise (and same-recipe parity) check fired at the
  fault's sync; per check, the clean runs' syncs at which it fired. Each with the exact
  one-sided 95% upper bound on the rate that breaks the count (Clopper-Pearson)."""
  from experiments.common.sweeps.confirmatory import count_upper_bound  # pylint: disable=import-outside-toplevel
  info, runs = completed_runs(sweep_dir)
  fault_update = int(info["base"]["fault_update"])
  lines = ["", "## Detections and false alarms (counts, declared before the runs)", "",
           "*At the fault's sync*: the runs of each fault arm whose check fired at "
           f"update {fault_update}, the sync the fault was planted at (all its seeds, "
           "whatever look they ran in). *Clean syncs*: the syncs of the clean runs (every update) "
           "at which each check fired, a false alarm. The bound is the exact one-sided "
           "95% upper bound on the rate of runs (syncs) that would break the count "
           "(Clopper-Pearson; `1 − 0.05^(1/n)` for none of n).", "",
           "| count | runs (syncs) meeting it | 95% upper bound on the rate "
           "breaking it |",
           "|---|---|---|"]
  pooled = {"bitwise": [0, 0], "parity": [0, 0]}
  for arm in [a["name"] for a in info["arms"]]:
    fault = str(config_value(info, arm, "planted_fault"))
    seeds = runs.get(arm, {})
    if fault == "none" or not seeds:
      continue
    for check in pooled:
      hit = sum(fault_update in _fired(curves, check) for curves in seeds.values())
      pooled[check][0] += hit
      pooled[check][1] += len(seeds)
      bound = count_upper_bound(len(seeds) - hit, len(seeds))
      lines.append(f"| {fault}: {check} fired at update {fault_update} | {hit} of "
                   f"{len(seeds)} | {bound:.3f} |")
  for check, (hit, n) in pooled.items():
    if n:
      lines.append(f"| every fault: {check} fired at update {fault_update} | **{hit} of "
                   f"{n}** | {count_upper_bound(n - hit, n):.3f} |")
  clean = [s for a in info["arms"] if str(config_value(info, a["name"], "planted_fault"))
           == "none" for s in runs.get(a["name"], {}).values()]
  syncs = sum(len(s.get("sync/fired/coverage", [])) for s in clean)
  for check in CHECKS:
    alarms = sum(len(_fired(s, check)) for s in clean)
    if syncs:
      lines.append(f"| clean syncs: {check} silent | {syncs - alarms} of {syncs} | "
                   f"{count_upper_bound(alarms, syncs):.3f} |")
  return "\n".join(lines) + "\n"


def faults_confirm_appendix(sweep_dir: str) -> str:
  """The faults confirmatory sweep's appendix: the pilot beside each claim, the sizing,
  the planted-fault table (:func:`fault_table`) and :func:`detection_counts`."""
  from experiments.common.sweeps.confirmatory import confirm_sections  # pylint: disable=import-outside-toplevel
  from experiments.mxfp8_rl.sweeps import FAULTS_CONFIRM_PILOTS  # pylint: disable=import-outside-toplevel
  return (confirm_sections(sweep_dir, FAULTS_CONFIRM_PILOTS) + fault_table(sweep_dir)
          + detection_counts(sweep_dir))


def confirm_appendix(sweep_dir: str) -> str:
  """The confirmatory sweep's appendix: the pilot beside each claim, and the sizing."""
  from experiments.common.sweeps.confirmatory import confirm_sections  # pylint: disable=import-outside-toplevel
  from experiments.mxfp8_rl.sweeps import CONFIRM_PILOTS  # pylint: disable=import-outside-toplevel
  return confirm_sections(sweep_dir, CONFIRM_PILOTS)
