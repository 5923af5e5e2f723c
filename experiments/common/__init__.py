"""The shared experiment harness, one concept per module.

- ``config_flags``: absl flags generated from a frozen config dataclass (``--help`` lists all).
- ``run_options``: per-run options (workdir, resume, results file, multi-process flags).
- ``train_loop``: TrainState, the jitted ``train_step(state, batch, key)``, the loop.
- ``checkpoint``: orbax checkpoints of state, PRNG key, data position and step.
- ``tensorboard_writer`` / ``tensorboard_reader``: TF-free events (scalars, histograms,
  HParams) and reading them back.
- ``progress``, ``preemption``, ``log_filters``: progress lines, SIGTERM, quiet orbax.
- ``results``, ``run_metadata``: the JSONL results table; config.json with the git commit.
- ``distributed``: ``jax.distributed`` when launched by a cluster, the data mesh.
- ``recipe_flag``: ``--recipe`` name -> the ``dot_general`` injected into models.
- ``weight_inspection``: weight histograms and per-kernel quantization error.
- ``shakespeare``, ``digits``, ``synthetic_tasks``: offline data (``optional_imports``
  names the package to install when one is missing).
"""
