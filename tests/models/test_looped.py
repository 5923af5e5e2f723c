"""models.looped: the loop and exit rule by hand; replay == rollout bit for bit, with
the dense path's gradient bit for bit; the dense-vs-deferred mismatch measured."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.common.trainers.recipe_flag import looped_rules
from lowprec.models import quantization
from lowprec.models import looped
from lowprec.models.transformer import Block, TransformerConfig
from lowprec.numerics.kv_quant import KVQuantSpec

CFG = TransformerConfig(vocab_size=11, d_model=16, num_layers=1, num_heads=2, d_ff=32,
                        max_len=9)
R, THRESHOLD = 2, 0.6
B, P, N = 4, 3, 5
KEY = jax.random.key(0)
ROLLOUT_KEY = jax.random.key(3)
PROC = dict(temperature=0.9)
# The two settings of the replay test: fp32 with an fp32 cache, and bf16 GEMMs with a
# per-token e4m3 cache (the rollout engine's quantized cache the dense pass lacks).
SETTINGS = {"fp32": ("fp32", KVQuantSpec()),
            "bf16-e4m3cache": ("bf16", KVQuantSpec("e4m3", "token"))}


def _model(recipe, halting="threshold"):
  loop = looped.LoopConfig(R, halting, THRESHOLD if halting == "threshold" else None)
  return quantization.quantize_model(looped.LoopedLM(CFG, loop), looped_rules(recipe))


@functools.lru_cache(maxsize=None)
def _params():
  return jax.jit(_model("fp32").init)(KEY, jnp.zeros((1, 4), jnp.int32), KEY)["params"]


@functools.lru_cache(maxsize=None)
def _run(setting):
  """Rollout; then, each compiled on its own, the learner's hybrid log-probs with
  their gradient and the dense log-probs with theirs."""
  recipe, spec = SETTINGS[setting]
  model, params = _model(recipe), _params()
  prompts = jax.random.randint(jax.random.key(1), (B, P), 0, CFG.vocab_size)
  ro = jax.jit(lambda p: looped.rollout(model, p, prompts, N, ROLLOUT_KEY, key_spec=spec,
                                        **PROC))(params)
  weights = jax.random.normal(jax.random.key(2), ro.logp.shape)

  def hybrid_loss(p, depth):
    logp = looped.replay_log_probs(model, p, ro.tokens, P, depth, ROLLOUT_KEY, KEY,
                                   key_spec=spec, **PROC)
    return jnp.sum(weights * logp), logp

  def dense_loss(p):
    logp = looped.dense_log_probs(model, p, ro.tokens, P, ro.depth, KEY, **PROC)
    return jnp.sum(weights * logp), logp

  hybrid_fn = jax.jit(jax.value_and_grad(hybrid_loss, has_aux=True))
  (_, hybrid), hybrid_grad = hybrid_fn(params, ro.depth)
  (_, dense), dense_grad = jax.jit(jax.value_and_grad(dense_loss, has_aux=True))(params)
  return ro, hybrid, hybrid_grad, dense, dense_grad, hybrid_fn


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_replay_equals_the_rollout_bit_for_bit_with_the_dense_gradient(setting):
  ro, hybrid, hybrid_grad, dense, dense_grad, hybrid_fn = _run(setting)
  np.testing.assert_array_equal(hybrid, ro.logp)
  jax.tree.map(np.testing.assert_array_equal, hybrid_grad, dense_grad)
  assert any(np.any(g != 0) for g in jax.tree.leaves(dense_grad))
  # The rollout used several depths, so the schedule matters.
  fed = np.asarray(ro.depth[:, :-1])
  assert fed.min() >= 1 and fed.max() <= R and len(np.unique(fed)) >= 2
  np.testing.assert_array_equal(ro.depth[:, -1], 0)  # the last token is never fed
  # Replayed at depth R everywhere instead of the recorded depths, the deferred value
  # (which the hybrid returns) is no longer the rollout's.
  (_, other), _ = hybrid_fn(_params(), jnp.full_like(ro.depth, R))
  assert not np.array_equal(other, ro.logp)
  # The dense-vs-deferred mismatch the replay removes. fp32: only GEMM row counts and
  # log-softmax shapes differ (measured 2.4e-7 on XLA:CPU). A per-token e4m3 cache in
  # the rollout: a real mismatch (measured 0.025; bf16 GEMMs with an fp32 cache give
  # exactly 0 on XLA:CPU).
  gap = np.max(np.abs(np.asarray(dense) - np.asarray(ro.logp)))
  if setting == "fp32":
    assert gap <= 1e-5
  else:
    assert gap > 1e-3


def _by_hand(params, tokens, depth_BxL):
  """The loop from its definition: Block applied R times, position t updated while
  r < depth[t]; the shared block's own params; final norm and head by hand."""
  block = Block(CFG, (2.0 * CFG.num_layers * R) ** -0.5)
  h = params["embed"]["embedding"][tokens] + params["pos_embed"][:tokens.shape[1]]
  for r in range(R):
    new = block.apply({"params": params["block_0"]}, h, jax.random.fold_in(KEY, r))
    h = jnp.where((r < depth_BxL)[..., None], new, h)
  h = h * jax.lax.rsqrt(jnp.mean(h * h, -1, keepdims=True) + 1e-6)
  h = h * params["final_norm"]["scale"]
  return h @ params["head"]["kernel"]


