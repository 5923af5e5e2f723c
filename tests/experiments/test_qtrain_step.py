"""The benchmarks' LM step carries a delayed-scaling recipe's state past the optimizer."""

import jax
import jax.numpy as jnp
import optax

from experiments.benchmarks import qtrain_step
from experiments.common.trainers import recipe_flag
from lowprec.models import quantization
from lowprec.models import transformer


def test_amax_histories_are_carried_not_optimized():
  """Before: AdamW's state covered every variable ``model.init`` returned, so the
  amax histories of ``fp8_delayed`` were moved by the optimizer. Traced only (eval_shape:
  no compile)."""
  cfg = transformer.TransformerConfig(vocab_size=16, d_model=16, num_layers=1,
                                      num_heads=2, d_ff=32, max_len=8)
  model = recipe_flag.quantized_model(transformer.DecoderLM(cfg), "fp8_delayed")
  opt = optax.adamw(1e-3)
  tokens = jnp.zeros((2, 9), jnp.int32)
  state = jax.eval_shape(lambda: qtrain_step.lm_train_state(
      model, opt, tokens[:, :-1], jax.random.key(1)))
  (variables, opt_state), loss = jax.eval_shape(
      qtrain_step.lm_train_step(model, opt), state, tokens, jax.random.key(2))
  assert set(state[0]) == set(variables) == {"params", quantization.OVERWRITE}
  assert jax.tree.structure(variables) == jax.tree.structure(state[0])
  adam = opt_state[0]
  assert jax.tree.structure(adam.mu) == jax.tree.structure(variables["params"])
  assert loss.shape == ()
