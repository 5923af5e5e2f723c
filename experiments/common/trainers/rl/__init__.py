"""The RL machinery shared by Pan's, Fair Cast's and MXFP8 RL's experiments.

- ``config``: :class:`RLConfig` (every field of a GRPO run) and the hooks an experiment
  overrides (models, optimizer, exporter, initial master, loss weights, sync monitor).
- ``warm_start``: the supervised starting policy (cached) and greedy-accuracy evaluation.
- ``harness_checks``: Pan's "probe the harness" checks.
- ``loop``: the run itself, one GRPO update per step of the shared ``run_loop``.
- ``report``: reading an RL sweep's runs back for the papers' report tables.
"""
