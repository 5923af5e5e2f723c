"""numerics.tree_paths: the one leaf-naming rule."""

from typing import NamedTuple

import jax.numpy as jnp

from lowprec.numerics import tree_paths


class Pair(NamedTuple):
  a: jnp.ndarray
  b: jnp.ndarray


def test_names_of_dict_list_and_attribute_keys():
  tree = {"block_0": {"qkv": {"kernel": jnp.zeros(2)}}, "xs": [jnp.ones(1), jnp.ones(1)],
          "pair": Pair(jnp.zeros(()), jnp.zeros(()))}
  names = list(tree_paths.named_leaves(tree))
  assert names == ["block_0/qkv/kernel", "pair/a", "pair/b", "xs/0", "xs/1"]
  assert tree_paths.path_name((), root="root") == "root"
  assert list(tree_paths.named_leaves(jnp.zeros(3))) == [""]
