"""experiments.optimizer_state.memory_budget: the memory lines of a compiled MoE step."""

import dataclasses

import numpy as np

from experiments.optimizer_state import memory_budget, sweeps


def _tiny(**changes):
  base = sweeps.optimizer_state().base
  return dataclasses.replace(base, d_model=16, num_layers=1, num_heads=2, d_ff=16,
                             num_experts=2, batch_size=2, seq_len=8, **changes)


def test_lines_of_a_tiny_step():
  lines = memory_budget.step_lines(_tiny(moment_format="fp32"), vocab_size=11)
  # Counted independently: 4 bytes per float32 parameter of the initialized model.
  config = _tiny()
  from experiments.common.trainers import lm_trainer  # pylint: disable=import-outside-toplevel
  import jax, jax.numpy as jnp  # pylint: disable=import-outside-toplevel,multiple-imports
  params = jax.eval_shape(lambda: lm_trainer.build_lm(config, 11).model.init(
      jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32), jax.random.PRNGKey(0)))["params"]
  n = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
  assert lines["weights"] == lines["gradients"] == 4 * n
  # Two float32 moments per parameter, plus the step counters (a few int32 scalars).
  assert 8 * n <= lines["optimizer_state"] <= 8 * n + 64
  assert lines["activations_and_workspace"] > 0


def test_verdict():
  assert memory_budget.verdict({"weights": 1, "optimizer_state": 2, "x": 1}) == "held"
  assert memory_budget.verdict({"weights": 1, "optimizer_state": 2, "x_y": 2}) == (
      "not held (x y as large or larger)")
