"""numerics.optim.muon: Newton-Schulz against optax.contrib, routing, scaling, jit/inject."""

import importlib

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lowprec.numerics import optim

muon_lib = importlib.import_module("lowprec.numerics.optim.muon")  # the package re-exports the function muon


def _matrix(shape, seed=0):
  return jax.random.normal(jax.random.PRNGKey(seed), shape, jnp.float32)


@pytest.mark.parametrize("shape", [(16, 32), (32, 16), (24, 24)])
def test_newton_schulz_matches_optax_contrib(shape):
  x = _matrix(shape)
  ours = optim.newton_schulz(x, dtype="fp32", eps=1e-8)
  # optax 0.2.8 keeps the NS function private; the public muon is compared below
  from optax.contrib import _muon  # pylint: disable=import-outside-toplevel
  ref = _muon.orthogonalize_via_newton_schulz(
      x, jnp.asarray(muon_lib.NS_COEFFS), ns_steps=5, eps=1e-8)
  chex.assert_trees_all_close(ours, ref, atol=2e-5, rtol=1e-4)
  # and it orthogonalises: singular values pushed into roughly (0.5, 1.5)
  sv = np.linalg.svd(np.asarray(ours), compute_uv=False)
  assert 0.5 < sv.min() and sv.max() < 1.5


@pytest.mark.parametrize("shape", [(16, 32), (32, 16)])
def test_muon_update_matches_optax_contrib_muon(shape):
  # Same inputs, momentum off on both sides: -lr * sqrt(max(1, out/in)) * NS(g).
  g = {"w": _matrix(shape, seed=2)}
  ref_tx = optax.contrib.muon(learning_rate=1.0, beta=0.0, nesterov=False)
  ours_tx = optim.muon(1.0, momentum=0.0, nesterov=False, ns_dtype="fp32",
                       label_fn=optim.all_matrices_labels)
  ref, _ = ref_tx.update(g, ref_tx.init(g), g)
  ours, _ = ours_tx.update(g, ours_tx.init(g), g)
  chex.assert_trees_all_close(ours, ref, atol=1e-4, rtol=1e-3)
  assert float(jnp.abs(ours["w"]).max()) > 0.01


def test_newton_schulz_bf16_close_to_fp32_and_keeps_dtype():
  x = _matrix((16, 48))
  lo = optim.newton_schulz(x, dtype="bf16")
  hi = optim.newton_schulz(x, dtype="fp32")
  assert lo.dtype == jnp.float32
  rel = jnp.linalg.norm(lo - hi) / jnp.linalg.norm(hi)
  assert 1e-3 < rel < 0.15  # bf16 really is used (measured ~6%), and stays close


def test_newton_schulz_is_a_loop_not_unrolled():
  x = _matrix((16, 32))
  hlo = jax.jit(lambda x: optim.newton_schulz(x, steps=5)).lower(x).as_text()
  assert "while" in hlo
  # unrolled 5 steps would contain >= 15 dot ops; the loop body has 3 (+ none outside)
  assert hlo.count("dot_general") <= 4


def test_newton_schulz_rejects_bad_input():
  with pytest.raises(ValueError, match="matrix"):
    optim.newton_schulz(jnp.ones((3,)))
  with pytest.raises(ValueError, match="dtype"):
    optim.newton_schulz(jnp.ones((3, 3)), dtype="fp8")


def test_shape_scaling_rules():
  # Dense (in=8, out=32): rows=out=32, cols=8
  assert optim.shape_scale((8, 32)) == pytest.approx(2.0)
  assert optim.shape_scale((32, 8)) == pytest.approx(1.0)
  assert optim.shape_scale((8, 32), "rms") == pytest.approx(0.2 * np.sqrt(32))
  # conv (3, 3, 4, 8): viewed as (8, 36)
  assert optim.shape_scale((3, 3, 4, 8), "rms") == pytest.approx(0.2 * 6.0)
  with pytest.raises(ValueError, match="scaling"):
    optim.shape_scale((2, 2), "bogus")


def test_conv_kernel_viewed_as_out_by_fanin():
  k = _matrix((3, 3, 4, 8))
  m = muon_lib.as_matrix(k)
  assert m.shape == (8, 36)
  chex.assert_trees_all_equal(muon_lib.from_matrix(m, k.shape), k)
  np.testing.assert_array_equal(m[5], np.asarray(k[..., 5]).reshape(-1))


def test_scale_by_muon_first_step_is_orthogonalised_gradient():
  g = {"w": _matrix((3, 3, 4, 8))}
  tx = optim.scale_by_muon(0.9, nesterov=True, ns_dtype="fp32")
  u, s = tx.update(g, tx.init(g))
  # buf = g, Nesterov d = g + 0.9 g = 1.9 g; NS is scale-invariant
  expected = muon_lib.from_matrix(optim.newton_schulz(muon_lib.as_matrix(g["w"]),
                                                      dtype="fp32"), (3, 3, 4, 8))
  chex.assert_trees_all_close(u["w"], expected, atol=1e-5)
  chex.assert_trees_all_close(s.momentum, g)
  assert int(s.count) == 1


