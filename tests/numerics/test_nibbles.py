"""numerics.encoding.pack_nibbles / unpack_nibbles: byte layout by hand."""

import jax.numpy as jnp
import numpy as np
import pytest

from lowprec.numerics import encoding


def test_pack_layout_and_roundtrip():
  codes = jnp.array([0x1, 0x2, 0xA, 0xF, 0x7], jnp.uint8)
  packed = encoding.pack_nibbles(codes)  # first of a pair high; odd tail padded with 0
  np.testing.assert_array_equal(np.asarray(packed), np.array([0x12, 0xAF, 0x70], np.uint8))
  np.testing.assert_array_equal(np.asarray(encoding.unpack_nibbles(packed, 5)), codes)
  np.testing.assert_array_equal(np.asarray(encoding.unpack_nibbles(packed)),
                                [0x1, 0x2, 0xA, 0xF, 0x7, 0x0])
  rows = jnp.arange(32, dtype=jnp.uint8).reshape(2, 16) & 0xF
  np.testing.assert_array_equal(
      np.asarray(encoding.unpack_nibbles(encoding.pack_nibbles(rows))), rows)


def test_errors():
  with pytest.raises(TypeError):
    encoding.pack_nibbles(jnp.zeros(4, jnp.int32))
  with pytest.raises(TypeError):
    encoding.unpack_nibbles(jnp.zeros(4, jnp.int32))
  with pytest.raises(ValueError):
    encoding.unpack_nibbles(jnp.zeros(2, jnp.uint8), 5)
  with pytest.raises(ValueError):
    encoding.pack_nibbles(jnp.zeros((), jnp.uint8))
