"""The --recipe flag: DecoderLM quantized by rules gives exactly what the experiments'
convention says, each GEMM in its recipe (every experiment's numbers stay what the old
injected dot_generals gave)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.common.trainers import recipe_flag
from lowprec.models import transformer
from lowprec.models.transformer import bf16_dot_general, fp32_dot_general
from lowprec.numerics import recipes

DN = (((1,), (0,)), ((), ()))


def _by_role(cfg, recipe):
  """The convention written out by operand shape, as a replacement for the model's one
  matmul: attention products (batched, 4-D), the head ([D, V]) and the router ([D, E])
  in bf16, every other GEMM (projections, the [E, D, F] expert GEMMs) in ``recipe``."""
  projection = recipe_flag.recipe_dot_general(recipe)

  def dot_general(lhs, rhs, dn, key):
    attention = lhs.ndim == 4 and dn[1] == ((0, 1), (0, 1))
    small = rhs.shape in ((cfg.d_model, cfg.vocab_size), (cfg.d_model, cfg.num_experts))
    return (bf16_dot_general if attention or small else projection)(lhs, rhs, dn, key)

  return dot_general


@pytest.mark.parametrize("recipe,experts", [("fp32", 0), ("bf16", 2), ("mxfp8", 0),
                                            ("mxfp4", 2), ("nvfp4", 0)])
def test_rule_list_equals_each_gemm_in_its_recipe(recipe, experts, monkeypatch):
  # One block holds every rule's target (projections, attention, router, head); a
  # second block only doubled the compile (134 s for nvfp4 on a loaded 2-core machine).
  cfg = transformer.TransformerConfig(vocab_size=17, d_model=32, num_layers=1, num_heads=2,
                                      d_ff=64, max_len=32, num_experts=experts)
  tokens = jax.random.randint(jax.random.key(0), (2, 32), 0, 17)
  plain = transformer.DecoderLM(cfg)
  new = recipe_flag.quantized_model(transformer.DecoderLM(cfg), recipe)
  key = jax.random.key(2)  # mxfp4 rounds dO stochastically and draws Hadamard signs
  params = plain.init(jax.random.key(1), tokens, key)
  chex.assert_trees_all_equal_structs(new.init(jax.random.key(1), tokens, key), params)

  def loss(model):
    def f(p):
      logits, sown = model.apply(p, tokens, key, mutable=["losses"])
      return jnp.mean(logits ** 2) + sum(jnp.sum(l) for l in jax.tree.leaves(sown)), logits
    return jax.jit(jax.value_and_grad(f, has_aux=True))(params)

  got = loss(new)
  if recipe != "fp32":  # fp32: the plain model is the reference
    monkeypatch.setattr(transformer, "fp32_dot_general", _by_role(cfg, recipe))
  chex.assert_trees_all_equal(got, loss(plain))


def test_rules_and_recipe_names():
  assert recipe_flag.model_rules("fp32") == ()
  rules = recipe_flag.model_rules("mxfp8")
  assert [r.recipe_name for r in rules] == ["bf16", "bf16", "bf16", "mxfp8"]
  assert isinstance(rules[-1].recipe, recipes.Recipe)  # resolved once, then the object
  assert rules[0].matches("block_1/moe/router", "dot_general")
  assert rules[1].matches("block_0", "dot_general") and not rules[1].matches(
      "block_0/qkv", "dot_general")
  names = recipe_flag.available_recipes()
  assert names[:2] == ("fp32", "bf16") and "mxfp8" in names and "fp8_delayed" in names
  with pytest.raises(ValueError, match="nope"):
    recipe_flag.model_rules("nope")
  with pytest.raises(ValueError, match="Recipe"):
    recipe_flag.recipe_dot_general(3)


def test_recipe_dot_general():
  x = jax.random.normal(jax.random.PRNGKey(0), (8, 64))
  w = jax.random.normal(jax.random.PRNGKey(1), (64, 16))
  key = jax.random.PRNGKey(2)
  out32 = recipe_flag.recipe_dot_general("fp32")(x, w, DN, key)
  out16 = recipe_flag.recipe_dot_general("bf16")(x, w, DN, key)
  assert out32.dtype == jnp.float32 and out16.dtype == jnp.float32
  np.testing.assert_allclose(out32, np.asarray(x, np.float64) @ np.asarray(w, np.float64),
                             rtol=1e-5, atol=1e-4)
  exact = (np.asarray(x.astype(jnp.bfloat16), np.float64)
           @ np.asarray(w.astype(jnp.bfloat16), np.float64))
  np.testing.assert_allclose(out16, exact, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(bf16_dot_general(x, w, DN, None), exact, rtol=1e-5, atol=1e-5)
  chex.assert_trees_all_equal(fp32_dot_general(x, w, DN, None), out32)
