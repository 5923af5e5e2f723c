"""The sweep: one home for what a sweep declares and how its evidence is decided.

``sweep_spec`` is a sweep's declaration (base config, arms, seeds, calibration seeds,
claims); ``sweep_data`` reads a sweep directory back (manifest, sweep.json, results,
runs); ``sequential`` is the group-sequential plan that decides a sweep's claims look by
look; ``confirmatory`` builds a confirmatory sweep's report sections next to its pilot;
``bench_sequential`` decides timing claims by rounds of a benchmark. ``launch`` runs
sweeps with these (papers' folders may import them; they may not import ``launch``).
"""
