"""Every contraction of a model written from stock Flax layers is accounted for.

A small linen ViT (nn.Conv patch embedding, nn.MultiHeadDotProductAttention, a module
computing ``x @ w``, one calling ``jnp.einsum``, one calling ``jnp.dot``) and its NNX
twin: under ``Rule(".*", None)`` the recording lists exactly as many ops as the plain
model's jaxpr has ``dot_general`` and ``conv_general_dilated`` equations; under an mxfp8
rule every one is quantized, and outputs and gradients equal the same model with
numerics.qdot / numerics.qconv injected by hand.
"""

import functools
import warnings

import chex
from flax import linen as nn
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lowprec import models
from lowprec.models import quantization
from lowprec.numerics import qconv, qdot
from tests.models.nnx_calls import jitted_call

RECIPE = "mxfp8"
_DN = (((1,), (0,)), ((), ()))  # x (tokens, d) . w (d, f) after flattening


def _count_contractions(jaxpr) -> int:
  """dot_general and conv_general_dilated equations in ``jaxpr`` and its sub-jaxprs."""
  n = 0
  for eqn in jaxpr.eqns:
    if eqn.primitive.name in ("dot_general", "conv_general_dilated"):
      n += 1
    for value in eqn.params.values():
      subs = value if isinstance(value, (tuple, list)) else (value,)
      for sub in subs:
        inner = getattr(sub, "jaxpr", sub)
        if hasattr(inner, "eqns"):
          n += _count_contractions(inner)
  return n


class MatmulMLP(nn.Module):
  """``x @ w`` (and ``jnp.dot``) on parameters it declares itself; ``qdg`` computes the
  same products through a quantized dot_general (the hand-built reference)."""

  qdg: object = None

  @nn.compact
  def __call__(self, x):
    w1 = self.param("w1", nn.initializers.lecun_normal(), (x.shape[-1], 32))
    w2 = self.param("w2", nn.initializers.lecun_normal(), (32, x.shape[-1]))
    if self.qdg is None:
      return jnp.dot(nn.gelu(x @ w1), w2)
    dn = (((x.ndim - 1,), (0,)), ((), ()))
    return self.qdg(nn.gelu(self.qdg(x, w1, dn)), w2, dn)


class EinsumMix(nn.Module):
  qdg: object = None

  @nn.compact
  def __call__(self, x):
    w = self.param("w", nn.initializers.lecun_normal(), (x.shape[-1], x.shape[-1]))
    if self.qdg is None:
      return jnp.einsum("btd,de->bte", x, w)
    return jnp.einsum("btd,de->bte", x, w, _dot_general=self.qdg)


class ViT(nn.Module):
  """A small ViT from stock linen layers; ``qdg``/``qconv`` inject by hand."""

  qdg: object = None
  qconv: object = None

  @nn.compact
  def __call__(self, img_BxHxWxC):
    inj = {} if self.qdg is None else dict(dot_general=self.qdg)
    conv = {} if self.qconv is None else dict(conv_general_dilated=self.qconv)
    x = nn.Conv(32, (4, 4), strides=(4, 4), name="patch", **conv)(img_BxHxWxC)
    x = x.reshape(x.shape[0], -1, x.shape[-1])
    mha = {}
    if self.qdg is not None:
      einsum = lambda: functools.partial(jnp.einsum, _dot_general=self.qdg)
      mha = dict(qkv_dot_general=self.qdg, out_dot_general=self.qdg,
                 qk_attn_weights_einsum_cls=einsum, attn_weights_value_einsum_cls=einsum)
    x = x + nn.MultiHeadDotProductAttention(2, name="attn", **mha)(x, x)
    x = x + MatmulMLP(self.qdg, name="mlp")(x)
    x = EinsumMix(self.qdg, name="mix")(x)
    return nn.Dense(10, name="head", **inj)(x.mean(axis=1))


def _img(seed=0):
  return jax.random.normal(jax.random.key(seed), (2, 16, 16, 3))


@pytest.fixture(scope="module")
def vit_params():
  return jax.jit(ViT().init)(jax.random.key(1), _img())


def _loss_and_grads(model, params, img):
  f = lambda p, x: jnp.sum(model.apply(p, x) ** 2)
  return jax.jit(jax.value_and_grad(f, argnums=(0, 1)))(params, img)


