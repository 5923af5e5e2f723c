"""A small CIFAR-style ResNet (Flax linen) for 8x8 / 32x32 image classification.

GroupNorm instead of BatchNorm on purpose: the model is a pure function of
(params, images), so SAM's second gradient pass and the handoff need no mutable
batch statistics (Temperon updates BN statistics on both SAM passes; here there are none).

``conv_impl="matmul"`` (default) computes each convolution as shifted slices + one matmul
(:class:`PatchConv`, the same ``(kh, kw, in, out)`` kernel and result as ``nn.Conv``).
Why: XLA:CPU runs a convolution inside ``lax.cond`` about 30x slower than outside
(measured: 77 ms vs 2.5 ms for a 2-conv gradient at batch 64, 8x8x16), and the
handoff's ``lax.cond`` contains SAM's second gradient pass. The matmul form is as fast in
and out of ``cond``. ``conv_impl="xla"`` uses ``nn.Conv``.
Parameter names keep the conventions :func:`numerics.optim.default_param_labels` reads:
the classifier is ``head``, normalisation layers contain ``norm``.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import linen as nn


CONV_IMPLS = ("matmul", "xla")


def _same_padding(size: int, kernel: int, stride: int) -> tuple[int, int]:
  out = -(-size // stride)
  total = max((out - 1) * stride + kernel - size, 0)
  return total // 2, total - total // 2


class PatchConv(nn.Module):
  """``nn.Conv(features, kernel_size, strides, padding="SAME", use_bias=False)`` as
  shifted slices + a matmul. x float[B, H, W, C] -> float[B, ceil(H/s), ceil(W/s), F]."""

  features: int
  kernel_size: tuple[int, int] = (3, 3)
  strides: int = 1

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    kh, kw = self.kernel_size
    s = self.strides
    kernel = self.param("kernel", nn.initializers.lecun_normal(),
                        (kh, kw, x.shape[-1], self.features), jnp.float32)
    _, h, w, _ = x.shape
    ph, pw = _same_padding(h, kh, s), _same_padding(w, kw, s)
    xp = jnp.pad(x, ((0, 0), ph, pw, (0, 0)))
    oh, ow = -(-h // s), -(-w // s)
    cols = jnp.concatenate(
        [xp[:, i:i + (oh - 1) * s + 1:s, j:j + (ow - 1) * s + 1:s, :]
         for i in range(kh) for j in range(kw)], axis=-1)
    return cols @ kernel.reshape(-1, self.features).astype(x.dtype)


def make_conv(impl: str, features: int, kernel_size: tuple[int, int], strides: int,
              name: str) -> nn.Module:
  if impl == "matmul":
    return PatchConv(features, kernel_size, strides, name=name)
  if impl == "xla":
    return nn.Conv(features, kernel_size, strides, use_bias=False, name=name)
  raise ValueError(f"conv_impl must be one of {CONV_IMPLS}, got {impl!r}")


@dataclasses.dataclass(frozen=True)
class ResNetConfig:
  """width: stem/first-stage channels (doubles per stage); stage i has
  ``blocks_per_stage`` BasicBlocks, stride 2 from the second stage on."""

  num_classes: int = 10
  width: int = 16
  num_stages: int = 2
  blocks_per_stage: int = 1
  groups: int = 4
  conv_impl: str = "matmul"

  def __post_init__(self):
    if self.conv_impl not in CONV_IMPLS:
      raise ValueError(f"conv_impl must be one of {CONV_IMPLS}, got {self.conv_impl!r}")
    for name in ("num_classes", "width", "num_stages", "blocks_per_stage", "groups"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
    if self.width % self.groups:
      raise ValueError(f"width {self.width} must be divisible by groups {self.groups}")


class BasicBlock(nn.Module):
  """conv3x3-norm-relu-conv3x3-norm + (projected) shortcut, then relu."""

  features: int
  strides: int = 1
  groups: int = 4
  conv_impl: str = "matmul"

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    y = make_conv(self.conv_impl, self.features, (3, 3), self.strides, "conv1")(x)
    y = nn.relu(nn.GroupNorm(self.groups, name="norm1")(y))
    y = make_conv(self.conv_impl, self.features, (3, 3), 1, "conv2")(y)
    y = nn.GroupNorm(self.groups, name="norm2")(y)
    if x.shape[-1] != self.features or self.strides != 1:
      x = make_conv(self.conv_impl, self.features, (1, 1), self.strides, "proj")(x)
      x = nn.GroupNorm(self.groups, name="proj_norm")(x)
    return nn.relu(x + y)


class ResNet(nn.Module):
  """images float[B, H, W, C] -> logits float32[B, num_classes]."""

  config: ResNetConfig

  @nn.compact
  def __call__(self, images: jax.Array) -> jax.Array:
    if images.ndim != 4:
      raise ValueError(f"images must be [B, H, W, C], got shape {images.shape}")
    c = self.config
    x = make_conv(c.conv_impl, c.width, (3, 3), 1, "stem")(images)
    x = nn.relu(nn.GroupNorm(c.groups, name="stem_norm")(x))
    for stage in range(c.num_stages):
      for block in range(c.blocks_per_stage):
        strides = 2 if stage > 0 and block == 0 else 1
        x = BasicBlock(c.width * 2 ** stage, strides, c.groups, c.conv_impl,
                       name=f"stage{stage}_block{block}")(x)
    x = jnp.mean(x, axis=(1, 2))
    return nn.Dense(c.num_classes, name="head")(x).astype(jnp.float32)


def classification_loss(logits: jax.Array, labels: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Mean softmax cross-entropy and accuracy; logits float[B, K], labels int[B]."""
  if logits.shape[:1] != labels.shape:
    raise ValueError(f"logits {logits.shape} and labels {labels.shape} disagree on batch")
  logp = jax.nn.log_softmax(logits.astype(jnp.float32))
  loss = -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=-1))
  accuracy = jnp.mean((jnp.argmax(logits, -1) == labels).astype(jnp.float32))
  return loss, accuracy