def test_dense_pass_with_forced_depths_is_the_masked_loop():
  tokens = jax.random.randint(jax.random.key(5), (2, 7), 0, CFG.vocab_size)
  depth = jax.random.randint(jax.random.key(6), (2, 7), 1, R + 1)
  model = _model("fp32")
  got, used = jax.jit(lambda p, t, d: model.apply({"params": p}, t, KEY, depth_BxL=d))(
      _params(), tokens, depth)
  np.testing.assert_array_equal(used, depth)
  want = jax.jit(_by_hand)(_params(), tokens, depth)
  np.testing.assert_allclose(got, want, rtol=0, atol=2e-6)
  # The fixed rule is the forced depth R everywhere.
  fixed, used = jax.jit(lambda p, t: _model("fp32", "fixed").apply({"params": p}, t, KEY))(
      _params(), tokens)
  np.testing.assert_array_equal(used, R)
  np.testing.assert_allclose(fixed, jax.jit(_by_hand)(_params(), tokens,
                                                      jnp.full_like(depth, R)),
                             rtol=0, atol=2e-6)


def test_exit_rule_by_hand_and_causality():
  run = jax.jit(lambda p, t: _model("fp32").apply({"params": p}, t, KEY,
                                                  mutable=["intermediates"]))
  tokens = jax.random.randint(jax.random.key(7), (1, 8), 0, CFG.vocab_size)
  (logits, depth), state = run(_params(), tokens)
  lam = np.stack([np.asarray(x) for x in state["intermediates"]["exit_probability"]])
  survive = np.ones(lam.shape[1:], np.float32)
  want = np.full(lam.shape[1:], R)
  done = np.zeros(lam.shape[1:], bool)
  for r in range(R):
    survive = (survive * (np.float32(1) - lam[r])).astype(np.float32)
    exit_now = ~done & (np.float32(1) - survive >= np.float32(THRESHOLD))
    want[exit_now] = r + 1
    done |= exit_now
  np.testing.assert_array_equal(depth, want)
  assert len(np.unique(want)) >= 2
  # Causal, exit decisions included: changing token 5 changes nothing before it.
  other = tokens.at[0, 5].set((tokens[0, 5] + 1) % CFG.vocab_size)
  (logits_b, depth_b), _ = run(_params(), other)
  np.testing.assert_array_equal(logits[0, :5], logits_b[0, :5])
  np.testing.assert_array_equal(depth[0, :5], depth_b[0, :5])
  assert not np.allclose(logits[0, 5:], logits_b[0, 5:])


def test_hybrid_value_is_exact_where_the_naive_order_is_not():
  replay, dense = jnp.float32(1.0), jnp.float32(1e8)
  value, grad = jax.value_and_grad(lambda d: looped.hybrid(replay, d))(dense)
  assert value == 1.0 and grad == 1.0
  naive = jax.lax.stop_gradient(replay) + dense - jax.lax.stop_gradient(dense)
  assert naive != 1.0  # (1 + 1e8) - 1e8 == 0 in float32


def test_validation():
  with pytest.raises(ValueError, match="max_loops"):
    looped.LoopConfig(0)
  with pytest.raises(ValueError, match="halting"):
    looped.LoopConfig(2, "act")
  with pytest.raises(ValueError, match="threshold"):
    looped.LoopConfig(2, "threshold")
  with pytest.raises(ValueError, match="threshold"):
    looped.LoopConfig(2, "fixed", 0.5)
  model, tokens = _model("fp32"), jnp.zeros((1, 4), jnp.int32)
  with pytest.raises(ValueError, match=r"\[0, max_loops"):
    model.apply({"params": _params()}, tokens, KEY, depth_BxL=jnp.full((1, 4), R + 1))
  with pytest.raises(ValueError, match="depth must be"):
    model.apply({"params": _params()}, tokens, KEY, depth_BxL=jnp.ones((1, 3), jnp.int32))
  with pytest.raises(ValueError, match="not both"):
    model.apply({"params": _params()}, tokens, KEY, depth_BxL=jnp.ones((1, 4), jnp.int32),
                cache=looped.init_cache(model, 1, 4))
  with pytest.raises(ValueError, match="num_experts"):
    looped.LoopedLM(TransformerConfig(vocab_size=5, d_model=8, num_heads=2, num_experts=2)
                    ).init(KEY, tokens, KEY)
