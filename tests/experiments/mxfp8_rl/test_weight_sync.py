"""experiments.mxfp8_rl.weight_sync: each check passes a correct sync and catches a planted bug.

A tiny DecoderLM (vocab 16, d_model 48 so the MXFP8 contraction axis is zero-padded,
1 layer) plays learner (float32 masters, recipe fp32/bf16/mxfp8 on the projections)
and sampler (the served export of the masters, run in its own recipe).
"""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lowprec import models
from lowprec.models import sampling
from lowprec.models import transformer as tfm
from lowprec.numerics import blockscale
from lowprec.numerics import qdot
from lowprec.numerics import quantizer
from lowprec.numerics.rl import sampler_copy as sc
from lowprec.numerics import tree_paths
from experiments.common.trainers import recipe_flag
from experiments.mxfp8_rl import parity_tolerances
from experiments.mxfp8_rl import serving
from experiments.mxfp8_rl import weight_sync as ws

CFG = tfm.TransformerConfig(vocab_size=16, d_model=48, num_layers=1, num_heads=4, d_ff=96,
                            max_len=64)
PROMPT, LENGTH = 4, 12
FP32_LEAVES = ("*embed*", "*norm*")  # served in full precision
DTYPES = {"fp32": jnp.float32, "bf16": jnp.bfloat16, "mxfp8": jnp.bfloat16}
QKV = "params/block_0/qkv/kernel"


def _keep(recipe):
  return () if recipe == "fp32" else ("*/head/*",)  # the LM head stays bf16


def _plan(params, recipe, keep=None):
  return serving.resolve_layer_plan(params, recipe, _keep(recipe) if keep is None else keep,
                               keep_fp32=FP32_LEAVES)


@functools.lru_cache(None)
def _logits_fn(recipe):
  """jit ``(params, tokens) -> logits``: the experiments' rules for ``recipe``
  (projections in it; attention and the head in bf16 unless it is fp32)."""
  model = recipe_flag.quantized_model(tfm.DecoderLM(CFG), recipe)
  return jax.jit(lambda p, t: model.apply(p, t, jax.random.key(0)))


def _logp(recipe, params, tokens):
  lf = _logits_fn(recipe)
  return sampling.sequence_log_probs(lambda p, t, k: lf(p, t), params, tokens, PROMPT,
                                     None)


def _export(plan):
  """The serving export for ``plan``: fp32 / bf16 casts, MXFP8 QDQ held in bf16."""

  def serve(params):
    leaves, tree = jax.tree_util.tree_flatten(params)
    out = []
    for name, leaf in zip(tree_paths.named_leaves(params), leaves):
      r = plan[name]
      if r == "mxfp8":
        out.append(serving.served_mx_weight(leaf, axis=-2).astype(jnp.bfloat16))
      else:
        out.append(leaf.astype(DTYPES[r]))
    return jax.tree_util.tree_unflatten(tree, out)

  return serve


def _init(seed=0):
  """DecoderLM params drawn as its initializers do, in numpy (no init compile)."""
  shapes = jax.eval_shape(lambda: tfm.DecoderLM(CFG).init(
      jax.random.key(0), jnp.zeros((1, LENGTH), jnp.int32), jax.random.key(0)))
  rng = np.random.default_rng(seed)
  residual = (2.0 * CFG.num_layers) ** -0.5

  def draw(name, leaf):
    if name.endswith("scale"):
      return jnp.ones(leaf.shape, jnp.float32)
    std = {"params/embed/embedding": 1.0, "params/pos_embed": 0.02}.get(name)
    if std is None:
      std = leaf.shape[0] ** -0.5 * (residual if "attn_out" in name or "ff_out" in name
                                     else 1.0)
    return jnp.asarray(rng.normal(0.0, std, leaf.shape), jnp.float32)

  leaves, tree = jax.tree_util.tree_flatten(shapes)
  return jax.tree_util.tree_unflatten(
      tree, [draw(n, l) for n, l in zip(tree_paths.named_leaves(shapes), leaves)])


def _set(tree, name, value):
  leaves, td = jax.tree_util.tree_flatten(tree)
  names = list(tree_paths.named_leaves(tree))
  leaves[names.index(name)] = value
  return jax.tree_util.tree_unflatten(td, leaves)


