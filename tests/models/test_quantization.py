"""models.quantize_model on Flax models written here, not for it: a linen MLP and
transformer made of nn.Dense / nn.DenseGeneral / nn.Einsum /
nn.MultiHeadDotProductAttention, and an NNX model.

bf16 rules give exactly the plain bf16 model; an mxfp8 rule gives exactly the same model
with numerics.qdot's dot_general injected into every layer by hand (Flax's own
injection points), for outputs and gradients.
"""

import functools
import types
from typing import Any, Callable

import chex
from flax import linen as nn
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lowprec import models
from lowprec.models import quantization
from lowprec.numerics import qdot, recipes
from tests.models.nnx_calls import jitted_call

BF = jnp.bfloat16


class _InjectedEinsum(nn.Module):
  """nn.Einsum with its contraction's dot_general injected (the hand-built reference;
  nn.Einsum itself has no injection point). Same parameters as nn.Einsum."""

  shape: tuple
  einsum_str: str
  dot_general: Callable
  dtype: Any = None

  @nn.compact
  def __call__(self, x):
    kernel = self.param("kernel", nn.initializers.lecun_normal(), self.shape)
    bias = self.param("bias", nn.initializers.zeros_init(), self.shape[-2:])
    x, kernel, bias = nn.dtypes.promote_dtype(x, kernel, bias, dtype=self.dtype)
    return jnp.einsum(self.einsum_str, x, kernel, _dot_general=self.dot_general) + bias


class Block(nn.Module):
  """Self-attention and an einsum MLP; ``dg`` injects a dot_general (reference only)."""

  dtype: Any = None
  dg: Callable | None = None

  @nn.compact
  def __call__(self, x):
    kw = dict(dtype=self.dtype)
    mha = {}
    if self.dg is not None:
      einsum = lambda: functools.partial(jnp.einsum, _dot_general=self.dg)
      mha = dict(qkv_dot_general=self.dg, out_dot_general=self.dg,
                 qk_attn_weights_einsum_cls=einsum, attn_weights_value_einsum_cls=einsum)
    x = x + nn.MultiHeadDotProductAttention(4, name="attn", **kw, **mha)(x, x)
    if self.dg is None:
      h = nn.Einsum((64, 2, 32), "blk,khd->blhd", name="up", **kw)(x)
    else:
      h = _InjectedEinsum((64, 2, 32), "blk,khd->blhd", self.dg, name="up", **kw)(x)
    inj = {} if self.dg is None else dict(dot_general=self.dg)
    return x + nn.DenseGeneral(64, axis=(-2, -1), name="down", **kw, **inj)(nn.gelu(h))


class Transformer(nn.Module):
  """Two blocks between an embedding and a head projection."""

  dtype: Any = None
  dg: Callable | None = None

  @nn.compact
  def __call__(self, x_BxLxD):
    inj = {} if self.dg is None else dict(dot_general=self.dg)
    x = nn.Dense(64, name="embed", dtype=self.dtype, **inj)(x_BxLxD)
    for i in range(2):
      x = Block(self.dtype, self.dg, name=f"block_{i}")(x)
    return nn.Dense(8, name="head", dtype=self.dtype, **inj)(x)


def _x(shape=(2, 32, 16), seed=0):
  return jax.random.normal(jax.random.key(seed), shape)


def _value_and_grad(model, params, x, **kw):
  f = lambda p, x: jnp.sum(model.apply(p, x, **kw).astype(jnp.float32) ** 2)
  return jax.jit(jax.value_and_grad(f, argnums=(0, 1)))(params, x)


@pytest.fixture(scope="module")
def transformer_params():
  return jax.jit(Transformer().init)(jax.random.key(1), _x())


def test_linen_bf16_rules_give_the_plain_bf16_model(transformer_params):
  x = _x().astype(BF)
  plain = Transformer(dtype=BF)
  ours = models.quantize_model(plain, [models.Rule(".*", "bf16")])
  chex.assert_trees_all_equal(jax.eval_shape(ours.init, jax.random.key(1), x),
                              jax.eval_shape(plain.init, jax.random.key(1), x))
  chex.assert_trees_all_equal(_value_and_grad(ours, transformer_params, x),
                              _value_and_grad(plain, transformer_params, x))


def test_linen_mxfp8_rule_equals_our_dot_general_injected_by_hand(transformer_params):
  x = _x()
  ours = models.quantize_model(Transformer(), [models.Rule(".*", "mxfp8")])
  by_hand = Transformer(dg=qdot.make_dot_general("mxfp8"))
  with quantization.recording() as ops:
    got = _value_and_grad(ours, transformer_params, x)
  chex.assert_trees_all_equal(got, _value_and_grad(by_hand, transformer_params, x))
  # Every matmul was caught: 2 Dense, and per block q/k/v/out, 2 attention einsums,
  # the Einsum and the DenseGeneral.
  assert len(ops) == 2 + 2 * 8 and all(op.rule is not None for op in ops)
  assert {op.path for op in ops if op.op_id.startswith("einsum")} == {
      "block_0/attn", "block_1/attn", "block_0/up", "block_1/up"}
  # linen's attention einsums are the attention kind; the Einsum layer an einsum.
  assert {(op.path, op.kind) for op in ops if op.op_id.startswith("einsum")} == {
      ("block_0/attn", "attention"), ("block_1/attn", "attention"),
      ("block_0/up", "einsum"), ("block_1/up", "einsum")}


