"""numerics.rl.sampler_copy: refresh schedule, versions, staleness, precision."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from numerics.rl import sampler_copy as sc


def test_refresh_every_interval_versions_and_staleness():
  export = sc.cast_export(jnp.bfloat16)
  params = {"w": jnp.float32(1.0) + jnp.arange(4, dtype=jnp.float32) / 3}
  copy = sc.initial_copy(params, export)
  step_fn = jax.jit(lambda c, p, s: sc.maybe_refresh(c, p, s, 3, export))
  seen = []
  for step in range(8):
    params = {"w": params["w"] + 0.25}  # one learner update per step
    copy = step_fn(copy, params, step)
    seen.append((int(copy.version), int(copy.syncs), int(sc.staleness(copy, step))))
    np.testing.assert_array_equal(copy.params["w"],
                                  (1 + jnp.arange(4) / 3 + 0.25 * (int(copy.version) + 1)
                                   ).astype(jnp.bfloat16))
    assert copy.params["w"].dtype == jnp.bfloat16
  assert seen == [(0, 2, 0), (0, 2, 1), (0, 2, 2), (3, 3, 0), (3, 3, 1), (3, 3, 2),
                  (6, 4, 0), (6, 4, 1)]


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
