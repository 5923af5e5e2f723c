"""The kv_cache sweep's report appendix: every cache's numbers, failures, exactness."""

from __future__ import annotations

from experiments.common.evidence.stats import format_spread
from experiments.common.sweeps.sweep_data import evaluation_metrics

FAIL_ACCURACY = 0.05  # "fails to answer any questions": below 5% exact matches
# A base below this with the fp32 cache has not learned the task: a cache cannot be
# seen to fail on it (the first, discarded run of this sweep had such bases).
SOLID_BASE_ACCURACY = 0.9



def kv_cache_appendix(sweep_dir: str) -> str:
  """Markdown: the per-arm table, the failure counts and the exactness check."""
  info, runs = evaluation_metrics(sweep_dir)
  col = lambda seeds, tag, digits=4: format_spread([s.get(tag) for s in seeds.values()],
                                                   digits)
  lines = ["", "## Every cache", "",
           "Mean ± sample std over seeds. *accuracy*: greedy exact match with the cache; "
           "*agree*: same greedy completion as the fp32 cache; *k3*, *max |Δlogp|*: the "
           "cache's log-probs against the fp32 cache's on completions sampled at T = 1; "
           "*|K| max*: largest stored key magnitude (before quantization); *K err*, "
           "*V err*: relative L2 error of the stored keys / values; *K bad*: fraction "
           "of key elements stored with relative error above 1/8 (saturated, flushed "
           "or too coarse); *fails*: seeds with accuracy below "
           f"{FAIL_ACCURACY} (\"fails to answer any questions\").", "",
           "| arm | accuracy | agree | k3 | max abs Δlogp | abs K max | K err | K bad | "
           "V err | B/token | fails |", "|---|---|---|---|---|---|---|---|---|---|---|"]
  for arm in [a["name"] for a in info["arms"]]:
    seeds = runs.get(arm, {})
    if not seeds:
      lines.append(f"| `{arm}` | no runs | | | | | | | | | |")
      continue
    fails = sum(s.get("kv/greedy_accuracy", 1.0) < FAIL_ACCURACY for s in seeds.values())
    lines.append(
        f"| `{arm}` | {col(seeds, 'kv/greedy_accuracy', 3)} | "
        f"{col(seeds, 'kv/greedy_agreement', 3)} | {col(seeds, 'kv/mismatch_k3', 5)} | "
        f"{col(seeds, 'kv/max_abs_delta_logp', 3)} | {col(seeds, 'kv/key_abs_max', 1)} | "
        f"{col(seeds, 'kv/key_rel_error', 4)} | {col(seeds, 'kv/key_bad_frac', 4)} | "
        f"{col(seeds, 'kv/value_rel_error', 4)} | {col(seeds, 'kv/bytes_per_token', 0)} | "
        f"{fails}/{len(seeds)} |")
  # Exactness of the reparametrization: every run's fp32-cache accuracy per seed.
  by_seed: dict[int, set[float]] = {}
  for seeds in runs.values():
    for seed, s in seeds.items():
      if "kv/fp32_greedy_accuracy" in s:
        by_seed.setdefault(seed, set()).add(s["kv/fp32_greedy_accuracy"])
  lines += ["", "**Same model in every condition.** The fp32-cache greedy accuracy each "
            "run measured on its own (possibly reparametrized) model, per seed: "
            + "; ".join(f"seed {seed}: {sorted(v)}" for seed, v in sorted(by_seed.items()))
            + (" -- one value per seed: the outlier and tiny-key models decode exactly "
               "like the natural one." if all(len(v) == 1 for v in by_seed.values())
               else " -- **differs within a seed**."), ""]
  weak = sorted(seed for seed, v in by_seed.items() if min(v) < SOLID_BASE_ACCURACY)
  lines += [("**Every base learned the task** (fp32-cache greedy accuracy at least "
             f"{SOLID_BASE_ACCURACY} on every seed)." if not weak else
             f"**The bases of seeds {weak} did not learn the task** (fp32-cache greedy "
             f"accuracy below {SOLID_BASE_ACCURACY}): a cache cannot be seen to fail on "
             "them."), ""]
  return "\n".join(lines)