def test_linen_per_layer_overrides_and_unmatched_ops(transformer_params):
  x = _x()
  rules = [models.Rule("head", None), models.Rule("block_0/.*", "bf16"),
           models.Rule("block_1/attn", "mxfp8"), models.Rule("nowhere", "mxfp4")]
  ours = models.quantize_model(Transformer(), rules)
  with quantization.recording() as ops, pytest.warns(UserWarning, match="'nowhere'"):
    jax.eval_shape(ours.apply, transformer_params, x)
  by_path = {(op.path, op.op_id): op.rule for op in ops}
  assert by_path[("head", "dot_general_0")] is rules[0]
  assert by_path[("block_0/attn/query", "dot_general_0")] is rules[1]
  assert by_path[("block_1/attn", "einsum_1")] is rules[2]
  assert by_path[("embed", "dot_general_0")] is None  # unmatched: untouched
  assert quantization.unused_rules(rules, ops) == (rules[3],)
  # Only block_1's attention differs from the plain model's function of its input.
  plain = jax.jit(Transformer().apply)(transformer_params, x)
  assert not np.array_equal(jax.jit(ours.apply)(transformer_params, x), plain)
  ours_none = models.quantize_model(Transformer(), [models.Rule(".*", None)])
  chex.assert_trees_all_equal(jax.jit(ours_none.apply)(transformer_params, x), plain)


class MLP(nn.Module):

  @nn.compact
  def __call__(self, x):
    return nn.Dense(32, name="out")(nn.relu(nn.Dense(64, name="hidden")(x)))


def test_linen_stochastic_recipe_draws_from_the_quant_stream():
  x = _x((64, 32))
  m = models.quantize_model(MLP(), [models.Rule(".*", "mxfp4")])
  p = jax.jit(m.init)({"params": jax.random.key(1), "quant": jax.random.key(2)}, x)
  g = jax.jit(lambda k: jax.grad(lambda p: jnp.sum(m.apply(p, x, rngs={"quant": k}) ** 2))(p))
  chex.assert_trees_all_equal(g(jax.random.key(3)), g(jax.random.key(3)))
  a, b = g(jax.random.key(3)), g(jax.random.key(4))
  assert not np.array_equal(a["params"]["hidden"]["kernel"], b["params"]["hidden"]["kernel"])
  with pytest.raises(ValueError, match="rngs=.*quant"):
    m.apply(p, x)
  with pytest.raises(ValueError, match="unknown recipe"):
    models.Rule(".*", "nope")
  with pytest.raises(ValueError, match="regular expression"):
    models.Rule("(", "bf16")


def test_linen_delayed_scaling_state_and_telemetry():
  x = _x((64, 32))
  delayed = recipes.replace("fp8_delayed", name="fp8_delayed_4", **{
      g: recipes.GemmRecipe(*(None if op is None else recipes.dataclasses.replace(
          op, amax_history_len=4) for op in (gr.lhs, gr.rhs)))
      for g, gr in zip(("forward", "dgrad", "wgrad"), recipes.get("fp8_delayed").gemms)})
  m = models.quantize_model(MLP(), [models.Rule("hidden", delayed), models.Rule("out",
                                                                                 "mxfp8")],
                            telemetry=True)
  variables = jax.jit(m.init)(jax.random.key(1), x)
  state = variables[quantization.OVERWRITE]
  assert set(state) == {"hidden", "out"}  # delayed histories; mxfp8: telemetry probes
  h0 = state["hidden"]["dot_general_0"].delayed.forward_lhs
  assert h0.amax_history.shape == (4,) and float(h0.scale) == 1.0

  def loss(params, overwrite):
    out, sown = m.apply({"params": params, quantization.OVERWRITE: overwrite}, x,
                        mutable=[quantization.NUMERICS])
    return jnp.sum(out ** 2), sown[quantization.NUMERICS]

  (grads, new_state), fwd = jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True))(
      variables["params"], state)
  h1 = new_state["hidden"]["dot_general_0"].delayed.forward_lhs
  amax = float(jnp.max(jnp.abs(x)))
  np.testing.assert_array_equal(h1.amax_history, [0.0, 0.0, 0.0, amax])
  assert float(h1.scale) == np.float32(448.0) / np.float32(amax)
  scalars = quantization.telemetry_scalars(fwd, new_state)
  assert "numerics/hidden/dot_general_0/forward_lhs/sqnr_db" in scalars
  assert "numerics/out/dot_general_0/wgrad_rhs/saturated" in scalars
  assert len(scalars) == 2 * 6 * 4  # two ops, six operands, four statistics
  with pytest.raises(ValueError, match="missing"):
    m.apply({"params": variables["params"]}, x)