@pytest.fixture(scope="module")
def params():
  return _init(0)


@pytest.fixture(scope="module")
def probe():
  tokens = jnp.asarray(np.random.default_rng(7).integers(1, CFG.vocab_size, (8, LENGTH)),
                       jnp.int32)
  return tokens, jnp.ones((8, LENGTH - PROMPT))


@pytest.fixture(scope="module")
def stale(params):
  """The masters after 4 SGD steps (lr 0.1) of a bf16 learner: (step 1, step 4)."""
  model = models.quantize_model(tfm.DecoderLM(CFG), [models.Rule(".*", "bf16")])
  data = jnp.asarray(np.random.default_rng(9).integers(0, CFG.vocab_size, (16, LENGTH + 1)),
                     jnp.int32)

  @jax.jit
  def step(p):
    loss = lambda p: tfm.next_token_loss(model.apply(p, data[:, :-1], jax.random.key(0)),
                                         data[:, 1:])[0]
    return jax.tree.map(lambda w, g: w - 0.1 * g, p, jax.grad(loss)(p))

  out, p = [], params
  for _ in range(4):
    p = step(p)
    out.append(p)
  return out[0], out[3]


# ------------------------------------------------------------------ 1. coverage


def test_coverage_passes(params):
  served = _export(_plan(params, "mxfp8"))(params)
  m = ws.check_coverage(params, served)
  assert m["num_tensors"] == len(tree_paths.named_leaves(params)) == 10


def test_coverage_catches_dropped_and_renamed_tensor(params):
  served = _export(_plan(params, "mxfp8"))(params)
  dropped = jax.tree.map(lambda x: x, served)
  del dropped["params"]["block_0"]["ff_out"]
  with pytest.raises(ws.WeightSyncError, match=r"1 missing .*block_0/ff_out/kernel"):
    ws.check_coverage(params, dropped)
  renamed = jax.tree.map(lambda x: x, served)
  renamed["params"]["lm_head"] = renamed["params"].pop("head")
  with pytest.raises(ws.WeightSyncError,
                     match=r"missing .*params/head/kernel.*extra .*params/lm_head/kernel"):
    ws.check_coverage(params, renamed)
  reshaped = _set(served, QKV, served["params"]["block_0"]["qkv"]["kernel"][:, :48])
  with pytest.raises(ws.WeightSyncError, match=r"mis-shaped: .*qkv/kernel .*\(48, 144\)"):
    ws.check_coverage(params, reshaped)


# ---------------------------------------------------------------------- 2. plan


def test_plan_resolution_and_check_pass(params):
  plan = _plan(params, "mxfp8", keep=("*/head/*", "*/qkv/*"))
  assert plan[QKV] == plan["params/head/kernel"] == "bf16"
  assert plan["params/block_0/ff_in/kernel"] == "mxfp8"
  assert plan["params/embed/embedding"] == plan["params/block_0/attn_norm/scale"] == "fp32"
  served = _export(plan)(params)
  m = ws.check_plan(plan, dict(plan), served, DTYPES)
  assert (m["layers_bf16"], m["layers_mxfp8"], m["layers_fp32"]) == (2, 3, 5)


def test_plan_catches_fused_name_matched_on_one_side_only(params):
  learner = _plan(params, "mxfp8", keep=("*/qkv/*",))    # fused name: matches
  sampler = _plan(params, "mxfp8", keep=("*/query/*",))  # unfused name: matches nothing
  served = _export(sampler)(params)
  with pytest.raises(ws.WeightSyncError,
                     match=r"1 layer\(s\) in different recipes: params/block_0/qkv/kernel "
                           r"\(learner bf16, served mxfp8\)"):
    ws.check_plan(sampler, learner, served, DTYPES)
  with pytest.raises(ValueError, match=r"\*/query/\*.* match no parameter"):
    serving.resolve_layer_plan(params, "mxfp8", ("*/query/*",), strict=True)


