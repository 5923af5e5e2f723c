"""The mxfp4_backward sweep's report appendix: the 2 x 3 factorial table and the
SR x RHT interaction, computed from the evaluation runs' results rows."""

from __future__ import annotations

from experiments.common.evidence.stats import format_spread, mean_interval
from experiments.common.sweeps.sweep_data import evaluation_metrics

LOSS = "eval/loss"
# (rounding, Hadamard) -> arm of the factorial part of the sweep.
_FACTORIAL = {("nearest", "none"): "rtn", ("stochastic", "none"): "sr",
              ("nearest", "random"): "rht", ("stochastic", "random"): "rht_sr",
              ("nearest", "deterministic"): "dh", ("stochastic", "deterministic"): "dh_sr"}


def _interaction(runs: dict[str, dict[int, dict[str, float]]]) -> tuple[list[float], str]:
  """Per seed ``(rht_sr - sr) - (rht - rtn)``: how much more the RHT lowers the loss
  with SR than without (negative: RHT helps SR more), over seeds with all four arms."""
  arms = ("rht_sr", "sr", "rht", "rtn")
  seeds = sorted(set.intersection(*(set(runs.get(a, {})) for a in arms)))
  loss = lambda arm, seed: runs[arm][seed][LOSS]
  values = [(loss("rht_sr", s) - loss("sr", s)) - (loss("rht", s) - loss("rtn", s))
            for s in seeds if all(LOSS in runs[a][s] for a in arms)]
  if len(values) < 2:
    return values, f"n = {len(values)}: too few seeds for an interval"
  iv = mean_interval(values)
  return values, (f"{iv.mean:+.4f} [{iv.ci_low:+.4f}, {iv.ci_high:+.4f}] "
                  f"(n = {iv.n})")


def mxfp4_backward_appendix(sweep_dir: str) -> str:
  """Markdown: final validation loss in the rounding x Hadamard table (mean ± sample
  std over seeds, gap to bf16 in parentheses) and the SR x RHT interaction."""
  _, runs = evaluation_metrics(sweep_dir)
  base = runs.get("bf16", {})
  lines = ["", "## Rounding x Hadamard", "",
           f"Final `{LOSS}`: mean ± sample std over the evaluation seeds; in "
           "parentheses the paired gap to bf16 (mean over seeds both ran).", "",
           "| rounding | no Hadamard | random Hadamard | deterministic Hadamard |",
           "|---|---|---|---|"]
  for rounding in ("nearest", "stochastic"):
    cells = []
    for hadamard in ("none", "random", "deterministic"):
      seeds = runs.get(_FACTORIAL[(rounding, hadamard)], {})
      losses = {s: m[LOSS] for s, m in seeds.items() if LOSS in m}
      gaps = [losses[s] - base[s][LOSS] for s in losses if LOSS in base.get(s, {})]
      gap = f" ({sum(gaps) / len(gaps):+.4f})" if gaps else ""
      cells.append(format_spread(list(losses.values())) + gap)
    lines.append(f"| {rounding} | " + " | ".join(cells) + " |")
  only = {s: m[LOSS] for s, m in runs.get("rtn_dgrad_only", {}).items() if LOSS in m}
  lines += ["", f"dgrad-only RTN (wgrad bf16): {format_spread(list(only.values()))}; "
            f"bf16: {format_spread([m.get(LOSS) for m in base.values()])}.", ""]
  _, text = _interaction(runs)
  lines += ["**SR x RHT interaction** (secondary, declared with the sweep, not part of "
            "the sequential plan): per seed `(rht_sr − sr) − (rht − rtn)`, the RHT's "
            "effect with SR minus its effect with round to nearest; mean [paired 95% "
            f"t-interval]: {text}. Negative: the RHT helps more with SR, as Tseng et al. "
            "argue (it bounds SR's variance).", ""]
  return "\n".join(lines)
