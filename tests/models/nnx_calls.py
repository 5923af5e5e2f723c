"""NNX model calls for the tests, jitted: run eagerly, each op of a model compiled a
program of its own."""

from flax import nnx


def jitted_call(model, *args):
  """``model(*args)`` under ``nnx.jit``, traced afresh on every call, so a
  ``quantization.recording()`` around it sees every op."""
  return nnx.jit(lambda m, *a: m(*a))(model, *args)
