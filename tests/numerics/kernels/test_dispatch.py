"""The kernel choice follows the trace: ``kernels.implementation`` is part of the key of
JAX's trace caches, so one jitted function traced under two choices in one process
holds each choice's program (issue 53, item 7).

The programs are told apart by what they hold: ``pallas_call`` equations in the jaxpr
(the ``"pallas"`` choice is a ``platform_dependent`` switch with a GPU and a TPU kernel,
so two), and Mosaic custom calls in the program lowered for TPU (one), which needs no
device and no TPU toolchain.
"""

import threading

import chex
import jax
import jax.numpy as jnp
import pytest

from lowprec import numerics
from lowprec.numerics import kernels
from lowprec.numerics.kernels import dispatch

SPEC = numerics.QuantSpec("e4m3", 32, axis=-1)
X = jax.ShapeDtypeStruct((64, 64), jnp.float32)
KERNELS_IN = {"pallas": (2, 1), "jnp": (0, 0)}  # (pallas_calls in the jaxpr, TPU kernels)


def _kernels_in(traced) -> tuple[int, int]:
  lowered = traced.lower(lowering_platforms=("tpu",)).as_text()
  return str(traced.jaxpr).count("pallas_call"), lowered.count("tpu_custom_call")


# A jitted callee: its trace cache entries outlive each caller's trace.
_inner = jax.jit(lambda x: kernels.mx_quantize_dequantize(x, "e2m1", axis=-2))


def _step(x):
  return kernels.quantize_dequantize(x, SPEC) + _inner(x)  # the training path's quantizer


@pytest.mark.parametrize("order", [("pallas", "jnp"), ("jnp", "pallas")])
def test_one_jitted_function_traced_under_each_choice(order):
  step = jax.jit(_step)
  for impl in order + order:  # and again: each choice keeps its own trace
    with kernels.implementation(impl):
      pallas_calls, tpu_kernels = _kernels_in(step.trace(X))
    want_pallas, want_tpu = KERNELS_IN[impl]
    assert (pallas_calls, tpu_kernels) == (2 * want_pallas, 2 * want_tpu), impl


def test_a_jitted_call_is_retraced_only_for_a_new_choice():
  traces = []

  @jax.jit
  def f(x):
    traces.append(dispatch.default_impl())
    return kernels.mx_quantize_dequantize(x, "e4m3")

  x = jax.random.normal(jax.random.key(0), (8, 64))
  results = {}
  for impl in ("jnp", "interpret", "jnp", "interpret"):
    with kernels.implementation(impl):
      results[impl] = f(x)
  assert traces == ["jnp", "interpret"]
  chex.assert_trees_all_equal(results["jnp"], results["interpret"])


def test_the_choice_is_thread_local():
  default = dispatch.default_impl()
  chosen = "jnp" if default != "jnp" else "interpret"
  seen = []
  with kernels.implementation(chosen):
    thread = threading.Thread(target=lambda: seen.append(dispatch.default_impl()))
    thread.start()
    thread.join()
    assert dispatch.default_impl() == chosen
  assert seen == [default]  # another thread is in no block: the process default
