"""The shared experiment code, one sub-package per concern (each module one concept).

- ``harness/``: one run of any experiment: the ``python -m experiments.<paper>`` entry
  point (``script``), absl flags from a frozen config dataclass (``config_flags``),
  per-run options (``run_options``), the run itself (``run``: ``workdir``'s claim and
  lock, ``checkpoint``'s orbax checkpoints, the writer, ``run_metadata``, the results
  row), the shared ``train_loop``, ``preemption``, ``progress``, ``log_filters``,
  ``distributed``, ``private_dirs``, ``params_cache``, ``optional_imports`` and
  ``repo_paths``.
- ``trainers/``: the trainers papers share: ``lm_trainer`` (the Shakespeare LM trainer)
  with ``moe_lm``, ``recipe_flag`` (a ``--recipe`` -> the rule list that
  ``models.quantize_model`` applies), ``weight_inspection``, and ``rl/`` (the RL loop of
  three papers).
- ``data/``: offline tasks and data: ``shakespeare``, ``arithmetic_task``, ``digits``.
- ``evidence/``: what a run leaves and reading it back: the JSONL results table
  (``results``, ``results_file``), TF-free TensorBoard events (``tensorboard_writer``,
  ``tensorboard_reader``), ``curves`` and ``curve_plots``, and ``stats``.
- ``sweeps/``: the sweep's one home below ``launch``: declarations (``sweep_spec``),
  reading a sweep directory back (``sweep_data``), sequential plans (``sequential``),
  confirmatory reports (``confirmatory``) and benchmark claims decided by rounds
  (``bench_sequential``).

Imports among them: ``data`` uses ``harness``; ``sweeps`` use ``harness`` and ``evidence``;
``trainers`` use every other one; ``harness`` and ``evidence`` use each other (a run
writes its events and closes with ``evidence.results``' row, which reads the run's
workdir). Papers' folders import any of them; none imports ``launch``.
"""
