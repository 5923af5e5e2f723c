"""numerics.rl.sampler_copy: refresh schedule, versions, staleness, precision."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lowprec.numerics.rl import sampler_copy as sc


def test_refresh_every_interval_versions_and_staleness():
  export = sc.cast_export(jnp.bfloat16)
  params = {"w": jnp.float32(1.0) + jnp.arange(4, dtype=jnp.float32) / 3}
  copy = sc.initial_copy(params, export)  # taken before update 0
  step_fn = jax.jit(lambda c, p, s: sc.maybe_refresh(c, p, s, 3, export))
  seen = []
  for step in range(8):
    copy = step_fn(copy, params, step)  # a sync happens before the update at its step
    seen.append((int(copy.version), int(copy.syncs), int(sc.staleness(copy, step))))
    np.testing.assert_array_equal(copy.params["w"],
                                  (1 + jnp.arange(4) / 3 + 0.25 * int(copy.version)
                                   ).astype(jnp.bfloat16))
    assert copy.params["w"].dtype == jnp.bfloat16
    params = {"w": params["w"] + 0.25}  # one learner update per step
  # The initial copy is already at step 0: no second sync at version 0.
  assert seen == [(0, 1, 0), (0, 1, 1), (0, 1, 2), (3, 2, 0), (3, 2, 1), (3, 2, 2),
                  (6, 3, 0), (6, 3, 1)]


def test_initial_copy_then_refresh_at_step_zero_passes_the_version_check():
  """Regression: maybe_refresh re-synced the initial copy at step 0 (syncs 2 at version
  0), which weight_sync.check_version rejects."""
  from experiments.mxfp8_rl import weight_sync  # pylint: disable=import-outside-toplevel
  export = sc.cast_export(jnp.bfloat16)
  params = {"w": jnp.ones(4, jnp.float32)}
  first = sc.initial_copy(params, export)
  weight_sync.check_version(None, first, 0)
  again = sc.maybe_refresh(first, params, 0, 4, export)
  assert int(again.syncs) == 1 and not bool(sc.refresh_needed(first, 0, 4))
  later = sc.maybe_refresh(again, params, 4, 4, export)
  weight_sync.check_version(again, later, 4)
  assert bool(sc.refresh_needed(again, 4, 4)) and int(later.syncs) == 2


def test_cast_export_keeps_integer_leaves_and_rounds_to_nearest():
  export = sc.cast_export("bfloat16")
  out = export({"w": jnp.array([1.0 + 2 ** -9, 1.0 + 3 * 2 ** -9], jnp.float32),
                "n": jnp.array([3], jnp.int32)})
  np.testing.assert_array_equal(out["w"].astype(jnp.float32), [1.0, 1.0 + 2 ** -7])
  assert out["n"].dtype == jnp.int32


def test_validation():
  with pytest.raises(ValueError, match="interval"):
    sc.refresh_due(0, 0)
  with pytest.raises(ValueError, match="floating"):
    sc.cast_export(jnp.int8)