def test_plan_catches_served_dtype_mismatch(params):
  plan = _plan(params, "mxfp8")
  served = _export(plan)(params)
  wrong = _set(served, "params/head/kernel", params["params"]["head"]["kernel"])  # float32
  with pytest.raises(ws.WeightSyncError,
                     match=r"params/head/kernel \(bf16: expected bfloat16, "
                           r"served float32\)"):
    ws.check_plan(plan, plan, wrong, DTYPES)


# ------------------------------------------------------------------- 3. bitwise


def test_bitwise_passes(params):
  export = _export(_plan(params, "mxfp8"))
  copy = sc.initial_copy(params, export)
  assert ws.check_bitwise(copy.params, export(params))["bitwise_elements"] > 0


def test_bitwise_catches_one_ulp_and_signed_zero(params):
  export = _export(_plan(params, "bf16"))
  want = export(params)
  w = want["params"]["block_0"]["ff_in"]["kernel"]
  bits = jax.lax.bitcast_convert_type(w, jnp.uint16)
  one_ulp = jax.lax.bitcast_convert_type(bits.at[3, 5].add(1), jnp.bfloat16)
  with pytest.raises(ws.WeightSyncError,
                     match=r"ff_in/kernel \(1 of 4608 elements differ, max abs diff "
                           r"[0-9.e-]+, first at \(3, 5\)"):
    ws.check_bitwise(_set(want, "params/block_0/ff_in/kernel", one_ulp), want)
  zeroed = _set(params, "params/block_0/ff_in/kernel",
                params["params"]["block_0"]["ff_in"]["kernel"].at[0, 0].set(0.0))
  want0 = export(zeroed)
  neg = want0["params"]["block_0"]["ff_in"]["kernel"].at[0, 0].set(-0.0)
  served = _set(want0, "params/block_0/ff_in/kernel", neg)
  np.testing.assert_array_equal(neg, want0["params"]["block_0"]["ff_in"]["kernel"])
  with pytest.raises(ws.WeightSyncError,
                     match=r"1 of 4608 elements differ, max abs diff 0,"):
    ws.check_bitwise(served, want0)


# ------------------------------------------------------------------- 4. version


TINY = {"w": jnp.arange(4, dtype=jnp.float32) / 3}


