"""orbax checkpoints: exact round trip and the resume/overwrite policy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.common.harness.checkpoint import Checkpointer, Snapshot
from experiments.common.harness.train_loop import restore_or_initialize


def _snapshot(step=0, scale=1.0):
  state = {"w": jnp.arange(6, dtype=jnp.float32).reshape(2, 3) * scale,
           "b": jnp.ones(3, jnp.bfloat16) * scale, "count": jnp.array(step, jnp.int32)}
  return Snapshot(state=state, rng=jax.random.PRNGKey(step), step=step, data_position=step * 2)


def test_roundtrip_exact(tmp_path):
  ck = Checkpointer(str(tmp_path / "ck"), max_to_keep=2)
  snap = _snapshot(5, 1.7)
  ck.save(snap)
  restored = ck.restore(_snapshot().state, _snapshot().rng)
  assert restored.step == 5 and restored.data_position == 10
  for k in snap.state:
    assert restored.state[k].dtype == snap.state[k].dtype
    np.testing.assert_array_equal(restored.state[k], snap.state[k])
  np.testing.assert_array_equal(restored.rng, snap.rng)
  ck.save(_snapshot(6)); ck.save(_snapshot(7))
  assert ck.all_steps() == [6, 7]  # max_to_keep
  ck.close()


def test_restore_or_initialize_policy(tmp_path):
  d = str(tmp_path / "ck")
  ck = Checkpointer(d)
  fresh = restore_or_initialize(ck, resume=True, init=_snapshot)
  assert fresh.step == 0  # --resume with nothing to resume: start fresh
  ck.save(_snapshot(3, 2.0))
  with pytest.raises(FileExistsError, match="--resume"):
    restore_or_initialize(ck, resume=False, init=_snapshot)
  resumed = restore_or_initialize(ck, resume=True, init=_snapshot)
  assert resumed.step == 3
  np.testing.assert_array_equal(resumed.state["w"], _snapshot(3, 2.0).state["w"])
  ck.close()


def test_relative_path_rejected():
  with pytest.raises(ValueError, match="absolute"):
    Checkpointer("relative/ck")


def test_a_checkpoint_of_another_tree_is_one_checkpoint_error(tmp_path):
  """A checkpoint whose tree differs from the run's (here: qdot states in the dict
  form of earlier releases, no longer converted) fails as a CheckpointError naming
  the step, not as orbax's traceback."""
  from lowprec.numerics import qdot  # pylint: disable=g-import-not-at-top
  from experiments.common.harness.checkpoint import CheckpointError  # pylint: disable=g-import-not-at-top
  typed = qdot.init_state("fp8_delayed", telemetry=True)
  legacy = {part: {k.replace("_", "/"): v for k, v in getattr(typed, part).items()}
            for part in ("delayed", "telemetry")}
  ck = Checkpointer(str(tmp_path / "ck"))
  ck.save(Snapshot(state={"layer": legacy, "w": jnp.ones(3)}, rng=jax.random.PRNGKey(0),
                   step=1, data_position=2))
  template = {"layer": qdot.init_state("fp8_delayed", telemetry=True), "w": jnp.zeros(3)}
  with pytest.raises(CheckpointError, match="checkpoint step 1 in .* cannot be read"):
    ck.restore(template, jax.random.PRNGKey(1))
  ck.close()
