"""Tests for models.transformer: shapes, causality, its one matmul and the keys it gets."""

import dataclasses
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from lowprec.models import quantization
from lowprec.models import transformer
from lowprec.models.transformer import DecoderLM, TransformerConfig, next_token_loss

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


def _recording_matmuls(monkeypatch, make=None):
  """Replaces the model's one matmul, ``transformer.fp32_dot_general``, by a recording
  wrapper (``make(original)`` builds a replacement instead); returns the calls list."""
  calls = []
  original = transformer.fp32_dot_general

  def recording(lhs, rhs, dn, key):
    calls.append((lhs.shape, rhs.shape, key))
    return original(lhs, rhs, dn, key)

  monkeypatch.setattr(transformer, "fp32_dot_general", make(original) if make else recording)
  return calls


def test_every_matmul_goes_through_fp32_dot_general(monkeypatch):
  model = DecoderLM(CFG)
  params = _init(model)
  calls = _recording_matmuls(monkeypatch)
  model.apply({"params": params}, jnp.zeros((2, 16), jnp.int32), KEY)
  # per block: qkv, scores, values, attn_out, ff_in, ff_out; plus the head
  assert len(calls) == 6 * CFG.num_layers + 1
  keys = [tuple(np.asarray(c[2]).ravel().tolist()) for c in calls]
  assert len(set(keys)) == len(keys), "every matmul must get its own key"
  # The model has no other matmul: with a matmul that zeroes everything the logits are
  # zero (the head is a matmul), so nothing bypasses it.
  _recording_matmuls(monkeypatch, lambda original: lambda lhs, rhs, dn, key: jnp.zeros_like(
      original(lhs, rhs, dn, key)))
  logits = model.apply({"params": params}, jnp.zeros((2, 16), jnp.int32), KEY)
  np.testing.assert_array_equal(logits, 0.0)


def test_keys_change_with_step_key(monkeypatch):
  model = DecoderLM(CFG)
  params = _init(model)
  seen = _recording_matmuls(monkeypatch)
  model.apply({"params": params}, jnp.zeros((1, 8), jnp.int32), jax.random.PRNGKey(1))
  first = [np.asarray(k) for _, _, k in seen]
  seen.clear()
  model.apply({"params": params}, jnp.zeros((1, 8), jnp.int32), jax.random.PRNGKey(2))
  assert len(seen) == len(first) == 6 * CFG.num_layers + 1
  assert all(not np.array_equal(a, np.asarray(b)) for a, (_, _, b) in zip(first, seen))


def test_a_bf16_rule_is_close_to_fp32_and_not_equal():
  params = _init(DecoderLM(CFG))
  tokens = jax.random.randint(KEY, (2, 16), 0, CFG.vocab_size)
  ref = DecoderLM(CFG).apply({"params": params}, tokens, KEY)
  low = quantization.quantize_model(DecoderLM(CFG), [quantization.Rule(".*", "bf16")]).apply(
      {"params": params}, tokens, KEY)
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


def test_each_matmul_issues_from_its_module_path():
  """The paths rules select by: projections in their Linear, the two attention
  products in the block itself, the head; every one a ``dot_general``."""
  model = quantization.quantize_model(DecoderLM(CFG), [quantization.Rule(".*", None)])
  tokens = jnp.zeros((1, 8), jnp.int32)
  params = jax.eval_shape(model.init, KEY, tokens, KEY)
  with quantization.recording() as records:
    jax.eval_shape(model.apply, params, tokens, KEY)
  expected = [p for i in range(CFG.num_layers) for p in (
      f"block_{i}/qkv", f"block_{i}", f"block_{i}", f"block_{i}/attn_out", f"block_{i}/ff_in",
      f"block_{i}/ff_out")] + ["head"]
  assert [r.path for r in records] == expected
  assert {r.kind for r in records} == {"dot_general"}


