"""models.lora: adapters on an unmodified DecoderLM over a frozen (quantized) base.

References: the base model itself (fp32, and run on the dequantized weights), hand
byte counts of NF4 storage, autodiff with respect to the frozen base.
"""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lowprec import models
from lowprec.models import lora
from lowprec.models.transformer import DecoderLM, TransformerConfig, next_token_loss
from lowprec.numerics import memory
from lowprec.numerics.quantizer import QuantSpec
from lowprec.numerics.rounding import Stochastic

CFG = TransformerConfig(vocab_size=32, d_model=64, num_layers=1, num_heads=4, d_ff=128,
                        max_len=8)
MODEL = DecoderLM(CFG)
KEY = jax.random.PRNGKey(0)
TOKENS = jax.random.randint(jax.random.PRNGKey(1), (2, 8), 0, CFG.vocab_size)
PARAMS = jax.jit(MODEL.init)(KEY, TOKENS, KEY)["params"]
BASE_LOGITS = jax.jit(lambda p, t: MODEL.apply({"params": p}, t, KEY))


def _lora_logits(config):
  return jax.jit(lambda b, a, t: lora.apply(MODEL, b, a, t, KEY, config))


@functools.lru_cache(maxsize=None)
def _setup_cached(config):
  base = jax.jit(lambda p: lora.freeze_base(p, config))(PARAMS)
  adapters = jax.jit(lambda k, b: lora.init_adapters(k, b, config))(
      jax.random.PRNGKey(2), base)
  return config, base, adapters


def _setup(**kw):
  return _setup_cached(lora.LoRAConfig(rank=4, **kw))


def test_targets():
  config = lora.LoRAConfig()
  paths = lora.target_paths(PARAMS, config)
  assert paths == ("block_0/attn_out", "block_0/ff_in", "block_0/ff_out", "block_0/qkv")
  assert lora.target_paths(PARAMS, lora.LoRAConfig(targets=("block_0/ff_*",))) == (
      "block_0/ff_in", "block_0/ff_out")
  assert lora.target_paths(PARAMS, lora.LoRAConfig(targets=("head",))) == ("head",)
  with pytest.raises(ValueError, match="matches no Linear kernel"):
    lora.target_paths(PARAMS, lora.LoRAConfig(targets=("w_in",)))
  with pytest.raises(ValueError, match="2-D"):
    lora.target_paths({"moe": {"kernel": jnp.zeros((2, 3, 4))}},
                      lora.LoRAConfig(targets=("moe",)))
  compensated = {"qkv": {"kernel": jnp.zeros((4, 6)), "comp_v": jnp.zeros((4, 1)),
                         "comp_sigma": jnp.ones(1), "comp_u": jnp.zeros((1, 6))}}
  with pytest.raises(ValueError, match="'qkv' has a low-rank compensation branch"):
    lora.target_paths(compensated, lora.LoRAConfig(targets=("qkv",)))


def test_config_errors():
  with pytest.raises(ValueError, match="rank"):
    lora.LoRAConfig(rank=0)
  with pytest.raises(ValueError, match="base_format"):
    lora.LoRAConfig(base_format="int4")
  with pytest.raises(ValueError, match="stochastic"):
    lora.LoRAConfig(base_format=QuantSpec("e4m3", 32, axis=0, rounding=Stochastic()))
  with pytest.raises(ValueError, match="'nf4' only"):
    lora.LoRAConfig(base_format="bf16", double_quant=False)
  with pytest.raises(ValueError, match="dequantize"):
    lora.LoRAConfig(dequantize="never")
  with pytest.raises(TypeError):
    lora.LoRAConfig(targets="qkv")


def test_zero_b_equals_the_fp32_base_model_bit_for_bit():
  config, base, adapters = _setup(base_format="fp32")
  assert "kernel" not in base.params["block_0"].get("qkv", {})
  np.testing.assert_array_equal(_lora_logits(config)(base, adapters, TOKENS),
                                BASE_LOGITS(PARAMS, TOKENS))


@pytest.mark.parametrize("base_format,mode", [
    ("nf4", "per_gemm"), (QuantSpec("int8", block_shape=32, axis=0), "materialize")])