def test_linen_every_contraction_is_recorded_with_its_kind(vit_params):
  plain = ViT()
  n_plain = _count_contractions(jax.make_jaxpr(plain.apply)(vit_params, _img()).jaxpr)
  ours = models.quantize_model(plain, [models.Rule(".*", None)])
  with quantization.recording() as ops:
    out = jax.jit(lambda p, x: ours.apply(p, x))(vit_params, _img())
  chex.assert_trees_all_equal(out, jax.jit(plain.apply)(vit_params, _img()))
  # conv, q/k/v/out, 2 attention products, 2 in the MLP (@ and dot), the einsum, head
  assert len(ops) == n_plain == 1 + 4 + 2 + 2 + 1 + 1
  kinds = {(op.path, op.op_id): op.kind for op in ops}
  assert kinds[("patch", "conv_0")] == "conv"
  assert kinds[("mlp", "matmul_0")] == "matmul" and kinds[("mlp", "dot_0")] == "matmul"
  assert kinds[("mix", "einsum_0")] == "einsum"
  assert kinds[("attn", "einsum_0")] == kinds[("attn", "einsum_1")] == "attention"
  assert all(op.reason == "as written: rules[0] '.*' keeps it" for op in ops)
  assert "| patch | conv_0 | conv |" in quantization.plan(ops)


def test_linen_mxfp8_equals_qdot_and_qconv_injected_by_hand(vit_params):
  img = _img()
  ours = models.quantize_model(ViT(), [models.Rule(".*", RECIPE)])
  by_hand = ViT(qdg=qdot.make_dot_general(RECIPE),
                qconv=functools.partial(qconv.quantized_conv_general_dilated,
                                        recipe=RECIPE))
  with quantization.recording() as ops:
    got = _loss_and_grads(ours, vit_params, img)
  assert all(op.reason == f"{RECIPE}: rules[0] '.*'" for op in ops) and len(ops) == 11
  chex.assert_trees_all_equal(got, _loss_and_grads(by_hand, vit_params, img))
  # and it is not the plain model
  assert not np.array_equal(got[0], _loss_and_grads(ViT(), vit_params, img)[0])


def test_projections_only_keeps_attention_products_and_head_in_bf16(vit_params):
  rules = quantization.projections_only(RECIPE)
  ours = models.quantize_model(ViT(), rules)
  with quantization.recording() as ops:
    jax.eval_shape(ours.apply, vit_params, _img())
  by_op = {(op.path, op.op_id): op for op in ops}
  assert by_op[("head", "dot_general_0")].rule is rules[0]
  assert by_op[("attn", "einsum_0")].rule is rules[1]
  assert by_op[("attn", "einsum_1")].reason == "bf16: rules[1] '.*' (ops: attention)"
  assert {op.rule.recipe_name for op in ops
          if op.path not in ("head", "attn")} == {RECIPE}
  assert by_op[("attn/query", "dot_general_0")].rule is rules[2]


def test_a_rule_that_matches_nothing_warns_raises_or_passes(vit_params):
  rules = [models.Rule("heda", "bf16"), models.Rule(".*", RECIPE)]
  with pytest.warns(UserWarning, match="'heda'.*matched no op"):
    jax.eval_shape(models.quantize_model(ViT(), rules).apply, vit_params, _img())
  with pytest.raises(ValueError, match="'heda'.*matched no op"):
    jax.eval_shape(models.quantize_model(ViT(), rules, unused_rules="raise").apply,
                   vit_params, _img())
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    jax.eval_shape(models.quantize_model(ViT(), rules, unused_rules="ignore").apply,
                   vit_params, _img())
  with pytest.raises(ValueError, match="unused_rules must be one of"):
    models.quantize_model(ViT(), rules, unused_rules="quiet")


class Grouped(nn.Module):

  @nn.compact
  def __call__(self, x):
    return nn.Conv(4, (3, 3), feature_group_count=2, name="dw")(x)


