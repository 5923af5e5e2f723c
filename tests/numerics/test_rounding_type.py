"""numerics.rounding's Rounding values: construction, parsing, static under jit, words.

Cheap: a few tiny jitted casts (about 2 s in all).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lowprec import numerics
from lowprec.numerics import random_bits
from lowprec.numerics import rounding as rounding_lib
from lowprec.numerics.export import ErrorFeedback
from lowprec.numerics.export import parse_rounding as parse_export_rounding
from lowprec.numerics.optim.master_weights import Kahan
from lowprec.numerics.optim.master_weights import parse_rounding as parse_master_rounding
from lowprec.numerics.rounding import Nearest, Stochastic, TowardZero, parse


def test_values_are_frozen_hashable_and_compare_by_fields():
  assert Nearest() == Nearest() and hash(Nearest()) == hash(Nearest())
  assert Stochastic(bits=8) == Stochastic(bits=8) != Stochastic()
  assert Stochastic(bits=np.int32(8)) == Stochastic(bits=8)  # stored as an int
  assert Stochastic() != Stochastic(rng="threefry")
  assert len({Nearest(), TowardZero(), Stochastic(), Stochastic(bits=8)}) == 4
  with pytest.raises(dataclasses.FrozenInstanceError):
    Stochastic().bits = 3
  assert [r.needs_key for r in (Nearest(), TowardZero(), Stochastic())] == [
      False, False, True]


@pytest.mark.parametrize("bad", [0, 33, -1, 2.5, "4", True])
def test_stochastic_validates_its_bits(bad):
  with pytest.raises(ValueError, match=r"bits must be an int in \[1, 32\]"):
    Stochastic(bits=bad)


def test_stochastic_validates_its_generator():
  with pytest.raises(ValueError, match="unknown rng 'mersenne'"):
    Stochastic(rng="mersenne")


def test_parse_reads_each_name_once():
  assert parse("nearest") == Nearest()
  assert parse("toward_zero") == TowardZero()
  assert parse("stochastic") == Stochastic()
  assert parse("stochastic", bits=8, rng="threefry") == Stochastic(8, "threefry")
  assert tuple(parse(n).name for n in rounding_lib.ROUNDINGS) == rounding_lib.ROUNDINGS
  with pytest.raises(ValueError, match="unknown rounding 'nearst'; known: nearest"):
    parse("nearst")
  with pytest.raises(ValueError, match="would ignore"):
    parse("nearest", bits=8)
  with pytest.raises(ValueError, match="would ignore"):
    parse("toward_zero", rng="threefry")


def test_the_extra_modes_live_with_their_users():
  assert parse_export_rounding("error_feedback") == ErrorFeedback()
  assert parse_export_rounding("stochastic", rng="threefry") == Stochastic(rng="threefry")
  assert parse_master_rounding("kahan") == Kahan()
  for parser, name in ((parse_export_rounding, "kahan"),
                       (parse_master_rounding, "error_feedback")):
    with pytest.raises(ValueError, match="unknown rounding"):
      parser(name)
  with pytest.raises(ValueError, match="would ignore"):
    parse_export_rounding("error_feedback", bits=8)
  # The core type holds neither: a stateful mode is not a rounding of one array.
  for mode in (ErrorFeedback(), Kahan()):
    with pytest.raises(TypeError, match="rounding must be Nearest"):
      rounding_lib.check_rounding(mode)


def test_a_name_is_refused_where_a_rounding_belongs():
  """Before this type every library function took the names; now they are read only
  where flags are (``parse``), and the error says so in one line."""
  x = jnp.ones((4,), jnp.float32)
  with pytest.raises(TypeError, match=r"cast: rounding must be .*parse\('stochastic'\)"):
    numerics.cast(x, "e4m3", rounding="stochastic", key=jax.random.key(0))


def test_a_rounding_is_a_static_jit_argument():
  x = jnp.linspace(-3.0, 3.0, 64, dtype=jnp.float32)
  f = jax.jit(lambda x, r: numerics.cast(x, "e2m1", rounding=r), static_argnums=1)
  np.testing.assert_array_equal(f(x, Nearest()), numerics.cast(x, "e2m1"))
  np.testing.assert_array_equal(f(x, TowardZero()),
                                numerics.cast(x, "e2m1", rounding=TowardZero()))


@pytest.mark.parametrize("rng", random_bits.METHODS)
def test_stochastic_words_are_its_generators_words(rng):
  key = jax.random.key(5)
  got = Stochastic(rng=rng).words(key, (3, 7))
  np.testing.assert_array_equal(got, random_bits.random_words(key, (3, 7), method=rng))
  np.testing.assert_array_equal(Stochastic(rng=rng).lazy_words(key, jnp.zeros((3, 7)))(),
                                got)
  assert Nearest().words(key, (3, 7)) is None
  assert TowardZero().lazy_words(key, jnp.zeros((3, 7))) is None


def test_key_checks():
  with pytest.raises(ValueError, match="api: Stochastic rounding needs a PRNG key"):
    Stochastic().check_key(None, "api")
  with pytest.raises(ValueError, match="would ignore"):
    Nearest().check_key(jax.random.key(0))
  Stochastic().check_key(jax.random.key(0))
  TowardZero().check_key(None)
