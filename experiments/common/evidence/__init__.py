"""The evidence a run leaves and how it is read back, independent of any sweep.

The results table (``results``: a finished run's row and completion mark;
``results_file``: the JSONL file on disk), TensorBoard events written and read without
TensorFlow (``tensorboard_writer``, ``tensorboard_reader``: scalars, histograms,
HParams), curves and their plots (``curves``, ``curve_plots``), and the statistics a
report's tables and verdicts are computed with (``stats``).
"""