def _compensated_linear(rank=3, features=5, fan_in=8):
  """A rank-``rank`` compensated Linear with every parameter random (comp_v starts at
  zeros), and an input."""
  layer = transformer.Linear(features, rank=rank)
  x = jax.random.normal(jax.random.PRNGKey(1), (2, 4, fan_in))
  params = layer.init(KEY, x, KEY)["params"]
  assert set(params) == {"kernel", "comp_v", "comp_sigma", "comp_u"}
  np.testing.assert_array_equal(params["comp_v"], 0.0)
  np.testing.assert_array_equal(params["comp_sigma"], 1.0)
  chex.assert_shape((params["comp_v"], params["comp_u"]), [(fan_in, rank), (rank, features)])
  params = {k: jax.random.normal(jax.random.PRNGKey(i + 2), v.shape)
            for i, (k, v) in enumerate(sorted(params.items()))}
  return layer, params, x


def test_compensation_branch_computes_alto_formula():
  """y = x K + ((x V) * sigma) U (ALTO §3.8), against float64 NumPy."""
  layer, params, x = _compensated_linear()
  y = layer.apply({"params": params}, x, KEY)
  p = {k: np.asarray(v, np.float64) for k, v in params.items()}
  xf = np.asarray(x, np.float64)
  ref = xf @ p["kernel"] + ((xf @ p["comp_v"]) * p["comp_sigma"]) @ p["comp_u"]
  np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


def test_compensation_branch_runs_under_the_projection_rule():
  """All three GEMMs of a compensated projection follow its rule: under a bf16 rule
  each rounds its two operands to bf16 (ml_dtypes) and accumulates in float32."""
  import ml_dtypes  # pylint: disable=import-outside-toplevel
  layer, params, x = _compensated_linear()
  rules = [quantization.Rule(".*", "bf16")]
  with quantization.recording() as records:
    y = quantization.quantize_model(layer, rules).apply({"params": params}, x, KEY)
  assert [r.op_id for r in records] == ["dot_general_0", "dot_general_1", "dot_general_2"]
  assert all(r.rule is rules[0] for r in records)
  bf = lambda a: np.asarray(a, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)
  p = {k: np.asarray(v, np.float32) for k, v in params.items()}
  xv = (bf(x) @ bf(p["comp_v"])).astype(np.float32) * p["comp_sigma"]
  ref = bf(x) @ bf(p["kernel"]) + bf(xv) @ bf(p["comp_u"])
  np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
  full = layer.apply({"params": params}, x, KEY)
  assert not np.allclose(y, full, rtol=1e-5, atol=1e-5)  # the rule did round


def test_compensation_starts_at_zero_and_covers_the_block_projections():
  """ALTO's initialization (comp_v = 0) leaves the model's output unchanged, bit for
  bit; the branch sits on q/k/v, output and dense feed-forward projections only."""
  tokens = jax.random.randint(KEY, (2, 16), 0, CFG.vocab_size)
  compensated = DecoderLM(dataclasses.replace(CFG, compensation_rank=2))
  params = _init(compensated)
  plain = dict(params)
  for i in range(CFG.num_layers):
    plain[f"block_{i}"] = {m: {k: v for k, v in sub.items() if not k.startswith("comp_")}
                           if "kernel" in sub else sub
                           for m, sub in params[f"block_{i}"].items()}
    compensated_modules = sorted(m for m, sub in params[f"block_{i}"].items()
                                 if "comp_u" in sub)
    assert compensated_modules == ["attn_out", "ff_in", "ff_out", "qkv"]
  assert "comp_u" not in params["head"]
  np.testing.assert_array_equal(
      compensated.apply({"params": params}, tokens, KEY),
      DecoderLM(CFG).apply({"params": plain}, tokens, KEY))
  with pytest.raises(ValueError, match="compensation_rank must be >= 0"):
    TransformerConfig(vocab_size=5, compensation_rank=-1)


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
  layer = MoEFeedForward(cfg, 1.0)
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
  layer = MoEFeedForward(cfg, 1.0)
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
