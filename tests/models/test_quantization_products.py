"""quantize_model as an adopter meets it (issue 51, rows 13 and 14).

Row 13: ``jnp.tensordot``, ``jnp.inner`` and ``jnp.vdot`` ran unquantized without a word
and ``recording()`` did not list them, nor ``jnp.vecdot``, ``matvec``, ``vecmat``,
``jnp.linalg.tensordot`` / ``vecdot`` or ``lax.dot`` / ``batch_matmul``; each is one
dot_general, now quantized bit for bit as ``qdot.quantized_dot_general`` on the
dimension numbers written here by hand. ``jnp.outer``, ``jnp.linalg.outer`` (and a
product with a scalar) have no contraction and ``jnp.linalg.multi_dot`` is a chain in an
order JAX picks: recorded with their reason, run as written, and a warning under a
quantizing rule.

Row 14: messages named the root module ``<model>``, which no rule matches (its rule path
is ``""``); the unused-rule hint named ``models.quantization`` (a user's own ``models``
package); two rules with the same path regex printed alike in the plan.
"""

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
from lowprec.numerics import qdot
from tests.models.nnx_calls import jitted_call

RECIPE = "mxfp8"
NO_BATCH = ((), ())


class Products(nn.Module):
  """The jnp products an adopter's model may call, on parameters it declares."""

  @nn.compact
  def __call__(self, x_BxTxD):
    d = x_BxTxD.shape[-1]
    w = self.param("w", nn.initializers.lecun_normal(), (d, 64))
    w3 = self.param("w3", nn.initializers.lecun_normal(), (x_BxTxD.shape[1], d, 64))
    v = self.param("v", nn.initializers.lecun_normal(), (64, d))
    return {"tensordot": jnp.tensordot(x_BxTxD, w, 1),
            "tensordot_lists": jnp.tensordot(x_BxTxD, w3, axes=([-2, 2], [0, 1])),
            "inner": jnp.inner(x_BxTxD, v),
            "vdot": jnp.vdot(x_BxTxD, x_BxTxD)}


def _by_hand(params, x):
  """The same products through qdot, with the dimension numbers derived here."""
  p = params["params"]
  qdg = lambda a, b, dn: qdot.quantized_dot_general(a, b, dn, RECIPE)
  return {"tensordot": qdg(x, p["w"], (((2,), (0,)), NO_BATCH)),
          "tensordot_lists": qdg(x, p["w3"], (((1, 2), (0, 1)), NO_BATCH)),
          "inner": qdg(x, p["v"], (((2,), (1,)), NO_BATCH)),
          "vdot": qdg(x.ravel(), x.ravel(), (((0,), (0,)), NO_BATCH))}


def _x():
  return jax.random.normal(jax.random.key(0), (2, 4, 32))


def test_tensordot_inner_and_vdot_are_quantized_like_qdot_by_hand():
  x = _x()
  params = Products().init(jax.random.key(1), x)
  ours = models.quantize_model(Products(), [models.Rule(".*", RECIPE)])
  with quantization.recording() as ops:
    got = jax.jit(ours.apply)(params, x)
  assert [(op.op_id, op.kind, op.reason) for op in ops] == [
      (f"{name}_{i}", "matmul", f"{RECIPE}: rules[0] '.*'")
      for name, i in (("tensordot", 0), ("tensordot", 1), ("inner", 0), ("vdot", 0))]
  chex.assert_trees_all_equal(got, jax.jit(_by_hand)(params, x))
  plain = jax.jit(Products().apply)(params, x)
  assert not np.array_equal(got["tensordot"], plain["tensordot"])
  kept = models.quantize_model(Products(), [models.Rule(".*", None)])
  chex.assert_trees_all_equal(jax.jit(kept.apply)(params, x), plain)


class NNXProducts(nnx.Module):

  def __init__(self, rngs):
    self.w = nnx.Param(jax.random.normal(rngs.params(), (32, 64)) / 6.0)

  def __call__(self, x):
    return jnp.tensordot(x, self.w[...], axes=1)


def test_nnx_tensordot_is_quantized_like_qdot_by_hand():
  model, x = NNXProducts(nnx.Rngs(0)), _x()
  with quantization.recording() as ops:
    got = jitted_call(models.quantize_model(model, [models.Rule(".*", RECIPE)]), x)
  assert [(op.path, op.op_id, op.kind) for op in ops] == [("", "tensordot_0", "matmul")]
  chex.assert_trees_all_equal(
      got, qdot.quantized_dot_general(x, model.w[...], (((2,), (0,)), NO_BATCH), RECIPE))


class Outer(nn.Module):

  @nn.compact
  def __call__(self, x):
    return nn.Dense(8, name="proj")(jnp.outer(x[0], x[1]) + jnp.dot(2.0, x).sum())


