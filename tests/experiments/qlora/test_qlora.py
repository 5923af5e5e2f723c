"""experiments.qlora: the corpus split, a tiny end-to-end run per method, the byte
counts by hand, the benchmark script, the sweep's declaration and its appendix."""

import dataclasses
import json
import math

import jax
import numpy as np
import pytest

from experiments.common.data import shakespeare
from experiments.common.evidence.tensorboard_reader import read_hparams_session, read_scalars
from experiments.common.harness.run_options import RunOptions
from experiments.qlora import appendix, bench_step
from experiments.qlora import experiment as ql
from launch import registry
from launch.manifest import expand, write_manifest
from lowprec.models import lora

HAMLET = "HAMLET, PRINCE OF DENMARK"
TINY = dict(d_model=64, num_layers=1, num_heads=2, d_ff=128, seq_len=16, batch_size=4,
            pretrain_steps=4, num_steps=4, warmup_steps=1, eval_every=2, eval_batches=1,
            log_every=1, rank=4)


def test_corpus_split_leaves_the_play_out_of_pretraining():
  text = shakespeare.load_text()
  spans = ql.play_spans(text)
  assert len(spans) > 30 and HAMLET in spans and "THE TEMPEST" in spans
  start, end = spans[HAMLET]
  assert text[start:end].lstrip().startswith(HAMLET)
  corpus = ql.load_corpus(HAMLET, 0.15)
  assert corpus.pretrain.size + corpus.finetune.size + corpus.evaluation.size == len(text)
  play = corpus.vocab.encode(text[start:end])
  np.testing.assert_array_equal(np.concatenate([corpus.finetune, corpus.evaluation]), play)
  assert corpus.evaluation.size == int(play.size * 0.15)
  # The pretraining text is the corpus with the play cut out (the parts joined).
  np.testing.assert_array_equal(corpus.pretrain[:100], corpus.vocab.encode(text[:100]))
  assert corpus.vocab.decode(corpus.pretrain[start - 5:start + 5]) == \
      text[start - 5:start] + text[end:end + 5]
  with pytest.raises(ValueError, match="no play titled"):
    ql.load_corpus("HAMLET", 0.15)


def test_config_validation():
  with pytest.raises(ValueError, match="method='lora' only"):
    ql.QLoRAConfig(method="full", base_format="bf16")
  with pytest.raises(ValueError, match="warmup_steps"):
    ql.QLoRAConfig(num_steps=10, warmup_steps=10)
  with pytest.raises(ValueError, match="nf4_block_size"):
    ql.QLoRAConfig(base_format="bf16", nf4_block_size=32)


def _nf4_kernel_bytes(n_in, n_out):  # codes, 8-bit scales, float32 absmax per 256, offset
  n_blocks = n_out * (n_in // 64)
  return n_in * n_out // 2 + n_blocks + 4 * math.ceil(n_blocks / 256) + 4


def test_runs_end_to_end_with_the_bytes_claimed(tmp_path):
  pre = str(tmp_path / "pretrain")
  rows = {}
  for name, kw in (("nf4", dict(base_format="nf4")), ("full", dict(method="full"))):
    config = ql.QLoRAConfig(**TINY, pretrain_dir=pre, **kw)
    options = RunOptions(workdir=str(tmp_path / name), single_process=True)
    rows[name] = ql.train_and_evaluate(config, options)
    scalars = read_scalars(str(tmp_path / name))
    assert [s for s, _ in scalars["eval/loss"]] == [0, 2, 4]
    assert scalars["eval/loss"][0][1] == rows[name]["metrics"]["finetune/eval_loss_before"]
    assert read_hparams_session(str(tmp_path / name))["status"] == "STATUS_SUCCESS"
    with open(tmp_path / name / "results.jsonl") as f:
      assert json.loads(f.read())["metrics"]["eval/loss"] == rows[name]["metrics"]["eval/loss"]
  assert len(list((tmp_path / "pretrain").glob("*.npz"))) == 1  # pretrained once, shared
  nf4, full = rows["nf4"]["metrics"], rows["full"]["metrics"]
  assert nf4["base/eval_loss"] == full["base/eval_loss"]
  assert full["finetune/eval_loss_before"] == pytest.approx(full["base/eval_loss"], abs=1e-6)
  assert nf4["base/unchanged"] == 1.0 and rows["nf4"]["frozen_digest"]
  # By hand: d = 64, f = 128; kernels qkv [64, 192], attn_out [64, 64], ff_in [64, 128],
  # ff_out [128, 64]; LoRA rank 4 trains r * (in + out) per kernel.
  shapes = ((64, 192), (64, 64), (64, 128), (128, 64))
  assert nf4["mem/trainable_params"] == sum(4 * (i + o) for i, o in shapes)
  assert nf4["mem/trainable_bytes"] == 4 * nf4["mem/trainable_params"]
  assert nf4["mem/target_kernel_bytes"] == sum(_nf4_kernel_bytes(i, o) for i, o in shapes)
  n_kernel = sum(i * o for i, o in shapes)
  rest = rows["full"]["num_params"] - n_kernel  # embeddings, norms, head: float32
  assert nf4["mem/frozen_bytes"] == nf4["mem/target_kernel_bytes"] + 4 * rest
  bf16_frozen = 2 * n_kernel + 4 * rest
  assert nf4["mem/frozen_bytes"] < bf16_frozen
  assert full["mem/frozen_bytes"] == 0
  assert full["mem/trainable_params"] == rows["full"]["num_params"]
  assert full["mem/target_kernel_bytes"] == 4 * n_kernel
  assert full["mem/target_bits_per_weight"] == 32.0
  # AdamW after clipping: two float32 moments per trained scalar plus counters.
  for m in (nf4, full):
    assert 8 * m["mem/trainable_params"] <= m["mem/optimizer_bytes"] <= \
        8 * m["mem/trainable_params"] + 64
    assert m["mem/weights_and_optimizer_bytes"] == (
        m["mem/frozen_bytes"] + m["mem/trainable_bytes"] + m["mem/optimizer_bytes"])


def test_adapters_are_the_only_trainable_leaves_and_the_base_is_an_argument():
  config = ql.QLoRAConfig(**TINY)
  model = config.model(84)
  params = ql._init_params(config, model)  # pylint: disable=protected-access
  setup = ql.make_setup(config, model, params)
  assert set(setup.trainable) == set(setup.frozen.kernels) and all(
      isinstance(a, lora.Adapter) for a in setup.trainable.values())
  tokens = np.zeros((2, 17), np.int32)
  batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "base": setup.frozen}
  loss, _ = jax.jit(setup.loss_fn)(setup.trainable, batch, jax.random.PRNGKey(0))
  # B = 0: the adapted model is the NF4 base; its loss equals the merged model's.
  merged = lora.merged_params(setup.frozen, setup.trainable, config.lora_config())
  full = ql.make_setup(dataclasses.replace(config, method="full"), model, merged)
  loss_full, _ = jax.jit(full.loss_fn)(full.trainable, batch, jax.random.PRNGKey(0))
  np.testing.assert_allclose(loss, loss_full, rtol=1e-5)