PARAMS = {"stem": {"kernel": jnp.ones((3, 3, 1, 8))},
          "block": {"conv": {"kernel": jnp.ones((3, 3, 8, 8))},
                    "norm": {"scale": jnp.ones((8,)), "bias": jnp.zeros((8,))}},
          "embed": {"embedding": jnp.ones((20, 8))},
          "head": {"kernel": jnp.ones((8, 10)), "bias": jnp.zeros((10,))}}


def test_default_labels_send_embeddings_heads_biases_norms_to_fallback():
  labels = optim.default_param_labels(PARAMS)
  assert labels["stem"]["kernel"] == "muon"
  assert labels["block"]["conv"]["kernel"] == "muon"
  for path in (("block", "norm", "scale"), ("block", "norm", "bias"),
               ("embed", "embedding"), ("head", "kernel"), ("head", "bias")):
    leaf = labels
    for p in path:
      leaf = leaf[p]
    assert leaf == "fallback", path
  everything = optim.all_matrices_labels(PARAMS)
  assert everything["head"]["kernel"] == "muon" and everything["head"]["bias"] == "fallback"


def test_muon_routes_leaves_and_applies_decoupled_decay():
  params = jax.tree.map(lambda x: x + 0.5, PARAMS)
  grads = jax.tree.map(lambda x: jax.random.normal(jax.random.PRNGKey(1), x.shape), params)
  lr, wd = 0.1, 0.2
  tx = optim.muon(lr, weight_decay=wd, ns_dtype="fp32", momentum=0.9)
  u, _ = jax.jit(tx.update)(grads, tx.init(params), params)
  # Muon leaf: -lr * (scale * NS(1.9 g) + wd * p)
  w, g = params["block"]["conv"]["kernel"], grads["block"]["conv"]["kernel"]
  o = muon_lib.from_matrix(optim.newton_schulz(muon_lib.as_matrix(g), dtype="fp32"), w.shape)
  chex.assert_trees_all_close(u["block"]["conv"]["kernel"], -lr * (o + wd * w), atol=1e-5)
  # fallback (momentum SGD, same decay): -lr * (1.9 g + wd * p)
  b, gb = params["head"]["bias"], grads["head"]["bias"]
  chex.assert_trees_all_close(u["head"]["bias"], -lr * (1.9 * gb + wd * b), atol=1e-6)
  gk = grads["head"]["kernel"]
  chex.assert_trees_all_close(u["head"]["kernel"], -lr * (1.9 * gk + wd * params["head"]["kernel"]),
                              atol=1e-6)


def test_muon_adamw_fallback_and_bad_labels():
  tx = optim.muon(0.01, fallback="adamw")
  u, _ = tx.update(PARAMS, tx.init(PARAMS), PARAMS)
  chex.assert_tree_all_finite(u)
  bad = optim.muon(0.01, label_fn=lambda p: jax.tree.map(lambda _: "adam", p))
  with pytest.raises(ValueError, match="label_fn"):
    bad.init(PARAMS)
  with pytest.raises(ValueError, match="ndim"):
    optim.scale_by_muon().init({"b": jnp.zeros(3)})


def test_muon_state_stable_under_jit_and_inject_hyperparams():
  tx = optax.inject_hyperparams(optim.muon, static_args=("label_fn",))(
      learning_rate=0.02, weight_decay=0.1)
  state = tx.init(PARAMS)
  step = jax.jit(tx.update)
  params = PARAMS
  shapes = jax.tree.map(lambda x: (x.shape, x.dtype), state)
  for _ in range(3):
    grads = jax.tree.map(jnp.ones_like, params)
    u, state = step(grads, state, params)
    params = optax.apply_updates(params, u)
    assert jax.tree.map(lambda x: (x.shape, x.dtype), state) == shapes
  assert float(state.hyperparams["learning_rate"]) == pytest.approx(0.02)
  chex.assert_tree_all_finite(params)


def test_muon_minimises_a_quadratic():
  target = _matrix((8, 8), seed=3)
  loss = lambda p: jnp.sum((p["w"] - target) ** 2)
  params = {"w": jnp.zeros((8, 8))}
  tx = optim.muon(0.05, label_fn=optim.all_matrices_labels, ns_dtype="fp32")
  state = tx.init(params)
  start = loss(params)

  @jax.jit
  def step(params, state):
    u, state = tx.update(jax.grad(loss)(params), state, params)
    return optax.apply_updates(params, u), state

  for _ in range(100):
    params, state = step(params, state)
  assert loss(params) < 0.05 * start
