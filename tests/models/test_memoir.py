"""Memoir model: halting, energy, arms matched in parameters and MACs, and the coupling."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.memoir import recall_task
from lowprec.models import memoir

SMALL = dict(key_dim=8, num_values=5, d_latent=16, d_mem=8, d_hidden=24, d_pred=12,
             max_steps=3)
SPEC = recall_task.RecallTaskSpec(num_pairs=5, key_dim=8, num_values=5)


def _batch(b=6):
  return recall_task.recall_batch(seed=0, position=0, batch_size=b, spec=SPEC)


def _init_apply(config, batch):
  model = memoir.Memoir(config)
  args = (batch["keys"], batch["values"], batch["query"])
  params = model.init(jax.random.PRNGKey(0), *args)["params"]
  return params, model.apply({"params": params}, *args)


def test_halting_distribution_sums_to_one_and_matches_formula():
  lam = jnp.array([[0.2, 0.9], [0.5, 0.1], [0.3, 0.4]])
  p = memoir.halting_distribution(lam)
  chex.assert_trees_all_close(p.sum(0), jnp.ones(2), atol=1e-6)
  chex.assert_trees_all_close(p[:, 0], jnp.array([0.2, 0.8 * 0.5, 0.8 * 0.5]), atol=1e-6)
  prior = memoir.geometric_prior(3, 0.3)
  chex.assert_trees_all_close(prior, jnp.array([0.3, 0.21, 0.49]), atol=1e-6)
  assert float(memoir.halting_kl(jnp.tile(prior[:, None], (1, 4)), prior)) == pytest.approx(
      0.0, abs=1e-6)
  assert float(memoir.halting_kl(p, prior)) > 0.01


def test_energy_terms_and_hinge():
  pred = jax.random.normal(jax.random.PRNGKey(1), (2, 4, 16))
  e_pos, e_neg = memoir.energy_terms(pred, pred)  # a perfect prediction
  chex.assert_trees_all_close(e_pos, jnp.zeros((2, 4)), atol=1e-5)
  assert float(e_neg.min()) > 0.5
  assert float(memoir.energy_hinge(e_pos, e_neg, margin=0.1)) == pytest.approx(0.0, abs=1e-6)
  assert float(memoir.energy_hinge(e_neg, e_pos, margin=0.1)) > 0.5
  # The future latent is a stop-gradient target: no gradient flows into it.
  g = jax.grad(lambda f: memoir.energy_terms(pred, f)[0].sum())(pred + 1.0)
  chex.assert_trees_all_close(g, jnp.zeros_like(g))
  with pytest.raises(ValueError, match="batch of at least 2"):
    memoir.energy_terms(pred[:, :1], pred[:, :1])


def test_arms_match_in_parameters_and_forward_macs():
  batch = _batch()
  p_c, out_c = _init_apply(memoir.MemoirConfig(mode="coupled", **SMALL), batch)
  read_only = memoir.Memoir(memoir.MemoirConfig(mode="read_only", **SMALL))
  p_r = jax.eval_shape(lambda: read_only.init(jax.random.PRNGKey(0), batch["keys"],
                                              batch["values"], batch["query"]))["params"]
  out_r = read_only.apply({"params": p_c}, batch["keys"], batch["values"], batch["query"])
  assert jax.tree.structure(p_c) == jax.tree.structure(p_r)
  chex.assert_trees_all_equal_shapes(p_c, p_r)
  assert memoir.count_params(p_c) == memoir.count_params(p_r)
  macs = {m: memoir.forward_macs(memoir.MemoirConfig(mode=m, **SMALL), SPEC.num_pairs)
          for m in memoir.MODES}
  assert macs["coupled"] == macs["read_only"]
  # XLA's own count of the compiled forward agrees that the arms do the same work.
  flops = {}
  for mode in ("coupled", "read_only"):
    model = memoir.Memoir(memoir.MemoirConfig(mode=mode, **SMALL))
    fwd = jax.jit(lambda p, b, model=model: model.apply({"params": p}, b["keys"],
                                                        b["values"], b["query"]))
    flops[mode] = fwd.lower(p_c, batch).cost_analysis()["flops"]
  assert flops["coupled"] == flops["read_only"]
  assert flops["coupled"] >= 2 * 6 * macs["coupled"]  # batch 6, 2 flops per MAC
  # Same parameters, same inputs: the first write already changes what coupled reads.
  assert not np.allclose(out_c["logits"], out_r["logits"])


def test_no_write_control_matches_live_parameters_and_writes_nothing():
  """no_write: no write heads, a wider core with (nearly) the coupled arm's parameters."""
  batch = _batch()
  full = memoir.MemoirConfig(mode="coupled", **SMALL)
  p_c, _ = _init_apply(full, batch)
  control = memoir.MemoirConfig(**{**SMALL, "mode": "no_write",
                                   "d_hidden": memoir.matched_hidden(full)})
  p_n, out_n = _init_apply(control, batch)
  assert not {"write_key", "write_value", "write_beta"} & set(p_n)
  heads = sum(memoir.count_params(p_c[k]) for k in ("write_key", "write_value", "write_beta"))
  assert heads == memoir.write_head_params(full)
  per_unit = 2 * SMALL["d_latent"] + SMALL["d_mem"] + 1
  assert abs(memoir.count_params(p_n) - memoir.count_params(p_c)) <= per_unit // 2
  chex.assert_trees_all_close(out_n["drift"], jnp.zeros(6))
  # declared MACs: the coupled forward less the writes, plus the wider core's
  macs_c = memoir.forward_macs(full, SPEC.num_pairs)
  macs_n = memoir.forward_macs(control, SPEC.num_pairs)
  extra = control.d_hidden - full.d_hidden
  write = 2 * 16 * 8 + 16 + 2 * 8 * 8
  assert macs_n == macs_c + 3 * (extra * (16 + 8 + 16) - write)
  # the default sizes: 4225 write-head parameters, 26 hidden units of 161
  default = memoir.MemoirConfig()
  assert memoir.write_head_params(default) == 4225 and memoir.matched_hidden(default) == 346


