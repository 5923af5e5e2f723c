"""The --recipe flag: DecoderLM quantized by rules gives exactly what the old injected
dot_generals gave (every existing experiment's numbers stay bit-identical)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.common import recipe_flag
from lowprec.models import transformer
from lowprec.models.transformer import bf16_dot_general, fp32_dot_general

DN = (((1,), (0,)), ((), ()))


def _old_model(cfg, recipe):
  """DecoderLM built the way the experiments built it before the rule lists."""
  if recipe == "fp32":
    return transformer.DecoderLM(cfg)
  plain = bf16_dot_general
  return transformer.DecoderLM(cfg, dot_general=recipe_flag.recipe_dot_general(recipe),
                               attention_dot_general=plain, head_dot_general=plain,
                               router_dot_general=plain)


@pytest.mark.parametrize("recipe,experts", [("fp32", 0), ("bf16", 2), ("mxfp8", 0),
                                            ("mxfp4", 2), ("nvfp4", 0)])
def test_rule_list_equals_the_old_injected_dot_generals(recipe, experts):
  cfg = transformer.TransformerConfig(vocab_size=17, d_model=32, num_layers=2, num_heads=2,
                                      d_ff=64, max_len=32, num_experts=experts)
  tokens = jax.random.randint(jax.random.key(0), (2, 32), 0, 17)
  old = _old_model(cfg, recipe)
  new = recipe_flag.quantized_model(transformer.DecoderLM(cfg), recipe)
  key = jax.random.key(2)  # mxfp4 rounds dO stochastically and draws Hadamard signs
  params = old.init(jax.random.key(1), tokens, key)
  chex.assert_trees_all_equal_structs(new.init(jax.random.key(1), tokens, key), params)

  def loss(model):
    def f(p):
      logits, sown = model.apply(p, tokens, key, mutable=["losses"])
      return jnp.mean(logits ** 2) + sum(jnp.sum(l) for l in jax.tree.leaves(sown)), logits
    return jax.jit(jax.value_and_grad(f, has_aux=True))(params)

  chex.assert_trees_all_equal(loss(new), loss(old))


def test_rules_and_recipe_names():
  assert recipe_flag.model_rules("fp32") == ()
  rules = recipe_flag.model_rules("mxfp8")
  assert [r.recipe for r in rules] == ["bf16", "bf16", "bf16", "mxfp8"]
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
