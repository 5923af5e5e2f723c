"""PNG plots of training curves, one figure per scalar tag, one colour per arm."""

from __future__ import annotations

import os
from typing import Mapping, Sequence

import numpy as np

from experiments.common.harness.optional_imports import require


def _pyplot():
  matplotlib = require("matplotlib", "matplotlib", "the sweep report's plots")
  matplotlib.use("Agg")  # headless: no display on clusters or CI
  return require("matplotlib.pyplot", "matplotlib", "the sweep report's plots")


def moving_average(values: Sequence[float], window: int) -> np.ndarray:
  """Trailing mean over the last ``window`` values (fewer at the start), float64."""
  if window < 1:
    raise ValueError(f"window must be >= 1, got {window}")
  v = np.asarray(values, np.float64)
  c = np.concatenate([[0.0], np.cumsum(v)])
  idx = np.arange(1, len(v) + 1)
  lo = np.maximum(idx - window, 0)
  return (c[idx] - c[lo]) / (idx - lo)


def plot_curves(tag: str, curves: Mapping[str, Sequence[Sequence[tuple[int, float]]]],
                path: str, *, baseline: str | None = None, smooth: int = 1,
                vlines: Sequence[float] = (), vline_label: str = "",
                title: str | None = None) -> str:
  """Plots ``arm -> [one run's [(step, value), ...], ...]`` for ``tag`` into ``path``.

  Each run is a thin line; the arm's mean over runs (on the steps all of them logged) is
  a thick line. ``smooth > 1`` plots the trailing moving average over that many logged
  points instead of the raw values; ``vlines`` marks steps (e.g. sampler refreshes) with
  dotted vertical lines. Returns ``path``.
  """
  plt = _pyplot()
  if smooth > 1:
    curves = {arm: [list(zip([s for s, _ in r], moving_average([v for _, v in r], smooth)))
                    for r in runs if r] for arm, runs in curves.items()}
  fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
  for i, x in enumerate(vlines):
    ax.axvline(x, color="0.5", linestyle=":", linewidth=1.0,
               label=vline_label if i == 0 and vline_label else None)
  colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  styles = ["-", "--", ":", "-."]  # arms that overlap stay distinguishable
  for i, (arm, runs) in enumerate(curves.items()):
    color, style = colors[i % len(colors)], styles[i % len(styles)]
    runs = [r for r in runs if r]
    for r in runs:
      steps, values = zip(*r)
      ax.plot(steps, values, color=color, alpha=0.35, linewidth=0.8)
    if runs:
      by_step = [dict(r) for r in runs]  # once per run, not once per run and step
      common = sorted(set.intersection(*[set(d) for d in by_step]))
      if common:
        means = [np.mean([d[s] for d in by_step]) for s in common]
        label = f"{arm} (mean of {len(runs)})" + (" [baseline]" if arm == baseline else "")
        ax.plot(common, means, color=color, linestyle=style, linewidth=2.2, label=label)
  ax.set_xlabel("step")
  ax.set_ylabel(tag if smooth <= 1 else f"{tag} (moving average of {smooth})")
  ax.set_title(title or tag)
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path)
  plt.close(fig)
  return path