def test_default_size_is_about_80k_parameters():
  config = memoir.MemoirConfig()
  model = memoir.Memoir(config)
  b = recall_task.recall_batch(seed=0, position=0, batch_size=2,
                               spec=recall_task.RecallTaskSpec())
  shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), b["keys"], b["values"],
                                             b["query"]))["params"]
  assert memoir.count_params(shapes) == 79_603


def test_read_only_reads_the_written_stream_only():
  """Read-only output does not depend on the pondering write parameters; coupled does."""
  batch = _batch()
  for mode, should_change in (("read_only", False), ("coupled", True)):
    config = memoir.MemoirConfig(mode=mode, **SMALL)
    params, out = _init_apply(config, batch)
    params = jax.tree_util.tree_map(lambda x: x, params)
    params["write_value"]["kernel"] = params["write_value"]["kernel"] * 3.0
    out2 = memoir.Memoir(config).apply({"params": params}, batch["keys"], batch["values"],
                                       batch["query"])
    changed = not np.allclose(out["logits"], out2["logits"])
    assert changed == should_change, mode
    assert float(out2["drift"].mean()) > 0.0  # both arms do write (real or shadow memory)


def test_loss_metrics_and_fixed_depth():
  batch = _batch()
  config = memoir.MemoirConfig(halting="fixed", **SMALL)
  _, out = _init_apply(config, batch)
  chex.assert_trees_all_close(out["halt_p"][-1], jnp.ones(6))
  loss, metrics = memoir.memoir_loss(config, out, jnp.asarray(batch["target"]))
  assert float(metrics["expected_depth"]) == pytest.approx(3.0)
  assert float(metrics["kl"]) == 0.0
  assert 0.0 <= float(metrics["recall"]) <= 1.0
  assert np.isfinite(float(loss))
  np.testing.assert_allclose(float(metrics["energy_margin"]),
                             float(metrics["e_neg"]) - float(metrics["e_pos"]), atol=1e-6)


def test_config_and_input_validation():
  with pytest.raises(ValueError, match="mode"):
    memoir.MemoirConfig(mode="sometimes")
  with pytest.raises(ValueError, match="prior_lambda"):
    memoir.MemoirConfig(prior_lambda=1.0)
  with pytest.raises(ValueError, match="num_pairs"):
    memoir.forward_macs(memoir.MemoirConfig(), 0)
  batch = _batch()
  model = memoir.Memoir(memoir.MemoirConfig(**SMALL))
  with pytest.raises(ValueError, match="query"):
    model.init(jax.random.PRNGKey(0), batch["keys"], batch["values"], batch["query"][:, :3])
