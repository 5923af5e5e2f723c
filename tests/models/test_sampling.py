"""models.sampling: the processed distribution by hand, and sampled log-probs."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lowprec.models import sampling

LOGITS = jnp.log(jnp.array([1.0, 2.0, 4.0]))  # probabilities 1/7, 2/7, 4/7


@pytest.mark.parametrize("kwargs,probs", [
    ({}, [1 / 7, 2 / 7, 4 / 7]),
    ({"temperature": 2.0}, np.sqrt([1.0, 2.0, 4.0]) / np.sqrt([1.0, 2.0, 4.0]).sum()),
    ({"top_k": 2}, [0, 1 / 3, 2 / 3]),
    ({"top_k": 1}, [0, 0, 1]),
    ({"top_p": 0.5}, [0, 0, 1]),        # the top token alone holds 4/7 >= 0.5
    ({"top_p": 0.6}, [0, 1 / 3, 2 / 3]),  # 4/7 < 0.6: the second token is needed
    ({"top_p": 0.9}, [1 / 7, 2 / 7, 4 / 7]),  # 6/7 < 0.9
    # top-p acts on the renormalised top-k distribution: 2/3 >= 0.6 keeps one token.
    ({"top_k": 2, "top_p": 0.6}, [0, 0, 1]),
    ({"top_k": 2, "top_p": 0.7}, [0, 1 / 3, 2 / 3]),
])
def test_processed_distribution_by_hand(kwargs, probs):
  got = np.exp(np.asarray(sampling.processed_log_probs(LOGITS, **kwargs)))
  np.testing.assert_allclose(got, probs, rtol=1e-6, atol=1e-7)


def test_top_p_is_per_row():
  logits = jnp.stack([LOGITS, LOGITS[::-1]])
  got = np.exp(np.asarray(sampling.processed_log_probs(logits, top_p=0.5)))
  np.testing.assert_allclose(got, [[0, 0, 1], [1, 0, 0]], atol=1e-7)


def test_validation():
  for kwargs in ({"temperature": 0.0}, {"top_k": -1}, {"top_p": 0.0}, {"top_p": 1.5}):
    with pytest.raises(ValueError):
      sampling.processed_log_probs(LOGITS, **kwargs)
  apply = lambda p, t, k: jnp.zeros(t.shape + (3,))
  with pytest.raises(ValueError, match="prompts"):
    sampling.sample(apply, None, jnp.zeros((2,), jnp.int32), 3, jax.random.key(0))
  with pytest.raises(ValueError, match="num_new"):
    sampling.sample(apply, None, jnp.zeros((2, 1), jnp.int32), 0, jax.random.key(0))


def _bigram(table):
  # A causal "model": the logits at each position depend on that position's token only.
  return lambda params, tokens, key: params[tokens]


def test_recorded_logp_is_the_processed_distribution_and_recomputes():
  table = jax.random.normal(jax.random.key(1), (5, 5)) * 2.0
  apply = _bigram(table)
  prompts = jnp.array([[0], [3]] * 8, jnp.int32)
  for kwargs in ({}, {"temperature": 0.7}, {"top_k": 2}, {"top_p": 0.8, "temperature": 0.8}):
    out = sampling.sample(apply, table, prompts, 6, jax.random.key(2), **kwargs)
    chex.assert_shape(out.tokens, (16, 7))
    chex.assert_shape(out.logp, (16, 6))
    np.testing.assert_array_equal(out.tokens[:, :1], prompts)
    prev, nxt = out.tokens[:, :-1], out.tokens[:, 1:]
    expected = jnp.take_along_axis(
        sampling.processed_log_probs(table[prev], **kwargs), nxt[..., None], -1)[..., 0]
    # Equal up to the last ulp: XLA's log_softmax may differ by 1 ulp between shapes.
    np.testing.assert_allclose(out.logp, expected, rtol=0, atol=1e-6)
    assert np.all(np.isfinite(out.logp))  # never draws an excluded token
    again = sampling.sequence_log_probs(apply, table, out.tokens, 1, jax.random.key(0),
                                        **kwargs)
    np.testing.assert_allclose(again, out.logp, rtol=0, atol=1e-6)


def test_sampling_frequencies_match_the_tempered_distribution():
  # 4000 draws of one step; each frequency within 5 sigma (false-failure prob < 1e-5).
  table = jnp.stack([LOGITS] * 3)
  prompts = jnp.zeros((4000, 1), jnp.int32)
  out = sampling.sample(_bigram(table), table, prompts, 1, jax.random.key(3),
                        temperature=2.0)
  freq = np.bincount(np.asarray(out.tokens[:, 1]), minlength=3) / 4000
  p = np.sqrt([1.0, 2.0, 4.0]) / np.sqrt([1.0, 2.0, 4.0]).sum()
  assert np.all(np.abs(freq - p) < 5 * np.sqrt(p * (1 - p) / 4000))


def test_same_key_same_samples_and_jit():
  table = jax.random.normal(jax.random.key(1), (5, 5))
  prompts = jnp.zeros((4, 2), jnp.int32)
  f = jax.jit(lambda k: sampling.sample(_bigram(table), table, prompts, 4, k))
  a, b = f(jax.random.key(5)), f(jax.random.key(5))
  np.testing.assert_array_equal(a.tokens, b.tokens)
  assert not np.array_equal(a.tokens, f(jax.random.key(6)).tokens)
