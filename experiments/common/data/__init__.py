"""The experiments' offline tasks and data: nothing is downloaded at run time.

``shakespeare`` reads the shipped corpus (``experiments/data/shakespeare.txt.gz``) into
char- or byte-level batches that are a pure function of ``(seed, position)``;
``arithmetic_task`` is the verifiable multi-digit addition task of the RL papers;
``digits`` is scikit-learn's bundled 8x8 digits.
"""