class NNXModel(nnx.Module):

  def __init__(self, rngs, dtype=None, dg=None):
    inj = {} if dg is None else dict(dot_general=dg)
    self.embed = nnx.Linear(16, 64, dtype=dtype, rngs=rngs, **inj)
    self.attn = nnx.MultiHeadAttention(4, 64, dtype=dtype, decode=False, rngs=rngs)
    self.up = nnx.Einsum("blk,khd->blhd", (64, 2, 32), (2, 32), dtype=dtype, rngs=rngs,
                         **({} if dg is None else dict(einsum_op=functools.partial(
                             jnp.einsum, _dot_general=dg))))
    self.down = nnx.LinearGeneral((2, 32), 8, axis=(-2, -1), dtype=dtype, rngs=rngs, **inj)

  def __call__(self, x):
    x = self.embed(x)
    x = x + self.attn(x)
    return self.down(nnx.gelu(self.up(x)))


def test_nnx_bf16_rules_give_the_plain_model_and_mxfp8_the_injected_one():
  x = _x()
  plain = NNXModel(nnx.Rngs(0), dtype=BF)
  # NNX's attention is jax.nn's fused op: under a bf16 rule it runs JAX's own XLA
  # attention with its two einsums through the bf16 recipe, which is what the fused op
  # computes for bf16 operands.
  ours = models.quantize_model(plain, [models.Rule(".*", "bf16")])
  with quantization.recording() as ops:
    chex.assert_trees_all_equal(jitted_call(ours, x.astype(BF)), jitted_call(plain, x.astype(BF)))
  assert [(op.op_id, op.kind) for op in ops if op.path == "attn"] == [
      ("einsum_0", "attention"), ("einsum_1", "attention")]
  ours = models.quantize_model(plain, [models.Rule("attn", None), models.Rule(".*", "bf16")])
  assert type(plain) is NNXModel  # the input model is not modified
  chex.assert_trees_all_equal(jitted_call(ours, x.astype(BF)), jitted_call(plain, x.astype(BF)))
  # mxfp8 on the Linear / Einsum / LinearGeneral layers (attention kept plain): equal
  # to qdot's dot_general injected into those layers by hand.
  rules = [models.Rule("attn(/.*)?", None), models.Rule(".*", "mxfp8")]
  dg = qdot.make_dot_general("mxfp8")
  ours = models.quantize_model(NNXModel(nnx.Rngs(0)), rules)
  by_hand = NNXModel(nnx.Rngs(0), dg=dg)  # same parameters; attention left plain
  chex.assert_trees_all_equal(jitted_call(ours, x), jitted_call(by_hand, x))
  go = nnx.jit(nnx.grad(lambda m: jnp.sum(m(x) ** 2)))(ours)
  gh = nnx.jit(nnx.grad(lambda m: jnp.sum(m(x) ** 2)))(by_hand)
  chex.assert_trees_all_equal(go["up"]["kernel"][...], gh["up"]["kernel"][...])
  with quantization.recording() as ops:
    jax.eval_shape(lambda: ours(x))
  assert {(op.path, op.op_id) for op in ops if op.path.startswith("attn")} == {
      ("attn/query", "dot_general_0"), ("attn/key", "dot_general_0"),
      ("attn/value", "dot_general_0"), ("attn/out", "dot_general_0"),
      ("attn", "dot_product_attention_0")}
  assert {op.path for op in ops if op.rule is rules[1]} == {"embed", "up", "down"}


def test_op_ids_survive_a_freed_scope_whose_id_is_reused():
  # Op ids count per module scope, keyed by the scope's id(). A scope freed during the
  # call (flax frees them at garbage collection) let CPython give its address to a new
  # scope, whose ops then counted on from the freed one's ("dot_general_1" for its
  # first op) and missed their delayed-scaling state. Fresh scopes, each dropped after
  # one op, must each start at 0.
  from lowprec.models.quantization import context as context_lib
  config = context_lib.Config(rules=(), telemetry=False, rng_stream="quant")
  ctx = context_lib.Context(config, top=None, top_path=(), kind="linen")
  ids = []
  for _ in range(200):
    module = types.SimpleNamespace(scope=object())
    ids.append(ctx.next_op_id(module, "dot_general"))
    del module
  assert set(ids) == {"dot_general_0"}
  nnx_ctx = context_lib.Context(config, top=None, top_path=(), kind="nnx")
  ids = []
  for _ in range(200):
    ids.append(nnx_ctx.next_op_id(object(), "dot_general"))
  assert set(ids) == {"dot_general_0"}