def test_bench_step_smoke():
  config = ql.QLoRAConfig(**{k: v for k, v in TINY.items()
                             if k in ("d_model", "num_layers", "num_heads", "d_ff",
                                      "seq_len", "batch_size", "rank")})
  result = bench_step.run(config, rounds=2, repeats=1, gemms=False)
  assert set(result["train_step"]) == set(bench_step.METHODS)
  assert result["train_step"]["bf16_lora"]["ratio"] == 1.0
  assert all(s["ms"] > 0 and s["ratio_min"] <= s["ratio"] <= s["ratio_max"]
             for s in result["train_step"].values())
  assert all(len(v) == 2 for v in result["per_round_s"].values())
  assert "bench_step.py" not in bench_step.format_table(result)


def test_dequantize_materialized_reads_the_compiled_hlo():
  w = jax.random.normal(jax.random.PRNGKey(0), (64, 32))
  q = bench_step.nf4.quantize_nf4(w, axis=0)
  x = np.ones((8, 64), np.float32)
  text = jax.jit(lambda x, q: jax.lax.dot(x, bench_step.nf4.dequantize_nf4(q))).lower(
      x, q).compile().as_text()
  assert bench_step.dequantize_materialized(text, 64, 32)
  plain = jax.jit(lambda x, w: jax.lax.dot(x, w)).lower(x, w).compile().as_text()
  assert not bench_step.dequantize_materialized(plain, 64, 32)


def test_speed_verdict_rules():
  assert appendix.speed_verdict([1.1, 1.2], 1.0, "slower") == "held"
  assert appendix.speed_verdict([0.9, 1.2], 1.0, "slower") == "not decided"
  assert appendix.speed_verdict([0.9, 0.95], 1.0, "slower") == "opposite"
  assert appendix.speed_verdict([1.0, 1.01], 1.02, "removes") == "held"
  assert appendix.speed_verdict([1.1, 1.2], 1.02, "removes") == "opposite"
  assert appendix.speed_verdict([], 1.0, "slower") == "not measured"


def test_sweep_declaration_expands(tmp_path):
  sweep = registry.get("qlora")
  assert sweep.baseline == "bf16_lora" and set(sweep.seeds).isdisjoint(
      sweep.calibration_seeds)
  runs = expand(sweep, str(tmp_path))
  assert len(runs) == 9 and {r.arm for r in runs} == {"nf4_lora", "bf16_lora", "full_ft"}
  configs = {r.arm: ql.QLoRAConfig(**r.config) for r in runs}
  assert configs["nf4_lora"].base_format == "nf4" and configs["full_ft"].method == "full"
  # Every run shares one pretrained base (the same cache key).
  assert len({ql.pretrain_digest(c) for c in configs.values()}) == 1
  assert configs["full_ft"].pretrain_seed not in sweep.seeds
  write_manifest(sweep, runs, str(tmp_path))
  text = appendix.qlora_appendix(str(tmp_path))  # no results yet: renders "no runs"
  assert "no runs" in text and "bench_step" in text
