"""Quantized Flax layers: bf16 equals the plain layer; recipes are injected, not hard-wired."""

import chex
from flax import linen as nn
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from models import layers
from numerics import qdot

BF = jnp.bfloat16


def _x(shape=(4, 8, 64), seed=0):
  return jax.random.normal(jax.random.key(seed), shape)


@pytest.mark.parametrize("make", [
    lambda q, **kw: (layers.QDense(96, **kw) if q else nn.Dense(96, **kw)),
    lambda q, **kw: (layers.QDenseGeneral((4, 24), **kw) if q
                     else nn.DenseGeneral((4, 24), **kw)),
    lambda q, **kw: (layers.QEinsum((64, 4, 24), "btk,khd->bthd", **kw) if q
                     else nn.Einsum((64, 4, 24), "btk,khd->bthd", **kw)),
])
def test_linen_bf16_equals_plain_layer(make):
  x = _x()
  plain = make(False, dtype=BF)
  ours = make(True, dtype=BF, recipe="bf16")
  params = plain.init(jax.random.key(1), x)
  chex.assert_trees_all_equal_structs(ours.init(jax.random.key(1), x), params)
  chex.assert_trees_all_equal(ours.apply(params, x), plain.apply(params, x))
  loss = lambda m: lambda p, x: jnp.sum(m.apply(p, x).astype(jnp.float32) ** 2)
  chex.assert_trees_all_equal(jax.grad(loss(ours), (0, 1))(params, x),
                              jax.grad(loss(plain), (0, 1))(params, x))


def test_linen_dense_mxfp8_is_quantized_dot_general():
  x = _x()
  m = layers.QDense(96, recipe="mxfp8")
  p = m.init(jax.random.key(1), x)
  want = qdot.quantized_dot_general(x, p["params"]["kernel"], (((2,), (0,)), ((), ())),
                                    "mxfp8") + p["params"]["bias"]
  chex.assert_trees_all_equal(m.apply(p, x), want)
  assert not np.allclose(m.apply(p, x), nn.Dense(96).apply(p, x), rtol=1e-4)


def test_linen_stochastic_recipe_uses_quant_rng():
  x = _x()
  m = layers.QDense(96, recipe="mxfp4")
  p = m.init({"params": jax.random.key(1), "quant": jax.random.key(2)}, x)
  g = lambda k: jax.grad(lambda p: jnp.sum(m.apply(p, x, rngs={"quant": k}) ** 2))(p)
  chex.assert_trees_all_equal(g(jax.random.key(3)), g(jax.random.key(3)))
  a, b = g(jax.random.key(3)), g(jax.random.key(4))
  assert not np.array_equal(a["params"]["kernel"], b["params"]["kernel"])
  with pytest.raises(Exception, match="quant"):
    m.apply(p, x)  # no 'quant' rng given
  with pytest.raises(ValueError, match="unknown recipe"):
    layers.QDense(8, recipe="nope")


def test_nnx_bf16_equals_plain_layers():
  x = _x()
  pairs = [
      (layers.QLinear(64, 96, recipe="bf16", dtype=BF, rngs=nnx.Rngs(0)),
       nnx.Linear(64, 96, dtype=BF, rngs=nnx.Rngs(0))),
      (layers.QLinearGeneral(64, (4, 24), recipe="bf16", dtype=BF, rngs=nnx.Rngs(0)),
       nnx.LinearGeneral(64, (4, 24), dtype=BF, rngs=nnx.Rngs(0))),
      (layers.QEinsumNNX("btk,khd->bthd", (64, 4, 24), (4, 24), recipe="bf16", dtype=BF,
                         rngs=nnx.Rngs(0)),
       nnx.Einsum("btk,khd->bthd", (64, 4, 24), (4, 24), dtype=BF, rngs=nnx.Rngs(0))),
  ]
  for ours, plain in pairs:
    chex.assert_trees_all_equal(ours(x), plain(x))
    go = nnx.grad(lambda m: jnp.sum(m(x).astype(jnp.float32) ** 2))(ours)
    gp = nnx.grad(lambda m: jnp.sum(m(x).astype(jnp.float32) ** 2))(plain)
    chex.assert_trees_all_equal(go["kernel"][...], gp["kernel"][...])


def test_nnx_stochastic_recipe_under_jit_advances_key():
  x = _x()
  m = layers.QLinear(64, 96, recipe="mxfp4", rngs=nnx.Rngs(0, quant=5))

  @nnx.jit
  def grad(m):
    return nnx.grad(lambda m: jnp.sum(m(x) ** 2))(m)

  a = grad(m)["kernel"][...]
  b = grad(m)["kernel"][...]  # the quant stream advanced: new SR draws
  assert not np.array_equal(a, b)
  want = qdot.quantized_dot_general(x, m.kernel[...], (((2,), (0,)), ((), ())),
                                    "mxfp4", jax.random.key(0)) + m.bias[...]
  chex.assert_trees_all_equal(m(x), want)  # the forward GEMM draws nothing


def test_mlp_of_quantized_layers_learns_digits():
  # A model test: a 2-layer MLP of QDense layers trained with ALTO's mxfp4 recipe on
  # scikit-learn's bundled digits beats chance by a wide margin within 150 steps.
  datasets = pytest.importorskip("sklearn.datasets")
  d = datasets.load_digits()
  x = jnp.asarray(d.data / 16.0, jnp.float32)
  y = jnp.asarray(d.target)
  x = jnp.pad(x, ((0, 0), (0, 0)))

  class MLP(nn.Module):
    recipe: str

    @nn.compact
    def __call__(self, x):
      h = nn.relu(layers.QDense(128, recipe=self.recipe)(x))
      return layers.QDense(10, recipe="bf16")(h)  # head in bf16, as ALTO

  model = MLP("mxfp4")
  params = model.init({"params": jax.random.key(0), "quant": jax.random.key(1)}, x[:2])
  opt = optax.adam(3e-3)
  state = opt.init(params)

  @jax.jit
  def step(params, state, key):
    def loss(p):
      logits = model.apply(p, x, rngs={"quant": key})
      return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    l, g = jax.value_and_grad(loss)(params)
    u, state = opt.update(g, state, params)
    return optax.apply_updates(params, u), state, l

  for i in range(150):
    params, state, l = step(params, state, jax.random.key(100 + i))
  acc = float(jnp.mean(jnp.argmax(model.apply(params, x, rngs={"quant": jax.random.key(0)}),
                                  -1) == y))
  assert acc > 0.9, acc
