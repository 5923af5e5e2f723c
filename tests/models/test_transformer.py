"""Tests for models.transformer: shapes, causality, injected matmuls and their keys."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from lowprec.models.transformer import (DecoderLM, TransformerConfig, fp32_dot_general,
                                next_token_loss)

CFG = TransformerConfig(vocab_size=17, d_model=32, num_layers=2, num_heads=4, d_ff=64,
                        max_len=16)
KEY = jax.random.PRNGKey(0)


def _init(model, length=16):
  return model.init(KEY, jnp.zeros((2, length), jnp.int32), KEY)["params"]


def test_shapes_and_finite():
  model = DecoderLM(CFG)
  params = _init(model)
  tokens = jax.random.randint(KEY, (3, 16), 0, CFG.vocab_size)
  logits = jax.jit(model.apply)({"params": params}, tokens, KEY)
  chex.assert_shape(logits, (3, 16, CFG.vocab_size))
  assert logits.dtype == jnp.float32
  chex.assert_tree_all_finite(logits)


def test_causal():
  """Changing token t must not change logits before t."""
  model = DecoderLM(CFG)
  params = _init(model)
  a = jax.random.randint(KEY, (1, 16), 0, CFG.vocab_size)
  b = a.at[0, 10].set((a[0, 10] + 1) % CFG.vocab_size)
  la = model.apply({"params": params}, a, KEY)
  lb = model.apply({"params": params}, b, KEY)
  np.testing.assert_array_equal(la[0, :10], lb[0, :10])
  assert not np.allclose(la[0, 10:], lb[0, 10:])


def test_every_matmul_goes_through_injected_dot_general():
  calls = []

  def recording(lhs, rhs, dn, key):
    calls.append((lhs.shape, rhs.shape, tuple(np.asarray(key).tolist())))
    return fp32_dot_general(lhs, rhs, dn, key)

  model = DecoderLM(CFG, dot_general=recording)
  params = _init(model)
  calls.clear()
  model.apply({"params": params}, jnp.zeros((2, 16), jnp.int32), KEY)
  # per block: qkv, scores, values, attn_out, ff_in, ff_out; plus the head
  assert len(calls) == 6 * CFG.num_layers + 1
  keys = [c[2] for c in calls]
  assert len(set(keys)) == len(keys), "every matmul must get its own key"
  # The model has no other matmul: with a dot_general that zeroes everything the logits
  # are zero (the head is a matmul), so nothing bypasses the injection.
  zero = lambda lhs, rhs, dn, key: jnp.zeros_like(fp32_dot_general(lhs, rhs, dn, key))
  logits = DecoderLM(CFG, dot_general=zero).apply({"params": params},
                                                  jnp.zeros((2, 16), jnp.int32), KEY)
  np.testing.assert_array_equal(logits, 0.0)


def test_keys_change_with_step_key():
  seen = []

  def recording(lhs, rhs, dn, key):
    seen.append(key)
    return fp32_dot_general(lhs, rhs, dn, key)

  model = DecoderLM(CFG, dot_general=recording)
  params = _init(model)
  seen.clear()
  model.apply({"params": params}, jnp.zeros((1, 8), jnp.int32), jax.random.PRNGKey(1))
  first = [np.asarray(k) for k in seen]
  seen.clear()
  model.apply({"params": params}, jnp.zeros((1, 8), jnp.int32), jax.random.PRNGKey(2))
  assert all(not np.array_equal(a, np.asarray(b)) for a, b in zip(first, seen))


def test_bf16_dot_general_close_to_fp32():
  def bf16(lhs, rhs, dn, key):
    del key
    return lax.dot_general(lhs.astype(jnp.bfloat16), rhs.astype(jnp.bfloat16), dn,
                           preferred_element_type=jnp.float32)

  params = _init(DecoderLM(CFG))
  tokens = jax.random.randint(KEY, (2, 16), 0, CFG.vocab_size)
  ref = DecoderLM(CFG).apply({"params": params}, tokens, KEY)
  low = DecoderLM(CFG, dot_general=bf16).apply({"params": params}, tokens, KEY)
  assert not np.array_equal(ref, low)
  np.testing.assert_allclose(low, ref, atol=0.1)


def test_loss_gradient_finite_and_loss_value():
  model = DecoderLM(CFG)
  params = _init(model)
  tokens = jax.random.randint(KEY, (2, 16), 0, CFG.vocab_size)

  def loss(p):
    return next_token_loss(model.apply({"params": p}, tokens, KEY), tokens)[0]

  value, grads = jax.value_and_grad(loss)(params)
  chex.assert_tree_all_finite(grads)
  # untrained: close to log(vocab)
  assert abs(float(value) - np.log(CFG.vocab_size)) < 1.5


def test_next_token_loss_mask_and_accuracy():
  logits = jnp.log(jnp.array([[[0.9, 0.1], [0.2, 0.8]]]))
  targets = jnp.array([[0, 0]])
  loss, acc = next_token_loss(logits, targets)
  np.testing.assert_allclose(loss, -(np.log(0.9) + np.log(0.2)) / 2, rtol=1e-6)
  np.testing.assert_allclose(acc, 0.5)
  loss, acc = next_token_loss(logits, targets, jnp.array([[1.0, 0.0]]))
  np.testing.assert_allclose(loss, -np.log(0.9), rtol=1e-6)
  np.testing.assert_allclose(acc, 1.0)


@pytest.mark.parametrize("kwargs", [dict(d_model=30, num_heads=4), dict(num_layers=0),
                                    dict(vocab_size=0)])
def test_config_validation(kwargs):
  with pytest.raises(ValueError):
    TransformerConfig(**{"vocab_size": 10, **kwargs})


def test_rejects_too_long_and_bad_rank():
  model = DecoderLM(CFG)
  params = _init(model)
  with pytest.raises(ValueError, match="max_len"):
    model.apply({"params": params}, jnp.zeros((1, 17), jnp.int32), KEY)
  with pytest.raises(ValueError, match="batch, length"):
    model.apply({"params": params}, jnp.zeros((16,), jnp.int32), KEY)


def test_attention_and_head_dot_generals_are_separate():
  seen = {"linear": 0, "attn": 0, "head": 0}

  def counting(tag):
    def dg(lhs, rhs, dn, key):
      seen[tag] += 1
      return fp32_dot_general(lhs, rhs, dn, key)
    return dg

  model = DecoderLM(CFG, dot_general=counting("linear"),
                    attention_dot_general=counting("attn"), head_dot_general=counting("head"))
  model.init(KEY, jnp.zeros((1, 8), jnp.int32), KEY)
  assert seen == {"linear": 4 * CFG.num_layers, "attn": 2 * CFG.num_layers, "head": 1}


MOE = TransformerConfig(vocab_size=17, d_model=32, num_layers=2, num_heads=4, d_ff=32,
                        max_len=16, num_experts=4, experts_per_token=2)


def test_moe_shapes_losses_and_grads():
  from lowprec.models.transformer import expert_capacity
  model = DecoderLM(MOE)
  params = _init(model)
  moe = params["block_0"]["moe"]
  chex.assert_shape((moe["w_in"], moe["w_out"], moe["router"]["kernel"]),
                    ((4, 32, 32), (4, 32, 32), (32, 4)))
  tokens = jax.random.randint(KEY, (2, 16), 0, 17)
  logits, state = model.apply({"params": params}, tokens, KEY,
                              mutable=["losses", "metrics"])
  chex.assert_shape(logits, (2, 16, 17))
  balance = jax.tree.leaves(state["losses"])
  assert len(balance) == MOE.num_layers
  # E * sum_e f_e P_e is 1 at uniform routing and at most E: check the scaled range.
  assert all(0 < float(b) < MOE.moe_balance_coef * MOE.num_experts for b in balance)
  assert expert_capacity(32, MOE) == 20  # ceil(1.25 * 32 * 2 / 4)

  def loss(p):
    out, st = model.apply({"params": p}, tokens, KEY, mutable=["losses", "metrics"])
    return next_token_loss(out, tokens)[0] + sum(jax.tree.leaves(st["losses"]))

  grads = jax.grad(loss)(params)
  for name in ("w_in", "w_out"):
    assert float(jnp.abs(grads["block_0"]["moe"][name]).sum()) > 0
  assert float(jnp.abs(grads["block_0"]["moe"]["router"]["kernel"]).sum()) > 0


def test_moe_matches_dense_expert_reference():
  """With capacity for every assignment, the MoE output is sum_k gate_k * expert_k(x)."""
  from lowprec.models.transformer import MoEFeedForward
  cfg = TransformerConfig(vocab_size=5, d_model=8, num_heads=2, d_ff=16, num_experts=4,
                          experts_per_token=2, moe_capacity_factor=4.0)
  layer = MoEFeedForward(cfg, fp32_dot_general, fp32_dot_general, 1.0)
  x = jax.random.normal(KEY, (10, 8))
  params = layer.init(KEY, x, KEY)["params"]
  out, state = layer.apply({"params": params}, x, KEY, mutable=["metrics"])
  assert float(jax.tree.leaves(state)[0]) == 0.0  # nothing dropped
  # Under jit too: 1 - mean(kept), which XLA:CPU contracted into an FMA, gave -1.5e-8.
  _, jitted = jax.jit(lambda p: layer.apply(p, x, KEY, mutable=["metrics"]))(
      {"params": params})
  assert float(jax.tree.leaves(jitted)[0]) == 0.0
  hi = lax.Precision.HIGHEST
  probs = jax.nn.softmax(jnp.dot(x, params["router"]["kernel"], precision=hi))
  top_p, top_e = lax.top_k(probs, 2)
  gates = top_p / top_p.sum(-1, keepdims=True)
  ref = np.zeros((10, 8), np.float32)
  for t in range(10):
    for j in range(2):
      e = int(top_e[t, j])
      h = jax.nn.gelu(jnp.dot(x[t], params["w_in"][e], precision=hi))
      ref[t] += float(gates[t, j]) * np.asarray(jnp.dot(h, params["w_out"][e], precision=hi))
  np.testing.assert_allclose(np.asarray(out), ref, rtol=2e-5, atol=2e-6)


def test_moe_drops_past_capacity():
  from lowprec.models.transformer import MoEFeedForward
  cfg = TransformerConfig(vocab_size=5, d_model=8, num_heads=2, d_ff=16, num_experts=4,
                          experts_per_token=1, moe_capacity_factor=0.25)
  layer = MoEFeedForward(cfg, fp32_dot_general, fp32_dot_general, 1.0)
  x = jax.random.normal(KEY, (16, 8))
  params = layer.init(KEY, x, KEY)["params"]
  _, state = layer.apply({"params": params}, x, KEY, mutable=["metrics"])
  # capacity 1 per expert: at most 4 of 16 assignments kept.
  assert float(jax.tree.leaves(state)[0]) >= 0.75


def test_moe_config_validation():
  with pytest.raises(ValueError, match="experts_per_token"):
    TransformerConfig(vocab_size=5, num_experts=2, experts_per_token=3)
  with pytest.raises(ValueError, match="num_experts"):
    TransformerConfig(vocab_size=5, num_experts=-1)