def test_outer_and_scalar_products_are_recorded_and_warn_under_a_quantizing_rule():
  x = jax.random.normal(jax.random.key(0), (2, 16))
  params = Outer().init(jax.random.key(1), x)
  plain = Outer().apply(params, x)
  rules = [models.Rule("proj", None), models.Rule("", RECIPE)]
  with quantization.recording() as ops, pytest.warns(UserWarning) as caught:
    got = models.quantize_model(Outer(), rules).apply(params, x)
  chex.assert_trees_all_equal(got, plain)
  messages = [str(w.message) for w in caught]
  assert messages == [
      'outer_0 of the root module (rule path ""): jnp.outer has no contraction to '
      "quantize (not a GEMM), so it runs as written, not in mxfp8 as rules[1] '' asks "
      "(a rule with recipe=None for its module says so and silences this)",
      'dot_0 of the root module (rule path ""): a product with a scalar has no '
      "contraction to quantize, so it runs as written, not in mxfp8 as rules[1] '' asks "
      "(a rule with recipe=None for its module says so and silences this)"]
  assert caught[0].filename == __file__  # points at the model's line
  assert [(op.path, op.op_id, op.kind, op.reason) for op in ops] == [
      ("", "outer_0", "matmul", "as written: jnp.outer has no contraction to quantize "
       "(not a GEMM) (rules[1] '' asks for mxfp8)"),
      ("", "dot_0", "matmul", "as written: a product with a scalar has no contraction "
       "to quantize (rules[1] '' asks for mxfp8)"),
      ("proj", "dot_general_0", "dot_general", "as written: rules[0] 'proj' keeps it")]
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # the rule path the message names keeps them quietly
    models.quantize_model(Outer(), [models.Rule("", None)]).apply(params, x)


class MoreProducts(nn.Module):
  """The other contractions JAX offers: vecdot, matvec, vecmat, jnp.linalg's and lax's."""

  @nn.compact
  def __call__(self, x_BxTxD):
    init = nn.initializers.lecun_normal()
    w = self.param("w", init, (32, 64))
    m = self.param("m", init, (4, 64, 32))
    return {"vecdot": jnp.vecdot(x_BxTxD, x_BxTxD[:1]),
            "linalg_vecdot": jnp.linalg.vecdot(x_BxTxD, 2.0 * x_BxTxD, axis=0),
            "matvec": jnp.matvec(m, x_BxTxD),
            "vecmat": jnp.vecmat(x_BxTxD, w),
            "linalg_tensordot": jnp.linalg.tensordot(x_BxTxD, w, axes=1),
            "linalg_matmul": jnp.linalg.matmul(x_BxTxD, w),
            "lax_dot": jax.lax.dot(x_BxTxD[0], w),
            "batch_matmul": jax.lax.batch_matmul(x_BxTxD, jnp.broadcast_to(w, (32, 32, 64)))}


def _more_by_hand(params, x):
  p = params["params"]
  qdg = lambda a, b, dn: qdot.quantized_dot_general(a, b, dn, RECIPE)
  two = (((2,), (2,)), ((0, 1), (0, 1)))  # contract the last axis, batch the first two
  xt = jnp.transpose(x, (1, 2, 0))  # axis 0 last: [T, D, B]
  return {"vecdot": qdg(x, jnp.broadcast_to(x[:1], x.shape), two),
          "linalg_vecdot": qdg(xt, 2.0 * xt, two),
          "matvec": qdg(jnp.broadcast_to(p["m"], (32, 4, 64, 32)), x,
                        (((3,), (2,)), ((0, 1), (0, 1)))),
          "vecmat": qdg(x, jnp.broadcast_to(p["w"], (32, 4, 32, 64)), two),
          "linalg_tensordot": qdg(x, p["w"], (((2,), (0,)), NO_BATCH)),
          "linalg_matmul": qdg(x, p["w"], (((2,), (0,)), NO_BATCH)),
          "lax_dot": qdg(x[0], p["w"], (((1,), (0,)), NO_BATCH)),
          "batch_matmul": qdg(x, jnp.broadcast_to(p["w"], (32, 32, 64)),
                              (((2,), (1,)), ((0,), (0,))))}


def test_vecdot_matvec_vecmat_linalg_and_lax_products_are_quantized_like_qdot_by_hand():
  x = jax.random.normal(jax.random.key(0), (32, 4, 32))  # MX blocks of 32 along axis 0 too
  params = MoreProducts().init(jax.random.key(1), x)
  ours = models.quantize_model(MoreProducts(), [models.Rule(".*", RECIPE)])
  with quantization.recording() as ops:
    got = jax.jit(ours.apply)(params, x)
  assert [(op.op_id, op.kind) for op in ops] == [
      ("vecdot_0", "matmul"), ("vecdot_1", "matmul"), ("matvec_0", "matmul"),
      ("vecmat_0", "matmul"), ("tensordot_0", "matmul"), ("matmul_0", "matmul"),
      ("dot_general_0", "dot_general"), ("dot_general_1", "dot_general")]
  chex.assert_trees_all_equal(got, jax.jit(_more_by_hand)(params, x))
  plain = jax.jit(MoreProducts().apply)(params, x)
  assert not np.array_equal(got["matvec"], plain["matvec"])
  kept = models.quantize_model(MoreProducts(), [models.Rule(".*", None)])
  chex.assert_trees_all_equal(jax.jit(kept.apply)(params, x), plain)


