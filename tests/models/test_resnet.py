"""models.resnet: shapes, the matmul conv equals nn.Conv, parameter names for Muon routing."""

import chex
import jax
import jax.numpy as jnp
import pytest
from flax import linen as nn

from lowprec.models.resnet import PatchConv, ResNet, ResNetConfig, classification_loss
from lowprec.numerics import optim


@pytest.mark.parametrize("strides,kernel,size", [(1, 3, 8), (2, 3, 8), (2, 1, 8), (2, 3, 7)])
def test_patch_conv_equals_flax_conv(strides, kernel, size):
  x = jax.random.normal(jax.random.PRNGKey(0), (2, size, size, 3))
  ours = PatchConv(5, (kernel, kernel), strides)
  ref = nn.Conv(5, (kernel, kernel), strides, use_bias=False)
  params = ours.init(jax.random.PRNGKey(1), x)
  chex.assert_trees_all_close(ours.apply(params, x), ref.apply(params, x), atol=1e-5)


def test_resnet_shapes_impls_agree_and_labels():
  x = jax.random.normal(jax.random.PRNGKey(0), (3, 8, 8, 1))
  model = ResNet(ResNetConfig(width=8, num_stages=2, blocks_per_stage=1))
  params = jax.jit(model.init)(jax.random.PRNGKey(1), x)["params"]
  logits = jax.jit(model.apply)({"params": params}, x)
  chex.assert_shape(logits, (3, 10))
  xla = ResNet(ResNetConfig(width=8, conv_impl="xla"))
  chex.assert_trees_all_close(jax.jit(xla.apply)({"params": params}, x), logits, atol=1e-5)
  labels = optim.default_param_labels(params)
  assert labels["stem"]["kernel"] == "muon" and labels["head"]["kernel"] == "fallback"
  assert labels["stage1_block0"]["proj"]["kernel"] == "muon"
  assert labels["stage1_block0"]["norm1"]["scale"] == "fallback"
  loss, acc = classification_loss(logits, jnp.zeros(3, jnp.int32))
  assert loss.shape == () and 0.0 <= float(acc) <= 1.0


def test_config_errors():
  with pytest.raises(ValueError, match="conv_impl"):
    ResNetConfig(conv_impl="cudnn")
  with pytest.raises(ValueError, match="divisible"):
    ResNetConfig(width=10, groups=4)
  with pytest.raises(ValueError, match="images"):
    ResNet(ResNetConfig()).init(jax.random.PRNGKey(0), jnp.zeros((8, 8, 1)))