def test_quantized_base_equals_base_model_on_dequantized_weights(base_format, mode):
  config, base, adapters = _setup(base_format=base_format, dequantize=mode)
  dequantized = jax.jit(lambda b, a: lora.merged_params(b, a, config))(base, adapters)
  # (B = 0: the merged kernel is the dequantized W itself.)
  got = _lora_logits(config)(base, adapters, TOKENS)
  np.testing.assert_array_equal(got, BASE_LOGITS(dequantized, TOKENS))
  assert not np.array_equal(got, BASE_LOGITS(PARAMS, TOKENS))  # it is quantized


def test_frozen_nf4_base_bytes_by_hand():
  _, base, adapters = _setup(base_format="nf4")
  # Per [in, out] kernel: in*out/2 code bytes, one uint8 scale per 64 rows of a
  # column, one float32 per 256 scales, a float32 offset.
  def nf4_bytes(n_in, n_out):
    scales = n_in // 64 * n_out
    return n_in * n_out // 2 + scales + 4 * -(-scales // 256) + 4
  per_block = (nf4_bytes(64, 192) + nf4_bytes(64, 64) + nf4_bytes(64, 128)
               + nf4_bytes(128, 64))
  assert memory.tree_bytes(base.kernels) == per_block
  assert lora.adapter_count(adapters) == 4 * ((64 + 192) + (64 + 64) + (64 + 128)
                                              + (128 + 64))
  a = adapters["block_0/ff_out"].a
  # std of 512 N(0, 1/128) draws: relative standard error 3.1%, so the 20% band is
  # 6.4 sigma (false-failure probability ~1e-10; the key is fixed, so it never flakes).
  assert a.shape == (128, 4) and 0.8 < float(jnp.std(a)) * 128 ** 0.5 < 1.2
  assert np.all(np.asarray(adapters["block_0/ff_out"].b) == 0)
  assert not np.array_equal(np.asarray(adapters["block_0/ff_in"].a[:64]),
                            np.asarray(a[:64]))


def _loss(adapters, base, config):
  logits = lora.apply(MODEL, base, adapters, TOKENS[:, :-1], KEY, config)
  return next_token_loss(logits, TOKENS[:, 1:])[0]


def test_gradients_reach_only_the_adapters():
  config, base, adapters = _setup(base_format="fp32")
  grad = jax.jit(jax.grad(_loss, argnums=(0, 1)), static_argnums=2)
  g_ad, g_base = grad(adapters, base, config)
  for leaf in jax.tree.leaves(g_base):
    assert np.all(np.asarray(leaf) == 0)
  for ad in g_ad.values():  # B = 0: A gets no gradient yet, B does
    assert np.all(np.asarray(ad.a) == 0) and np.any(np.asarray(ad.b) != 0)
  # Once B moves, A trains too.
  moved = {k: v._replace(b=v.b - 0.1 * g_ad[k].b) for k, v in adapters.items()}
  for g in grad(moved, base, config)[0].values():
    assert np.any(np.asarray(g.a) != 0)


def test_a_rule_quantized_model_quantizes_the_base_gemms_not_the_adapter_products():
  """LoRA on ``quantize_model(DecoderLM, [Rule(".*", "bf16")])`` equals LoRA on the
  same model under a bf16 rule for ``dot_general`` ops only (the kind of every one of
  DecoderLM's own GEMMs, not of the adapters' ``jnp.matmul``), value and adapter
  gradients bit for bit: the adapter products are float32 at HIGHEST in both. Before:
  the first rule also caught the adapters' two matmuls (kind ``matmul``) and ran them in
  bf16."""
  config, base, adapters = _setup()
  adapters = jax.tree.map(lambda a: a + 0.01, adapters)  # B = 0 hides the products

  def value_and_grad(rule):
    model = models.quantize_model(MODEL, [rule])
    loss = lambda a: jnp.sum(lora.apply(model, base, a, TOKENS, KEY, config) ** 2)
    return jax.jit(jax.value_and_grad(loss))(adapters)

  chex.assert_trees_all_equal(value_and_grad(models.Rule(".*", "bf16")),
                              value_and_grad(models.Rule(".*", "bf16", ops="dot_general")))
