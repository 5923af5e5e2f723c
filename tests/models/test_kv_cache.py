"""models.kv_cache and sampling.sample_cached: cached decoding against full recomputation."""

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from experiments.common.trainers.recipe_flag import quantized_model
from lowprec.models import kv_cache, sampling
from lowprec.models.transformer import DecoderLM, TransformerConfig
from lowprec.numerics import kv_quant
from lowprec.numerics.kv_quant import KVQuantSpec
from tests.numerics import mx_reference

CFG = TransformerConfig(vocab_size=13, d_model=32, num_layers=2, num_heads=2, d_ff=32,
                        max_len=12)
B, P, N = 3, 4, 5
KEY = jax.random.key(0)
PROC = dict(temperature=0.9, top_k=8)


@functools.lru_cache(maxsize=None)
def _model(recipe):
  return quantized_model(DecoderLM(CFG), recipe)


@functools.lru_cache(maxsize=None)
def _params():
  model = _model("fp32")
  return jax.jit(model.init)(KEY, jnp.zeros((1, 8), jnp.int32), KEY)["params"]


def _prompts():
  return jax.random.randint(jax.random.key(1), (B, P), 0, CFG.vocab_size)


def _step_by_step_logits(cm, params, tokens, key, cache):
  """Logits of every position: a prefill of P tokens, then one token per call."""
  prefill, cache = cm.apply(params, tokens[:, :P], cache, key)

  def step(cache, token_B):
    logits, cache = cm.apply(params, token_B[:, None], cache, key)
    return cache, logits[:, 0]

  cache, rest_NxBxV = jax.lax.scan(step, cache, tokens[:, P:].T)
  return jnp.concatenate([prefill, rest_NxBxV.transpose(1, 0, 2)], axis=1), cache


def _tokens():
  return jax.random.randint(jax.random.key(2), (B, P + N), 0, CFG.vocab_size)


def _logits_both(recipe):
  """(full-sequence logits, prefill-then-one-token logits) of the same tokens."""
  model, params, tokens = _model(recipe), _params(), _tokens()
  cm = kv_cache.cached_lm(model)
  full = jax.jit(lambda p, t: model.apply({"params": p}, t, KEY))(params, tokens)
  step, _ = jax.jit(lambda p, t: _step_by_step_logits(
      cm, p, t, KEY, cm.init_cache(B, P + N)))(params, tokens)
  return full, step


def test_bf16_cached_sampling_is_bit_exact_and_replays_exactly():
  # bf16-input GEMMs give each row the same bits whatever the row count on XLA:CPU,
  # so the cache changes nothing. Each call compiled on its own.
  model, params, prompts = _model("bf16"), _params(), _prompts()
  apply = lambda p, t, k: model.apply({"params": p}, t, k)
  cm = kv_cache.cached_lm(model)
  key = jax.random.key(3)
  full = jax.jit(lambda p: sampling.sample(apply, p, prompts, N, key, **PROC))(params)
  cached = jax.jit(lambda p: sampling.sample_cached(cm, p, prompts, N, key, **PROC))(params)
  np.testing.assert_array_equal(cached.tokens, full.tokens)
  np.testing.assert_array_equal(cached.logp, full.logp)
  assert np.all(np.isfinite(cached.logp))
  # The teacher-forced replay of the cached decoding: same calls, same shapes.
  replay = jax.jit(lambda p, t: sampling.cached_sequence_log_probs(
      cm, p, t, P, key, **PROC))(params, cached.tokens)
  np.testing.assert_array_equal(replay, cached.logp)


def test_mxfp8_recipe_cached_logits_are_bit_exact():
  # The recipe quantizes activations in 32-element blocks along d_model, per row,
  # and multiplies in bf16: the cached path sees the same bits.
  full, step = _logits_both("mxfp8")
  np.testing.assert_array_equal(step, full)


def test_fp32_cached_logits_within_a_bound():
  # An fp32 GEMM's summation order depends on its row count on XLA:CPU (a 1-row
  # projection is not bit-equal to the same row in a 9-row one), so the cached and
  # full paths differ in the last bits: measured max |dlogit| ~6e-7 on logits of ~3.
  full, step = _logits_both("fp32")
  np.testing.assert_allclose(step, full, rtol=0, atol=1e-5)
  assert np.all(np.isfinite(step))


SPECS = (KVQuantSpec(), KVQuantSpec("e4m3", "token"), KVQuantSpec("bf16"),
         KVQuantSpec("nvfp4", "block"))


def _prefilled_layer0_keys():
  tokens = _tokens()

  def run(p):
    out = []
    for spec in SPECS:
      cm = kv_cache.cached_lm(_model("fp32"), spec)
      cache = cm.apply(p, tokens, cm.init_cache(B, P + N), KEY)[1]
      out.append(kv_quant.read(cache.keys[0]))
    return out

  return [np.asarray(k) for k in jax.jit(run)(_params())]