class Chain(nn.Module):

  def __call__(self, x):
    experts = jax.lax.ragged_dot(x, jnp.stack([x.T, -x.T]), jnp.array([1, 2]))
    return (jnp.linalg.outer(x[0], x[1]) + jnp.linalg.multi_dot([x.T, x, x.T, x])
            + experts.sum())


def test_ragged_dot_linalg_outer_and_multi_dot_are_recorded_and_warn_under_a_quantizing_rule():
  x = jax.random.normal(jax.random.key(0), (3, 32))
  model = models.quantize_model(Chain(), [models.Rule("", RECIPE)])
  with quantization.recording() as ops, pytest.warns(UserWarning) as caught:
    got = model.apply({}, x)
  chex.assert_trees_all_equal(got, Chain().apply({}, x))
  assert [(op.op_id, op.kind) for op in ops] == [
      ("ragged_dot_0", "dot_general"), ("outer_0", "matmul"), ("multi_dot_0", "matmul")]
  assert "lax.ragged_dot is a grouped GEMM" in str(caught[0].message)
  assert "jnp.linalg.outer has no contraction" in str(caught[1].message)
  assert ("jnp.linalg.multi_dot of 4 arrays is a chain of products" in
          str(caught[2].message))
  assert {w.filename for w in caught} == {__file__}


# ---------------------------------------------------------------------- row 14


class RootOps(nn.Module):
  """Ops issued by the quantized model itself (rule path ``""``)."""

  @nn.compact
  def __call__(self, x):
    w = self.param("w", nn.initializers.lecun_normal(), (3, 3, 4, 4))
    y = jax.lax.conv_general_dilated(x, w[:, :, :2], (1, 1), "SAME",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                     feature_group_count=2)
    return jnp.einsum("bhwc,cd,de->bhwe", y, w[0, 0], w[1, 1])


def test_root_module_errors_name_the_rule_path_that_matches_it():
  x = jnp.ones((1, 8, 8, 4))
  params = RootOps().init(jax.random.key(0), x)
  with pytest.raises(ValueError, match=r'^conv_0 of the root module \(rule path ""\): a '
                     r"grouped convolution .* under rules\[0\] '\.\*': give its module a "
                     r"rule with recipe=None"):
    models.quantize_model(RootOps(), [models.Rule(".*", RECIPE)]).apply(params, x)
  with pytest.raises(ValueError, match=r'^einsum_0 of the root module \(rule path ""\): '
                     r"quantize_model quantizes two-operand einsums"):
    models.quantize_model(RootOps(), [models.Rule(".*", RECIPE, ops="einsum")]
                          ).apply(params, x)
  # The path the messages name is the rule that keeps those ops.
  kept = models.quantize_model(RootOps(), [models.Rule("", None), models.Rule(".*", RECIPE)],
                               unused_rules="ignore")
  with quantization.recording() as ops:
    chex.assert_trees_all_equal(kept.apply(params, x), RootOps().apply(params, x))
  assert "| \"\" (root) | conv_0 | conv |" in quantization.plan(ops)


def test_plan_tells_two_rules_with_the_same_path_apart():
  rules = quantization.projections_only(RECIPE, head=None)  # '.*' twice
  x = jax.random.normal(jax.random.key(0), (2, 4, 32))
  model = models.quantize_model(nn.MultiHeadDotProductAttention(2), rules)
  params = model.init(jax.random.key(1), x, x)
  with quantization.recording() as ops:
    jax.eval_shape(model.apply, params, x, x)
  reasons = {op.kind: op.reason for op in ops}
  assert reasons == {
      "dot_general": f"{RECIPE}: rules[1] '.*' (ops: dot_general, einsum, matmul, conv)",
      "attention": "bf16: rules[0] '.*' (ops: attention)"}


def test_unused_rule_hint_names_the_import_path_a_user_types():
  x = jnp.ones((2, 8))
  model = models.quantize_model(nn.Dense(4), [models.Rule("heda", "bf16"),
                                              models.Rule(".*", RECIPE)])
  with pytest.warns(UserWarning) as caught:
    model.init(jax.random.key(0), x)
  assert [str(w.message) for w in caught] == [
      "quantize_model: rules[0] = Rule('heda', 'bf16', ops=('dot_general', 'einsum', "
      "'matmul', 'conv', 'attention')) matched no op of the model in its calls so far (a "
      "typo in a module path? lowprec.models.quantization.recording() lists the paths and "
      "op kinds the model issues)"]


def test_plan_escapes_a_path_regex_alternation():
  record = quantization.OpRecord("head", "dot_general_0", None, (2, 8), (8, 4),
                                 "dot_general", "bf16: rules[0] 'head|logits'")
  row = quantization.plan([record]).splitlines()[-1]
  assert len([c for c in row.replace("\\|", "").split("|") if c.strip()]) == 5
  assert row.endswith("| bf16: rules[0] 'head\\|logits' |")
