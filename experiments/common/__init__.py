"""The shared experiment harness, one concept per module.

- ``run``: one run of an experiment (workdir claim and lock, checkpoints and restore,
  the writer, run metadata, the loop schedule, the results row); ``script``: the
  ``python -m experiments.<paper>`` entry point; ``config_flags``: absl flags generated
  from a frozen config dataclass (``--help`` lists all); ``run_options``: per-run
  options (workdir, resume, results file, multi-process flags).
- ``train_loop``: TrainState (params, optimizer and quantization state), the jitted
  ``train_step(state, batch, key)``, the loop and its periodic settings
  (``periodic_field``);
  ``lm_trainer``: the Shakespeare LM trainer of lm, alto, optimizer_state and qlora;
  ``rl/``: the RL loop of three papers.
- ``checkpoint``: orbax checkpoints of state, PRNG key, data position and step;
  ``workdir``: the run directory's claim; ``preemption``: SIGTERM and SIGINT.
- ``tensorboard_writer`` / ``tensorboard_reader``: TF-free events (scalars, histograms,
  HParams) and reading them back.
- ``progress``, ``log_filters``: progress lines, quiet library INFO.
- ``results``, ``results_file``, ``run_metadata``: the JSONL results table and
  benchmark JSONs; config.json with the git commit.
- ``sweep_spec``, ``sweep_data``, ``sequential``, ``confirmatory``, ``stats``,
  ``curves``, ``curve_plots``: sweep declarations, reading a sweep back, sequential
  plans, confirmatory reports, statistics and plots.
- ``distributed``: ``jax.distributed`` when launched by a cluster, the data mesh.
- ``recipe_flag``: a ``--recipe`` (name or Recipe) -> the rule list that
  ``models.quantize_model`` applies to the experiments' models, and the single-GEMM
  ``dot_general`` of tools such as the weight inspector.
- ``weight_inspection``: weight histograms and per-kernel quantization error.
- ``shakespeare``, ``digits``, ``arithmetic_task``: offline data
  (``optional_imports`` names the package to install when one is missing);
  ``params_cache``: trained bases shared by runs; ``repo_paths``: the repository root.
"""