def confirm_appendix(sweep_dir: str) -> str:
  """The confirmatory sweep's appendix: the pilot beside each claim, and the sizing."""
  from experiments.common.sweeps.confirmatory import confirm_sections  # pylint: disable=import-outside-toplevel
  from experiments.kv_cache.sweeps import CONFIRM_PILOTS  # pylint: disable=import-outside-toplevel
  return confirm_sections(sweep_dir, CONFIRM_PILOTS)


def weights_appendix(sweep_dir: str) -> str:
  """The kv_cache_weights sweep's appendix: every weight format's numbers per arm, the
  per-seed accuracies, and whether every base learned the task."""
  info, runs = evaluation_metrics(sweep_dir)
  col = lambda seeds, tag, digits=4: format_spread([s.get(tag) for s in seeds.values()],
                                                   digits)
  lines = ["", "## Every weight format", "",
           "Mean ± sample std over the seeds each arm ran. *accuracy*: greedy exact match "
           "with the quantized weights (fp32 cache); *agree*: the same greedy completion "
           "as the float32 model; *k3*, *max |Δlogp|*: the quantized model's log-probs "
           "against the float32 model's on completions the float32 model sampled at "
           "T = 1; *W err*: relative L2 error of the quantized kernels (all block "
           "kernels together); *alpha*: AWQ's chosen exponent, mean over the 8 kernels.",
           "", "| arm | seeds | accuracy | agree | k3 | max abs Δlogp | W err | alpha |",
           "|---|---|---|---|---|---|---|---|"]
  for arm in [a["name"] for a in info["arms"]]:
    seeds = runs.get(arm, {})
    if not seeds:
      lines.append(f"| `{arm}` | 0 | | | | | | |")
      continue
    alpha_cell = (col(seeds, "weights/awq_alpha", 3) if all(
        "weights/awq_alpha" in s for s in seeds.values()) else "—")
    lines.append(
        f"| `{arm}` | {len(seeds)} | {col(seeds, 'kv/greedy_accuracy', 4)} | "
        f"{col(seeds, 'kv/greedy_agreement', 4)} | {col(seeds, 'kv/mismatch_k3', 5)} | "
        f"{col(seeds, 'kv/max_abs_delta_logp', 3)} | {col(seeds, 'weights/rel_error', 4)} "
        f"| {alpha_cell} |")
  arms = [a["name"] for a in info["arms"] if runs.get(a["name"])]
  all_seeds = sorted({seed for a in arms for seed in runs[a]})
  lines += ["", "Greedy accuracy per seed (× 512 = problems solved):", "",
            "| seed | " + " | ".join(f"`{a}`" for a in arms) + " |",
            "|---|" + "---|" * len(arms)]
  for seed in all_seeds:
    cells = [f"{runs[a][seed]['kv/greedy_accuracy']:.4f}" if seed in runs[a] else ""
             for a in arms]
    lines.append(f"| {seed} | " + " | ".join(cells) + " |")
  base = {seed: s["kv/fp32_greedy_accuracy"] for seeds in runs.values()
          for seed, s in seeds.items() if "kv/fp32_greedy_accuracy" in s}
  weak = sorted(seed for seed, v in base.items() if v < SOLID_BASE_ACCURACY)
  lines += ["", ("**Every base learned the task** (float32 greedy accuracy at least "
                 f"{SOLID_BASE_ACCURACY} on every seed)." if not weak else
                 f"**The bases of seeds {weak} did not learn the task** (float32 greedy "
                 f"accuracy below {SOLID_BASE_ACCURACY})."), ""]
  return "\n".join(lines)
