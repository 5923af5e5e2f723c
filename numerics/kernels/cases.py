"""The kernel cases that CI lowers and compiles for accelerators, without a device.

Each :class:`Case` is one call of a kernel entry point at a production shape, with
abstract arguments (``jax.ShapeDtypeStruct``), and the HBM bytes and FLOPs a roofline
estimate needs. :data:`CASES` is the set CI checks: every kernel with every element
format, scale rule, rounding mode, input dtype and blocked axis it offers, each at least
once (a covering set, 40 cases). :func:`all_cases` is the full product (every format x
scale rule x rounding on both axes, every matmul format pair), for
``python -m lowprec.numerics.kernels.compile_check --all``.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Callable

import jax
import jax.numpy as jnp

from lowprec.numerics import blockscale
from lowprec.numerics import rounding as rounding_lib
from lowprec.numerics.blockscale import MX_BLOCK, NVFP4_BLOCK
from lowprec.numerics import kernels

QUANTIZE_SHAPE = (8192, 4096)
QUANTIZE_SHAPE_3D = (4, 2048, 4096)
MATMUL_SIZE = 4096

_S = jax.ShapeDtypeStruct
_KEY = jax.eval_shape(lambda: jax.random.key(0))


@dataclasses.dataclass(frozen=True)
class Case:
  """One kernel call: ``fn(*args)`` with abstract ``args``.

  ``hbm_bytes``: the bytes the whole call reads and writes at least once (inputs,
  outputs, and the tensor-amax pass NVFP4 makes before its kernel); ``flops``: the
  matmul's ``2 M N K`` (0 for quantizers).
  """
  name: str
  kernel: str
  fn: Callable[..., Any]
  args: tuple[Any, ...]
  hbm_bytes: int
  flops: int = 0


def _size(shape) -> int:
  n = 1
  for d in shape:
    n *= d
  return n


def _mx_operand(fmt: str, m: int, k: int, axis: int) -> blockscale.QuantizedArray:
  scales = (m, k // MX_BLOCK) if axis == 1 else (m // MX_BLOCK, k)
  return blockscale.QuantizedArray(
      codes=_S((m, k), jnp.uint8), scales=_S(scales, jnp.uint8),
      tensor_scale=_S((), jnp.float32), fmt=fmt, scale_fmt="e8m0", axes=(axis,),
      block_shape=(MX_BLOCK,), shape=(m, k), scale_rule="floor")


def _stochastic(rounding: rounding_lib.Rounding, key) -> dict:
  return dict(key=key) if rounding.needs_key else {}


def _args(shape, dtype, rounding: rounding_lib.Rounding):
  x = _S(shape, dtype)
  return (x, _KEY) if rounding.needs_key else (x, None)


def mx_quantize(fmt: str, scale_rule: str, rounding: str, dtype=jnp.float32,
                shape=QUANTIZE_SHAPE) -> Case:
  n, r = _size(shape), rounding_lib.parse(rounding)
  return Case(
      f"mx_quantize {fmt} {scale_rule} {rounding} {jnp.dtype(dtype).name} {shape}",
      "mx_quantize",
      lambda x, k: kernels.mx_quantize(x, fmt, scale_rule=scale_rule, rounding=r,
                                       use_kernel=True, **_stochastic(r, k)),
      _args(shape, dtype, r),
      n * jnp.dtype(dtype).itemsize + n + n // MX_BLOCK)


def mx_quantize_dequantize(fmt: str, axis: int, scale_rule: str, rounding: str,
                           dtype=jnp.float32, shape=QUANTIZE_SHAPE) -> Case:
  n, r = _size(shape), rounding_lib.parse(rounding)
  return Case(
      f"mx_quantize_dequantize {fmt} axis {axis} {scale_rule} {rounding} "
      f"{jnp.dtype(dtype).name} {shape}",
      "mx_quantize_dequantize",
      lambda x, k: kernels.mx_quantize_dequantize(
          x, fmt, axis=axis, scale_rule=scale_rule, rounding=r, use_kernel=True,
          **_stochastic(r, k)),
      _args(shape, dtype, r),
      n * jnp.dtype(dtype).itemsize + 4 * n)


def nvfp4(kernel: str, axis: int, rounding: str, dtype=jnp.float32,
          shape=QUANTIZE_SHAPE) -> Case:
  n, r = _size(shape), rounding_lib.parse(rounding)
  fn = getattr(kernels, kernel)
  extra = {} if kernel == "nvfp4_quantize" else dict(axis=axis)
  out = n + n // NVFP4_BLOCK if kernel == "nvfp4_quantize" else 4 * n
  # The tensor amax is one more read of x, before the kernel.
  return Case(
      f"{kernel} axis {axis} {rounding} {jnp.dtype(dtype).name} {shape}", kernel,
      lambda x, k: fn(x, rounding=r, use_kernel=True, **extra, **_stochastic(r, k)),
      _args(shape, dtype, r),
      2 * n * jnp.dtype(dtype).itemsize + out)


def mx_matmul(fa: str, fb: str, n: int = MATMUL_SIZE) -> Case:
  return Case(
      f"mx_matmul {fa} x {fb} {n}^3", "mx_matmul",
      lambda a, b: kernels.mx_matmul(a, b, use_kernel=True),
      (_mx_operand(fa, n, n, 1), _mx_operand(fb, n, n, 0)),
      2 * (n * n + n * n // MX_BLOCK) + 4 * n * n, 2 * n ** 3)


def _covering_cases() -> list[Case]:
  fmts = blockscale.MX_ELEMENT_FORMATS
  rules = blockscale.SCALE_RULES
  roundings = rounding_lib.ROUNDINGS
  cases = [mx_quantize(f, "floor", "stochastic") for f in fmts]
  cases += [mx_quantize("e4m3", "rceil", "nearest", jnp.bfloat16),
            mx_quantize("e2m1", "ceil", "toward_zero"),
            mx_quantize("e5m2", "even", "nearest", jnp.bfloat16),
            mx_quantize("int8", "alto", "nearest"),
            mx_quantize("e3m2", "floor", "toward_zero", shape=QUANTIZE_SHAPE_3D)]
  # The fused quantizer: every format on each axis, and every rule and rounding.
  for i, f in enumerate(fmts):
    for axis in (-1, -2):
      rule = rules[(i + (axis == -2)) % len(rules)]
      rounding = roundings[(i + 2 * (axis == -2)) % len(roundings)]
      cases.append(mx_quantize_dequantize(f, axis, rule, rounding))
  cases += [mx_quantize_dequantize("e4m3", -1, "rceil", "nearest", jnp.bfloat16),
            mx_quantize_dequantize("e4m3", -2, "rceil", "stochastic", jnp.bfloat16),
            mx_quantize_dequantize("e2m1", -2, "floor", "stochastic",
                                   shape=QUANTIZE_SHAPE_3D)]
  cases += [nvfp4("nvfp4_quantize", -1, r) for r in roundings]
  cases += [nvfp4("nvfp4_quantize", -1, "nearest", jnp.bfloat16)]
  for kernel in ("nvfp4_quantize_dequantize", "nvfp4_quantize_dequantize_blocks"):
    cases += [nvfp4(kernel, -1, "stochastic"), nvfp4(kernel, -2, "stochastic"),
              nvfp4(kernel, -1, "nearest", jnp.bfloat16)]
  cases += [nvfp4("nvfp4_quantize_dequantize", -2, "toward_zero",
                  shape=QUANTIZE_SHAPE_3D)]
  cases += [mx_matmul(a, b) for a, b in (("e4m3", "e4m3"), ("e2m1", "e2m1"),
                                         ("int8", "e5m2"), ("e2m3", "e3m2"))]
  return cases


def all_cases() -> dict[str, Case]:
  """The full product: each MX format x scale rule x rounding (float32, both axes for
  the fused quantizer), every NVFP4 kernel x axis x rounding, every matmul format pair,
  plus :data:`CASES`."""
  fmts = blockscale.MX_ELEMENT_FORMATS
  roundings = rounding_lib.ROUNDINGS
  cases = list(CASES.values())
  for f, rule, r in itertools.product(fmts, blockscale.SCALE_RULES, roundings):
    cases.append(mx_quantize(f, rule, r))
    cases += [mx_quantize_dequantize(f, axis, rule, r) for axis in (-1, -2)]
  for kernel, axis, r in itertools.product(
      ("nvfp4_quantize_dequantize", "nvfp4_quantize_dequantize_blocks"), (-1, -2),
      roundings):
    cases.append(nvfp4(kernel, axis, r))
  cases += [mx_matmul(a, b) for a, b in itertools.product(fmts, fmts)]
  return {c.name: c for c in cases}


CASES: dict[str, Case] = {c.name: c for c in _covering_cases()}
