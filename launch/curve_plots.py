"""PNG plots of training curves, one figure per scalar tag, one colour per arm."""

from __future__ import annotations

import os
from typing import Mapping, Sequence

import numpy as np

from experiments.common.optional_imports import require


def _pyplot():
  matplotlib = require("matplotlib", "matplotlib", "the sweep report's plots")
  matplotlib.use("Agg")  # headless: no display on clusters or CI
  return require("matplotlib.pyplot", "matplotlib", "the sweep report's plots")


def plot_curves(tag: str, curves: Mapping[str, Sequence[Sequence[tuple[int, float]]]],
                path: str, *, baseline: str | None = None) -> str:
  """Plots ``arm -> [one run's [(step, value), ...], ...]`` for ``tag`` into ``path``.

  Each run is a thin line; the arm's mean over runs (on the steps all of them logged) is
  a thick line. Returns ``path``.
  """
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
  colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  styles = ["-", "--", ":", "-."]  # arms that overlap stay distinguishable
  for i, (arm, runs) in enumerate(curves.items()):
    color, style = colors[i % len(colors)], styles[i % len(styles)]
    runs = [r for r in runs if r]
    for r in runs:
      steps, values = zip(*r)
      ax.plot(steps, values, color=color, alpha=0.35, linewidth=0.8)
    if runs:
      common = sorted(set.intersection(*[{s for s, _ in r} for r in runs]))
      if common:
        means = [np.mean([dict(r)[s] for r in runs]) for s in common]
        label = f"{arm} (mean of {len(runs)})" + (" [baseline]" if arm == baseline else "")
        ax.plot(common, means, color=color, linestyle=style, linewidth=2.2, label=label)
  ax.set_xlabel("step")
  ax.set_ylabel(tag)
  ax.set_title(tag)
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path)
  plt.close(fig)
  return path
