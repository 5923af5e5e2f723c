"""The harness: what one run of any experiment is made of, whatever it trains.

A script's entry point and flags (``script``, ``config_flags``, ``run_options``), the run
itself (``run``: the workdir claim and lock of ``workdir``, ``checkpoint``'s orbax
checkpoints, the writer, ``run_metadata``'s config.json with the git commit, the results
row), the shared train loop (``train_loop``: TrainState, the jitted ``train_step``, the
loop schedule), SIGTERM and SIGINT (``preemption``), progress lines and quiet library
logs (``progress``, ``log_filters``), multi-host setup (``distributed``), and the small
services runs share: per-user private directories (``private_dirs``), trained bases
cached under a config hash (``params_cache``), the package to install when an optional
one is missing (``optional_imports``) and paths relative to the repository root
(``repo_paths``).
"""
