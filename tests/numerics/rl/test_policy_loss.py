"""PPO-clip objective, loss normalisation and grpo_loss: values, gradients, conventions."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lowprec.numerics.rl import importance
from lowprec.numerics.rl import policy_loss as pl

E = np.exp


def _grad(f):
  return jax.jit(jax.grad(f))  # eager grad of many small ops is slow on CPU


def test_ppo_clip_objective_hand_values():
  p = jnp.zeros((1, 4))
  l = jnp.array([[0.1, 0.5, 0.5, -0.5]])
  a = jnp.array([[1.0, 1.0, -2.0, -1.0]])
  out = pl.ppo_clip_objective(l, p, a, clip_eps=0.2)
  # r = e^.1 (inside), e^.5 = 1.65 (A>0 -> clipped at 1.2), e^.5 with A<0 -> unclipped
  # r*A = -3.30, e^-.5 = 0.607 with A<0 -> clipped at 0.8 -> -0.8.
  np.testing.assert_allclose(out, [[-E(0.1), -1.2, 2 * E(0.5), 0.8]], rtol=1e-6)
  np.testing.assert_array_equal(pl.ppo_clipped_mask(l, p, a), [[0, 1, 0, 1]])
  # clip-higher: eps_high = 0.7 lets r = 1.65 through
  np.testing.assert_allclose(pl.ppo_clip_objective(l, p, a, 0.2, 0.7)[0, 1], -E(0.5), rtol=1e-6)


def test_ppo_sequence_advantages_broadcast():
  l = jnp.array([[0.1, 0.0], [0.0, 0.1]])
  seq = pl.ppo_clip_objective(l, jnp.zeros((2, 2)), jnp.array([1.0, -1.0]))
  tok = pl.ppo_clip_objective(l, jnp.zeros((2, 2)), jnp.array([[1.0, 1.0], [-1.0, -1.0]]))
  np.testing.assert_allclose(seq, tok)


def test_ppo_clamp_prevents_inf():
  out = pl.ppo_clip_objective(jnp.array([[1000.0]]), jnp.zeros((1, 1)), jnp.array([-1.0]))
  np.testing.assert_allclose(out, [[E(20.0)]], rtol=1e-6)


def test_normalize_loss_modes():
  x = jnp.array([[1.0, 2.0, 3.0], [4.0, 100.0, 100.0], [7.0, 7.0, 7.0]])
  m = jnp.array([[1, 1, 1], [1, 0, 0], [0, 0, 0]], bool)
  np.testing.assert_allclose(pl.normalize_loss(x, m, pl.TokenMean()), 10.0 / 4)
  # row means 2 and 4; the empty third row is left out
  np.testing.assert_allclose(pl.normalize_loss(x, m, pl.SequenceMean()), 3.0)
  np.testing.assert_allclose(pl.normalize_loss(x, m, pl.ConstantDivisor(9.0)), 10.0 / 9)
  z = jnp.zeros((3, 3))
  assert float(pl.normalize_loss(x, z, pl.TokenMean())) == 0.0
  assert float(pl.normalize_loss(x, z, pl.SequenceMean())) == 0.0


def _setup():
  l = jnp.array([[-1.0, -0.5, -2.0], [-0.3, -1.2, -0.7]])
  b = jnp.array([[-1.5, -0.5, -0.9], [-0.3, -2.0, -0.2]])
  mask = jnp.array([[1, 1, 1], [1, 1, 0]], jnp.float32)
  adv = jnp.array([1.0, -0.5])
  return l, b, mask, adv


def test_grpo_token_tis_no_proximal_value_and_grad():
  l, b, mask, adv = _setup()
  # p = stop_grad(l): r = 1, loss_t = -w_t A; w = min(e^{l-b}, 2), l-b = [.5,0,-1.1],[0,.8,-.5]
  w = np.minimum(E(np.array([[0.5, 0.0, -1.1], [0.0, 0.8, -0.5]])), 2.0)
  a = np.array([[1.0] * 3, [-0.5] * 3])
  m = np.asarray(mask)
  loss, met = pl.grpo_loss(l, b, adv, mask, correction=importance.TokenTIS(cap=2.0))
  np.testing.assert_allclose(loss, np.sum(-w * a * m) / 5, rtol=1e-6)
  g = _grad(lambda x: pl.grpo_loss(x, b, adv, mask, correction=importance.TokenTIS())[0])(l)
  np.testing.assert_allclose(g, -w * a * m / 5, rtol=1e-6)  # TIS estimator min(pi/mu,C) A
  assert float(met["ppo_clip_frac"]) == 0.0
  np.testing.assert_allclose(met["is_clipped_frac"], 1 / 5, rtol=1e-6)  # e^.8 = 2.23 capped
  np.testing.assert_allclose(met["is_mean"], np.sum(w * m) / 5, rtol=1e-6)
  # same as passing proximal = stop_gradient(learner)
  loss2, _ = pl.grpo_loss(l, b, adv, mask, proximal_logp=l)
  np.testing.assert_allclose(loss2, loss, rtol=1e-6)


def test_grpo_no_is_uses_sampler_ratio():
  l, b, mask, adv = _setup()
  r = E(np.asarray(l - b))
  a = np.array([[1.0] * 3, [-0.5] * 3])
  m = np.asarray(mask)
  ppo = -np.minimum(r * a, np.clip(r, 0.8, 1.2) * a)
  loss, _ = pl.grpo_loss(l, b, adv, mask, correction=importance.NoCorrection())
  np.testing.assert_allclose(loss, np.sum(ppo * m) / 5, rtol=1e-6)
  g = _grad(lambda x: pl.grpo_loss(x, b, adv, mask, correction=importance.NoCorrection())[0])(l)
  # d/dl of -r A is -r A where the unclipped branch is active, 0 where clipped
  active = ~(((a > 0) & (r > 1.2)) | ((a < 0) & (r < 0.8)))
  np.testing.assert_allclose(g, -r * a * m * active / 5, rtol=1e-6)
  assert active.sum() < active.size  # both regions exercised


def test_grpo_decoupled_gradients_clipped_and_unclipped():
  # One row, four tokens: learner vs proximal log ratio and advantage per token.
  prox = jnp.zeros((1, 4))
  l = jnp.array([[0.1, 0.5, 0.5, -0.5]])  # r = e^.1, e^.5, e^.5, e^-.5
  adv = jnp.array([[1.0, 1.0, -1.0, -1.0]])
  b = jnp.array([[-0.5, 0.0, 0.2, -1.0]])  # IS log ratio prox - b = .5, 0, -.2, 1.0
  mask = jnp.ones((1, 4))
  w = np.minimum(E(np.array([0.5, 0.0, -0.2, 1.0])), 2.0)  # last capped to 2
  r = E(np.array([0.1, 0.5, 0.5, -0.5]))

  def f(x):
    return pl.grpo_loss(x, b, adv, mask, proximal_logp=prox,
                        correction=importance.TokenTIS(cap=2.0), clip_eps=0.2)

  loss, met = f(l)
  # values: -w * [r, 1.2, -r, -0.8]
  np.testing.assert_allclose(loss, np.sum(-w * np.array([r[0], 1.2, -r[2], -0.8])) / 4, atol=1e-6)
  g = _grad(lambda x: f(x)[0])(l)
  # unclipped tokens 0 and 2: -w r A / n; clipped tokens 1 (A>0, r>1.2) and 3 (A<0, r<.8): 0
  np.testing.assert_allclose(g, [[-w[0] * r[0] / 4, 0.0, w[2] * r[2] / 4, 0.0]], rtol=1e-6)
  np.testing.assert_allclose(met["ppo_clip_frac"], 0.5)
  np.testing.assert_allclose(met["is_clipped_frac"], 0.25)
  # gradients never flow into behaviour or proximal log-probs
  gb = _grad(lambda x: pl.grpo_loss(l, x, adv, mask, proximal_logp=prox)[0])(b)
  gp = _grad(lambda x: pl.grpo_loss(l, b, adv, mask, proximal_logp=x)[0])(prox)
  np.testing.assert_array_equal(gb, 0.0)
  np.testing.assert_array_equal(gp, 0.0)


def test_grpo_masked_is_drops_tokens_from_denominator():
  l = jnp.zeros((1, 4))
  b = jnp.array([[0.0, -0.2, -1.0, 2.0]])  # ratio sg(l)/mu = 1, e^.2, e, e^-2
  mask = jnp.ones((1, 4))
  adv = jnp.array([1.0])
  for method in ("masked_is", "icepop"):
    loss, met = pl.grpo_loss(l, b, adv, mask, correction=importance.correction(method, lo=0.5, hi=2.0))
    np.testing.assert_allclose(loss, -(1.0 + E(0.2)) / 2, rtol=1e-6)  # 2 kept tokens
    np.testing.assert_allclose(met["is_dropped_frac"], 0.5)
    g = _grad(lambda x: pl.grpo_loss(x, b, adv, mask, correction=importance.correction(method, hi=2.0))[0])(l)
    np.testing.assert_allclose(g, [[-0.5, -E(0.2) / 2, 0.0, 0.0]], rtol=1e-6)


def test_grpo_all_masked_rows_and_normalizations():
  l, b, mask, adv = _setup()
  mask = mask.at[1].set(0.0)  # second row fully masked out
  loss_tok, _ = pl.grpo_loss(l, b, adv, mask, normalization=pl.TokenMean())
  loss_seq, _ = pl.grpo_loss(l, b, adv, mask, normalization=pl.SequenceMean())
  loss_c, _ = pl.grpo_loss(l, b, adv, mask, normalization=pl.ConstantDivisor(6.0))
  w = np.minimum(E(np.array([0.5, 0.0, -1.1])), 2.0)
  np.testing.assert_allclose(loss_tok, -w.sum() / 3, rtol=1e-6)
  np.testing.assert_allclose(loss_seq, -w.sum() / 3, rtol=1e-6)
  np.testing.assert_allclose(loss_c, -w.sum() / 6, rtol=1e-6)
  # A configuration's names resolve to the same normalizations (and bits).
  for name, old in (("token", loss_tok), ("sequence", loss_seq), ("constant", loss_c)):
    typed = pl.normalization(name, constant=6.0)
    assert float(pl.grpo_loss(l, b, adv, mask, normalization=typed)[0]) == float(old)
  loss0, met0 = pl.grpo_loss(l, b, adv, jnp.zeros_like(mask))
  assert float(loss0) == 0.0 and all(np.isfinite(float(v)) for v in met0.values())


def test_grpo_kl_penalty_value_and_grad():
  l = jnp.array([[-1.0, -0.5]])
  ref = jnp.array([[-0.5, -0.5]])
  mask = jnp.ones((1, 2))
  adv = jnp.zeros(1)  # isolate the KL term
  kw = dict(correction=importance.NoCorrection(), kl_coef=0.1, reference_logp=ref)
  loss, met = pl.grpo_loss(l, l, adv, mask, **kw)
  d = np.array([0.5, 0.0])  # ref - learner
  k3 = E(d) - d - 1
  np.testing.assert_allclose(loss, 0.1 * k3.mean(), rtol=1e-6)
  np.testing.assert_allclose(met["kl"], k3.mean(), rtol=1e-6)
  g = _grad(lambda x: pl.grpo_loss(x, l, adv, mask, **kw)[0])(l)
  np.testing.assert_allclose(g, [0.1 * (1 - E(d)) / 2], rtol=1e-5)


def test_grpo_clamp_prevents_inf():
  l = jnp.array([[0.0, 0.0]])
  b = jnp.array([[-1000.0, 1000.0]])
  for method in importance.METHODS:
    loss, met = pl.grpo_loss(l, b, jnp.array([1.0]), jnp.ones((1, 2)),
                             correction=importance.correction(method))
    assert np.isfinite(float(loss)), method
    if method not in ("none", "token_tis"):  # one gradient per ratio path keeps this fast
      continue
    g = _grad(lambda x: pl.grpo_loss(x, b, jnp.array([1.0]), jnp.ones((1, 2)),
                                     correction=importance.correction(method))[0])(l)
    assert np.all(np.isfinite(g)), method


def test_grpo_jit():
  l, b, mask, adv = _setup()
  kw = dict(correction=importance.SequenceTIS(cap=1.5), normalization=pl.SequenceMean())
  f = jax.jit(pl.grpo_loss, static_argnames=tuple(kw))  # the values are static, hashable
  out = f(l, b, adv, mask, **kw)
  ref = pl.grpo_loss(l, b, adv, mask, **kw)
  chex.assert_trees_all_close(out, ref, rtol=1e-6)


def test_validation():
  l, b, mask, adv = _setup()
  with pytest.raises(ValueError, match="unknown IS method 'tis'"):
    importance.correction("tis")
  with pytest.raises(ValueError, match="unknown loss normalization 'batch'.*'token'"):
    pl.normalization("batch")
  with pytest.raises(ValueError, match="needs a constant"):
    pl.normalization("constant")
  # A name where a normalization belongs is refused, naming the parser (no shim).
  with pytest.raises(TypeError, match=r"policy_loss.normalization\(name"):
    pl.grpo_loss(l, b, adv, mask, normalization="token")
  with pytest.raises(TypeError, match="normalization must be TokenMean"):
    pl.normalize_loss(l, mask, mode=None)
  with pytest.raises(ValueError, match="constant must be > 0, got 0"):
    pl.ConstantDivisor(0)
  assert pl.normalization("constant", constant=4.0) == pl.ConstantDivisor(4.0)
  assert pl.normalization("sequence", constant=4.0) == pl.SequenceMean()
  with pytest.raises(ValueError, match="reference_logp"):
    pl.grpo_loss(l, b, adv, mask, kl_coef=0.1)
  with pytest.raises(ValueError, match="reference_logp"):  # traced kl_coef, no reference
    jax.jit(lambda k: pl.grpo_loss(l, b, adv, mask, kl_coef=k))(0.0)
  with pytest.raises(ValueError, match="advantages"):
    pl.grpo_loss(l, b, jnp.zeros(3), mask)
  with pytest.raises(ValueError, match="behaviour_logp shape"):
    pl.grpo_loss(l, b[:, :2], adv, mask)


def test_typed_corrections_against_hand_values():
  """The correction objects give the weights written out by hand (token TIS with C = 2
  and the sampler ratio of NoCorrection), the same as the older string spelling."""
  l, b, mask, adv = _setup()
  w = np.minimum(E(np.array([[0.5, 0.0, -1.1], [0.0, 0.8, -0.5]])), 2.0)
  a = np.array([[1.0] * 3, [-0.5] * 3])
  m = np.asarray(mask)
  loss, _ = pl.grpo_loss(l, b, adv, mask, correction=importance.TokenTIS(cap=2.0))
  np.testing.assert_allclose(loss, np.sum(-w * a * m) / 5, rtol=1e-6)
  r = E(np.asarray(l - b))
  ppo = -np.minimum(r * a, np.clip(r, 0.8, 1.2) * a)
  loss, _ = pl.grpo_loss(l, b, adv, mask, correction=importance.NoCorrection())
  np.testing.assert_allclose(loss, np.sum(ppo * m) / 5, rtol=1e-6)
  for method, obj in (("sequence_tis", importance.SequenceTIS(cap=1.5)),
                      ("masked_is", importance.MaskedIS(lo=0.5, hi=1.5, level="sequence")),
                      ("icepop", importance.IcePop(lo=0.5, hi=1.5))):
    assert importance.correction(method, cap=1.5, hi=1.5,
                                 level="sequence") == obj
    assert np.isfinite(float(pl.grpo_loss(l, b, adv, mask, correction=obj)[0]))


def test_correction_arguments_are_checked():
  l, b, mask, adv = _setup()
  with pytest.raises(TypeError, match="token_tis"):
    pl.grpo_loss(l, b, adv, mask, correction="token_tis")
  with pytest.raises(ValueError, match="level"):
    importance.MaskedIS(level="row")
  with pytest.raises(ValueError, match="cap"):
    importance.TokenTIS(cap=0.0)
  with pytest.raises(ValueError, match="lo <= hi"):
    importance.IcePop(lo=2.0, hi=1.0)
  with pytest.raises(ValueError, match="unknown IS method"):
    importance.correction("tis")