def test_version_passes_on_refreshes():
  params, export = TINY, sc.cast_export(jnp.bfloat16)
  prev = sc.initial_copy(params, export, 0)
  assert ws.check_version(None, prev, 0) == {"version": 0.0, "syncs": 1.0,
                                             "version_advance": 1.0}
  for step in (3, 6):
    cur = sc.maybe_refresh(prev, params, step, 3, export)
    m = ws.check_version(prev, cur, step)
    assert (m["version"], m["syncs"], m["version_advance"]) == (step, step // 3 + 1, 3)
    prev = cur


def test_version_catches_no_advance():
  params, export = TINY, sc.cast_export(jnp.bfloat16)
  first = sc.initial_copy(params, export, 0)
  again = sc.maybe_refresh(first, params, 0, 3, export)  # re-synced at the same step
  with pytest.raises(ws.WeightSyncError, match=r"version did not advance \(0 -> 0\)"):
    ws.check_version(first, again, 0)
  not_refreshed = sc.maybe_refresh(first, params, 2, 3, export)  # not due: unchanged
  with pytest.raises(ws.WeightSyncError,
                     match=r"version 0 != learner step 2; version did not advance "
                           r"\(0 -> 0\); syncs 1 -> 1, expected 2"):
    ws.check_version(first, not_refreshed, 2)


# -------------------------------------------------------------------- 5. parity


@pytest.mark.parametrize("recipe", serving.RECIPES)
def test_parity_same_recipe_is_exact(params, probe, recipe):
  tokens, mask = probe
  served = _export(_plan(params, recipe))(params)
  sl, ll = _logp(recipe, served, tokens), _logp(recipe, params, tokens)
  np.testing.assert_array_equal(sl, ll)  # identical log-probs, not merely close
  m = ws.check_logprob_parity(sl, ll, mask, pair=(recipe, recipe))
  assert m == {"k1": 0.0, "k3": 0.0, "max_abs_delta_logp": 0.0}


def test_parity_cross_recipe_tolerances_hold_on_a_new_seed(probe):
  p = _init(123)
  tokens, mask = probe
  for learner in serving.RECIPES:
    ll = _logp(learner, p, tokens)
    for sampler in serving.RECIPES:
      sl = _logp(sampler, _export(_plan(p, sampler))(p), tokens)
      m = ws.check_logprob_parity(sl, ll, mask, pair=(learner, sampler))
      assert (m["k3"] > 0) == (learner != sampler)
  assert set(parity_tolerances.PARITY_TOLERANCES) == {(a, b) for a in serving.RECIPES for b in serving.RECIPES}


def test_parity_bf16_learner_mxfp8_sampler_needs_its_own_tolerance(params, probe):
  tokens, mask = probe
  sl = _logp("mxfp8", _export(_plan(params, "mxfp8"))(params), tokens)
  ll = _logp("bf16", params, tokens)
  m = ws.check_logprob_parity(sl, ll, mask, pair=("bf16", "mxfp8"))
  assert 0 < m["k3"] <= parity_tolerances.PARITY_TOLERANCES[("bf16", "mxfp8")].k3
  with pytest.raises(ws.WeightSyncError,
                     match=r"logprob parity \(bf16 learner, bf16 sampler\): k3 .* > 1e-10"):
    ws.check_logprob_parity(sl, ll, mask, pair=("bf16", "bf16"))
  with pytest.raises(ValueError, match="no parity tolerance"):
    ws.check_logprob_parity(sl, ll, mask, pair=("bf16", "nvfp4"))


def test_parity_catches_stale_sampler(params, probe, stale):
  tokens, mask = probe
  after_1, after_4 = stale
  # The sampler still serves the step-0 weights; the learner moved on.
  sl = _logp("bf16", _export(_plan(params, "bf16"))(params), tokens)
  with pytest.raises(ws.WeightSyncError, match=r"k3 .* > 1e-10, max\|dlogp\| .* > 1e-05"):
    ws.check_logprob_parity(sl, _logp("bf16", after_1, tokens), mask, pair=("bf16", "bf16"))
  # Across recipes the default gate is calibrated on trained models (k3 0.5): four
  # steps stale on this random model stays under it, as the planted faults did in the
  # mxfp8_rl_faults sweep; a gate at this model's own clean level (5e-3 / 0.5, about
  # 6x / 3.5x the worst measured on it) catches it.
  sl = _logp("mxfp8", _export(_plan(params, "mxfp8"))(params), tokens)
  stale_4 = _logp("bf16", after_4, tokens)
  ws.check_logprob_parity(sl, stale_4, mask, pair=("bf16", "mxfp8"))
  tight = {**parity_tolerances.PARITY_TOLERANCES,
           ("bf16", "mxfp8"): parity_tolerances.Tolerance(5e-3, 0.5)}
  with pytest.raises(ws.WeightSyncError, match=r"\(bf16 learner, mxfp8 sampler\): k3 .* > "
                                               r"0.005, max\|dlogp\| .* > 0.5"):
    ws.check_logprob_parity(sl, stale_4, mask, pair=("bf16", "mxfp8"), tolerances=tight)


# --------------------------------------------------------- 6. finite, MX scales


def test_finite_and_mx_scales_pass_on_served_weights(params):
  plan = _plan(params, "mxfp8")
  served = _export(plan)(params)
  assert ws.check_finite(served)["finite_elements"] > 0
  mx = [n for n, r in plan.items() if r == "mxfp8"]
  assert len(mx) == 4
  for name in mx:
    m = ws.check_mx_scales(tree_paths.named_leaves(served)[name], axis=-2, name=name)
    assert m["mx_blocks"] > 0 and -127 <= m["mx_min_scale_exp"] <= m["mx_max_scale_exp"]


def test_finite_catches_nan(params):
  served = _export(_plan(params, "mxfp8"))(params)
  w = served["params"]["block_0"]["attn_out"]["kernel"]
  bad = _set(served, "params/block_0/attn_out/kernel", w.at[7, 2].set(jnp.nan))
  with pytest.raises(ws.WeightSyncError,
                     match=r"attn_out/kernel \(1 NaN, 0 Inf of 2304; first at \(7, 2\)\)"):
    ws.check_finite(bad)
  with pytest.raises(ws.WeightSyncError,
                     match=r"1 of 96 block\(s\) get the NaN scale code .* at \(0, 2\)"):
    ws.check_mx_scales(bad["params"]["block_0"]["attn_out"]["kernel"], axis=-2)


def test_mx_scales_catch_out_of_range_block_and_unquantized_weight(params):
  w = serving.served_mx_weight(params["params"]["block_0"]["ff_in"]["kernel"], axis=-2)
  # Column 3's 16-long (zero-padded) block holds only ~1e-37: it needs a scale of 2^-131.
  tiny = w.at[32:, 3].set(jnp.where(w[32:, 3] < 0, -1e-37, 1e-37))
  with pytest.raises(ws.WeightSyncError,
                     match=r"1 of 192 block\(s\) need a scale outside \[2\^-127, 2\^127\] "
                           r"\(needed 2\^-131\.\.2\^-131, .* starting at \(32, 3\)"):
    ws.check_mx_scales(tiny, axis=-2, name="ff_in")
  raw = params["params"]["block_0"]["ff_in"]["kernel"]  # fp32 master, never quantized
  with pytest.raises(ws.WeightSyncError, match=r"not representable in e4m3 at their block"):
    ws.check_mx_scales(raw, axis=-2, name="ff_in")


def test_served_mx_weight_zero_padding_leaves_real_elements_alone(params):
  w = params["params"]["block_0"]["qkv"]["kernel"]  # [48, 144], contraction axis 0
  served = serving.served_mx_weight(w, axis=0)
  assert blockscale.pad_to_multiple(w, (0,), (32,)).shape == (64, 144)
  qdq = lambda x: blockscale.quantize_dequantize_mx(x, "e4m3", block_shape=32, axis=0,
                                                    scale_rule="rceil")
  np.testing.assert_array_equal(served[:32], qdq(w[:32]))
  np.testing.assert_array_equal(served[32:], qdq(jnp.pad(w[32:], ((0, 16), (0, 0))))[:16])
  # The mxfp8 recipe's forward GEMM quantizes the kernel to the same values, and
  # re-quantizing the served weight changes nothing (same-recipe parity is exact).
  np.testing.assert_array_equal(served, qdot.forward_weight_quantizer("mxfp8")(w))
  chex.assert_trees_all_equal(serving.served_mx_weight(served, axis=0), served)


# ------------------------------------------------------------------- 7. padding


def test_padding_invariance_passes_under_mxfp8(params, probe):
  served = _export(_plan(params, "mxfp8"))(params)
  m = ws.check_padding_invariance(_logits_fn("mxfp8"), served, probe[0])
  assert m == {"padding_max_abs_diff": 0.0, "padded_length": 32.0}


def test_padding_invariance_catches_tensor_scale_over_pad_tokens(params, probe):
  # An FP8 "current scaling" quantizer takes one amax over all activations, pad
  # positions included: a large pad embedding then coarsens the real tokens' values.
  spec = quantizer.QuantSpec(fmt="e4m3", scaling="tensor")

  @jax.jit
  def logits_fn(p, tokens):
    x = p["params"]["embed"]["embedding"][tokens]  # [B, L, D]
    return quantizer.quantize_dequantize(x, spec) @ p["params"]["head"]["kernel"]

  ws.check_padding_invariance(logits_fn, params, probe[0])  # pad row 0 is ordinary
  emb = params["params"]["embed"]["embedding"]
  big_pad = _set(params, "params/embed/embedding", emb.at[0].set(1e3))
  with pytest.raises(ws.WeightSyncError,
                     match=r"padding \[8, 12\] tokens to \[8, 32\] with id 0 changes real "
                           r"logits: .* max abs diff"):
    ws.check_padding_invariance(logits_fn, big_pad, probe[0])


# ---------------------------------------------------------------- all together


def _sync_kwargs(params, plan, probe):
  tokens, mask = probe
  return dict(export=_export(plan), learner_plan=plan, served_plan=dict(plan),
              expected_dtypes=DTYPES,
              learner_logp_fn=lambda p: _logp("bf16", p, tokens),
              sampler_logp_fn=lambda p: _logp("mxfp8", p, tokens), mask=mask,
              pair=("bf16", "mxfp8"), logits_fn=_logits_fn("mxfp8"), probe_tokens=tokens)


def test_run_sync_checks_passes_and_merges_metrics(params, probe, stale):
  plan = _plan(params, "mxfp8")
  kw = _sync_kwargs(params, plan, probe)
  first = sc.initial_copy(params, kw["export"], 0)
  m = ws.run_sync_checks(params, None, first, 0, **kw)
  assert m["sync/num_tensors"] == 10 and m["sync/mx_tensors"] == 4
  assert m["sync/syncs"] == 1 and 0 < m["sync/k3"] <= 5e-3
  assert m["sync/padding_max_abs_diff"] == 0.0
  assert all(k.startswith("sync/") for k in m)
  learner = stale[1]
  second = sc.maybe_refresh(first, learner, 4, 4, kw["export"])
  assert ws.run_sync_checks(learner, first, second, 4, **kw)["sync/version"] == 4


def test_run_sync_checks_fails_on_a_stale_copy(params, probe, stale):
  plan = _plan(params, "mxfp8")
  kw = _sync_kwargs(params, plan, probe)
  first = sc.initial_copy(params, kw["export"], 0)
  skipped = first._replace(version=jnp.int32(4), syncs=jnp.int32(2))  # bumped, not copied
  with pytest.raises(ws.WeightSyncError, match=r"bitwise: \d+ tensor\(s\) differ"):
    ws.run_sync_checks(stale[1], first, skipped, 4, **kw)


def test_record_mode_logs_every_check_and_its_statistics_without_raising(params, probe,
                                                                         stale):
  plan = _plan(params, "mxfp8")
  kw = _sync_kwargs(params, plan, probe)
  first = sc.initial_copy(params, kw["export"], 0)
  clean = ws.run_sync_checks(params, None, first, 0, record=True, **kw)
  assert {k for k in clean if k.startswith("sync/fired/")} == {
      f"sync/fired/{c}" for c in ws.CHECKS}
  assert all(clean[f"sync/fired/{c}"] == 0.0 for c in ws.CHECKS)
  assert clean["sync/stat/bitwise_differing"] == 0.0
  assert clean["sync/stat/version_offset"] == 0.0
  assert clean["sync/stat/parity_k3"] == clean["sync/k3"] > 0
  assert clean["sync/stat/padding_max_abs_diff"] == 0.0
  # The stale copy: bitwise fires (and the run goes on); the statistic counts the
  # differing elements; a parity gate below the measured k3 fires too.
  skipped = first._replace(version=jnp.int32(4), syncs=jnp.int32(2))
  tight = {("bf16", "mxfp8"): ws.Tolerance(1e-12, 1e-12)}
  m = ws.run_sync_checks(stale[1], first, skipped, 4, record=True,
                         **{**kw, "tolerances": tight})
  assert m["sync/fired/bitwise"] == 1.0 and m["sync/fired/parity"] == 1.0
  assert m["sync/fired/coverage"] == m["sync/fired/version"] == 0.0
  assert m["sync/stat/bitwise_differing"] == ws.differing_elements(
      first.params, kw["export"](stale[1])) > 0
  assert "sync/k3" not in m and m["sync/stat/parity_k3"] > 0
  # A padding gate below the statistic fires in record mode as it raises otherwise.
  leaky = ws.run_sync_checks(params, None, first, 0, record=True,
                             **{**kw, "padding_atol": -1.0})
  assert leaky["sync/fired/padding"] == 1.0


def test_differing_elements_counts_bits_and_missing_tensors():
  a = {"w": jnp.array([0.0, 1.0, 2.0], jnp.float32), "v": jnp.ones((2,), jnp.bfloat16)}
  b = {"w": jnp.array([-0.0, 1.0, 3.0], jnp.float32)}  # -0.0 differs in its bits
  assert ws.differing_elements(a, a) == 0
  assert ws.differing_elements(a, b) == 2 + 2  # two elements, and v missing
  assert ws.differing_elements(a, {**b, "v": jnp.ones((2,), jnp.float32)}) == 2 + 2