def test_quantized_cache_stores_the_rounded_keys():
  # Layer 0's keys come from the embeddings alone, so a quantized cache must hold
  # exactly the rounding of the fp32 cache's layer-0 keys.
  keys = _prefilled_layer0_keys()
  exact = keys[0]
  for spec, got in zip(SPECS[1:], keys[1:]):
    if spec.fmt == "bf16":
      want = exact.astype(ml_dtypes.bfloat16).astype(np.float32)
    elif spec.fmt == "e4m3":
      s = np.max(np.abs(exact), -1, keepdims=True) * (np.float32(1) / np.float32(448))
      q = np.clip(exact * (np.float32(1) / s), -448, 448).astype(ml_dtypes.float8_e4m3fn)
      want = q.astype(np.float32) * s
    else:
      want = np.stack([np.stack([
          mx_reference.quantize_dequantize_nvfp4(exact[b, :, t])[0]
          for t in range(exact.shape[2])], 1) for b in range(B)])
    np.testing.assert_array_equal(got, want, err_msg=spec.fmt)
    assert not np.array_equal(got, exact)


def test_calibrated_scales_match_a_numpy_forward():
  tokens = _tokens()
  params = jax.tree.map(np.asarray, _params())
  ks, vs = jax.jit(lambda p, t: kv_cache.calibrate_scales(
      _model("fp32"), p, t, KEY, KVQuantSpec("e4m3", "head")))(_params(), tokens)
  assert len(ks) == len(vs) == CFG.num_layers
  # Layer 0 by hand: embeddings, RMSNorm (flax eps 1e-6), the qkv projection.
  x = params["embed"]["embedding"][np.asarray(tokens)] + params["pos_embed"][:P + N]
  b0 = params["block_0"]
  y = x / np.sqrt(np.mean(x.astype(np.float64) ** 2, -1, keepdims=True) + 1e-6)
  y = y * b0["attn_norm"]["scale"]
  qkv = (y @ b0["qkv"]["kernel"]).reshape(B, P + N, 3, CFG.num_heads, -1)
  for which, got in ((1, ks[0]), (2, vs[0])):
    amax = np.max(np.abs(qkv[:, :, which]), axis=(0, 1, 3))
    np.testing.assert_allclose(got, amax / 448.0, rtol=1e-5)


def test_bytes_per_token_by_hand():
  # 2 layers, keys and values, H*K = 32 elements each.
  assert kv_cache.bytes_per_token(CFG) == 2 * 2 * 32 * 4
  assert kv_cache.bytes_per_token(CFG, KVQuantSpec("bf16"), KVQuantSpec("e4m3", "token")
                                  ) == 2 * (32 * 2 + 32 + 2 * 4)
  assert kv_cache.bytes_per_token(CFG, KVQuantSpec("nvfp4", "block")) == \
      2 * 2 * (32 // 2 + 32 // 16 + 4)
  assert kv_cache.bytes_per_token(CFG, KVQuantSpec("int8", "head")) == 2 * 2 * 32


def test_overflowing_the_cache_poisons_the_logits():
  cm = kv_cache.cached_lm(_model("fp32"))

  def run(p):
    logits_a, cache = cm.apply(p, jnp.zeros((1, 3), jnp.int32), cm.init_cache(1, 4), KEY)
    logits_b, cache = cm.apply(p, jnp.zeros((1, 1), jnp.int32), cache, KEY)
    logits_c, _ = cm.apply(p, jnp.zeros((1, 1), jnp.int32), cache, KEY)
    return logits_a, logits_b, logits_c

  a, b, c = jax.jit(run)(_params())
  assert np.isfinite(a).all() and np.isfinite(b).all() and np.isnan(c).all()


def test_validation():
  model = _model("fp32")
  with pytest.raises(ValueError, match="dense feed-forward"):
    kv_cache.cached_lm(DecoderLM(TransformerConfig(vocab_size=5, d_model=8, num_heads=2,
                                                   num_layers=1, num_experts=2)))
  with pytest.raises(ValueError, match="max_len"):
    kv_cache.init_cache(CFG, 1, CFG.max_len + 1)
  wrong = kv_cache.init_cache(TransformerConfig(vocab_size=13, d_model=32, num_heads=4,
                                                num_layers=2, max_len=16), 1, 4)
  with pytest.raises(ValueError, match="does not fit"):
    model.apply({"params": _params()}, jnp.zeros((1, 2), jnp.int32), KEY, cache=wrong)
  with pytest.raises(ValueError, match="do not fit"):
    model.apply({"params": _params()}, jnp.zeros((1, 5), jnp.int32), KEY,
                cache=kv_cache.init_cache(CFG, 1, 4))
  with pytest.raises(ValueError, match="granularity"):
    kv_cache.calibrate_scales(model, _params(), jnp.zeros((1, 4), jnp.int32), KEY,
                              KVQuantSpec("e4m3", "token"))
  with pytest.raises(ValueError, match="num_new"):
    sampling.sample_cached(kv_cache.cached_lm(model), _params(),
                           jnp.zeros((1, 2), jnp.int32), 0, KEY)