def test_a_grouped_conv_under_a_quantizing_rule_raises_naming_the_module():
  x = jnp.ones((1, 8, 8, 4))
  p = Grouped().init(jax.random.key(0), x)
  with pytest.raises(ValueError, match=r"dw/conv_0: a grouped convolution.*recipe=None"):
    models.quantize_model(Grouped(), [models.Rule(".*", RECIPE)]).apply(p, x)
  kept = models.quantize_model(Grouped(), [models.Rule("dw", None),
                                           models.Rule(".*", RECIPE)])
  with pytest.warns(UserWarning, match=r"Rule\('\.\*'"):  # nothing else to quantize
    chex.assert_trees_all_equal(kept.apply(p, x), Grouped().apply(p, x))


class NNXViT(nnx.Module):
  """The NNX twin: nnx.Conv, nnx.MultiHeadAttention (jax.nn's fused attention), ``@``."""

  def __init__(self, rngs):
    self.patch = nnx.Conv(3, 32, (4, 4), strides=(4, 4), rngs=rngs)
    self.attn = nnx.MultiHeadAttention(2, 32, decode=False, rngs=rngs)
    self.w = nnx.Param(jax.random.normal(rngs.params(), (32, 32)) / 6.0)
    self.head = nnx.Linear(32, 10, rngs=rngs)

  def __call__(self, img):
    x = self.patch(img)
    x = x.reshape(x.shape[0], -1, x.shape[-1])
    x = x + self.attn(x)
    x = x + x @ self.w[...]
    return self.head(x.mean(axis=1))


def test_nnx_every_contraction_is_recorded_and_attention_quantizes_like_linen():
  model = NNXViT(nnx.Rngs(0))
  img = _img()
  n_plain = _count_contractions(jax.make_jaxpr(lambda m, x: m(x))(model, img).jaxpr)
  kept = models.quantize_model(model, [models.Rule(".*", None)])
  with quantization.recording() as ops:
    chex.assert_trees_all_equal(jitted_call(kept, img), jitted_call(model, img))
  # conv, q/k/v/out, the fused attention (two products), @, head
  assert [op.kind for op in ops].count("attention") == 1 and len(ops) == 8
  assert n_plain == len(ops) + 1  # the fused call's two products are one op when kept
  ours = models.quantize_model(model, [models.Rule(".*", RECIPE)])
  with quantization.recording() as ops:
    out = jitted_call(ours, img)
  assert {(op.path, op.op_id, op.kind) for op in ops if op.path == "attn"} == {
      ("attn", "einsum_0", "attention"), ("attn", "einsum_1", "attention")}
  assert len(ops) == n_plain and all(op.rule is not None for op in ops)
  assert {op.kind for op in ops} == {"conv", "dot_general", "attention", "matmul"}
  assert not np.array_equal(out, jitted_call(model, img))
  grads = nnx.jit(nnx.grad(lambda m: jnp.sum(m(img) ** 2)))(ours)
  assert np.isfinite(np.asarray(grads["patch"]["kernel"][...])).all()


class GQA(nnx.Module):
  """jax.nn.dot_product_attention with 4 query heads on 2 key/value heads, a mask and
  causality: the decomposition repeats key/value heads per group."""

  def __call__(self, q, k, v, mask):
    return jax.nn.dot_product_attention(q, k, v, mask=mask, is_causal=True)


def test_fused_attention_decomposes_grouped_queries_and_masks_exactly():
  kq, kk, kv, km = jax.random.split(jax.random.key(0), 4)
  q = jax.random.normal(kq, (2, 8, 4, 16), jnp.bfloat16)
  k = jax.random.normal(kk, (2, 8, 2, 16), jnp.bfloat16)
  v = jax.random.normal(kv, (2, 8, 2, 16), jnp.bfloat16)
  mask = jax.random.bernoulli(km, 0.8, (2, 1, 8, 8))
  ours = models.quantize_model(GQA(), [models.Rule(".*", "bf16")])
  with quantization.recording() as ops:
    got = jitted_call(ours, q, k, v, mask)
  assert [op.kind for op in ops] == ["attention", "attention"]
  chex.assert_trees_all_equal(got, jitted_call(GQA(), q, k, v, mask))
  quantized = jitted_call(models.quantize_model(GQA(), [models.Rule(".*", RECIPE)]),
                          q, k, v, mask)
  assert quantized.shape == got.shape and not np.array_equal(quantized, got)
