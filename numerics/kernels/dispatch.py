"""Which implementation a kernel entry point runs: the dispatch rule.

Every kernel entry point takes ``use_kernel`` and ``interpret`` and resolves them to
one of four implementations (:data:`IMPLS`):

* ``"jnp"``: the XLA path (the jnp code in :mod:`numerics.mx` and :mod:`numerics.nvfp4`).
* ``"pallas"``: the compiled Pallas kernel of the platform the program is lowered for:
  Triton on ``cuda``/``rocm``, Mosaic on ``tpu`` (a ``lax.platform_dependent``
  switch, so one traced program lowers for either); lowering it for ``cpu`` fails.
* ``"interpret"``: the same kernel in Pallas interpret mode (any backend, for tests),
  with the GPU kernel's tiling and structure, or the TPU kernel's with
  ``interpret_as="tpu"``.
* ``"auto"``: the Pallas kernel where it compiles and the jnp path elsewhere. Decided
  from ``jax.default_backend()`` at trace time: on a GPU (TPU) host the program holds
  the Triton (Mosaic) kernel with a jnp fallback for computations placed on the CPU;
  on a CPU host only the jnp path is traced.

Resolution: ``interpret=True`` gives ``"interpret"``; ``use_kernel=True`` gives
``"pallas"`` and ``use_kernel=False`` gives ``"jnp"``; ``use_kernel=None`` (the default)
gives the caller's choice for the calls it traces, ``with
kernels.implementation("jnp"): ...`` (a context manager, thread-local), and outside any
such block the process default: the environment variable ``NUMERICS_KERNELS`` (one of
:data:`IMPLS`, default ``"auto"``), read once, at the first resolution (a command-line
convenience: ``NUMERICS_KERNELS=jnp python -m experiments.lm``). The training path
(:func:`numerics.kernels.quantize_dequantize`, called by :mod:`numerics.qdot`) follows
the same rule.

The choice applies when a function is traced, and JAX sees it: the block's choice is a
``jax.make_user_context`` state, part of the key of JAX's trace, lowering and
compilation caches (as the mesh or ``jax.default_device`` are), so a ``jax.jit``
function called or traced under another choice is traced again, and one called again
under a choice it has seen reuses that trace.
"""

from __future__ import annotations

import contextlib
import functools
import os
from typing import Any, Callable, Iterator, Literal, Mapping

import jax
from jax import lax

Impl = Literal["auto", "jnp", "pallas", "interpret"]
IMPLS = ("auto", "jnp", "pallas", "interpret")
ENV_VAR = "NUMERICS_KERNELS"
# Kernel variants: each backend gets its own tiling (and, for the matmul, structure).
GPU, TPU = "gpu", "tpu"
VARIANTS = (GPU, TPU)


# The innermost implementation() block's choice (None outside any): a JAX config state,
# so that JAX's trace caches key on it (a contextvar of our own would let a jit cache
# entry traced under one choice serve another). Thread-local, like JAX's own contexts.
_CHOSEN = jax.make_user_context(default_value=None)


def check_impl(impl: str) -> Impl:
  if impl not in IMPLS:
    raise ValueError(f"kernel implementation must be one of {', '.join(IMPLS)}, got "
                     f"{impl!r}")
  return impl


def impl_from_environment(environ: Mapping[str, str]) -> Impl:
  """The implementation ``NUMERICS_KERNELS`` names in ``environ`` (``auto`` unset)."""
  value = environ.get(ENV_VAR, "auto").strip().lower() or "auto"
  if value not in IMPLS:
    raise ValueError(f"{ENV_VAR}={value!r}; expected one of {', '.join(IMPLS)}")
  return value


@functools.cache
def _process_default() -> Impl:
  return impl_from_environment(os.environ)  # read once


@contextlib.contextmanager
def implementation(impl: Impl) -> Iterator[None]:
  """Within the block, kernel entry points called with ``use_kernel=None`` (the training
  path included) trace ``impl`` (see the module docstring)."""
  with _CHOSEN(check_impl(impl)):
    yield


def default_impl() -> Impl:
  """The implementation ``use_kernel=None`` resolves to here: the innermost
  :func:`implementation` block's, else ``NUMERICS_KERNELS`` (read once), else ``auto``."""
  chosen = _CHOSEN.value
  return chosen if chosen is not None else _process_default()


def resolve(use_kernel: bool | None, interpret: bool, *, interpret_as: str = GPU,
            tile: Any = None) -> Impl:
  """The implementation for a call's ``use_kernel``/``interpret`` arguments.

  ``interpret_as`` and ``tile`` configure the kernel; with an explicit
  ``use_kernel=False`` they would be ignored, so that conflict raises.
  """
  check_variant(interpret_as)
  if use_kernel is False and (tile is not None or interpret_as != GPU):
    raise ValueError(f"use_kernel=False runs the jnp path; tile={tile!r} and "
                     f"interpret_as={interpret_as!r} configure the kernel")
  if interpret:
    if use_kernel is False:
      raise ValueError("interpret=True runs the Pallas kernel; it conflicts with "
                       "use_kernel=False")
    return "interpret"
  if use_kernel is None:
    return default_impl()
  if not isinstance(use_kernel, bool):
    raise TypeError(f"use_kernel must be True, False or None, got {use_kernel!r}")
  return "pallas" if use_kernel else "jnp"


def check_variant(interpret_as: str) -> str:
  if interpret_as not in VARIANTS:
    raise ValueError(f"interpret_as must be one of {VARIANTS}, got {interpret_as!r}")
  return interpret_as


def run(impl: Impl, jnp_fn: Callable[..., Any],
        kernel_fn: Callable[..., Any], *operands: Any,
        interpret_as: str = GPU) -> Any:
  """Runs ``jnp_fn(*operands)`` or ``kernel_fn(variant, interpret, *operands)``.

  ``kernel_fn`` builds the ``pallas_call`` of ``variant`` (:data:`GPU` or :data:`TPU`)
  and must return the same pytree of arrays as ``jnp_fn``.
  """
  check_variant(interpret_as)
  if impl == "jnp":
    return jnp_fn(*operands)
  if impl == "interpret":
    return kernel_fn(interpret_as, True, *operands)
  gpu = lambda *a: kernel_fn(GPU, False, *a)
  tpu = lambda *a: kernel_fn(TPU, False, *a)
  if impl == "pallas":
    return lax.platform_dependent(*operands, cuda=gpu, rocm=gpu, tpu=tpu)
  if impl != "auto":
    raise ValueError(f"unknown kernel implementation {impl!r}; known: {', '.join(IMPLS)}")
  backend = jax.default_backend()
  if backend == "gpu":
    return lax.platform_dependent(*operands, cuda=gpu, rocm=gpu, default=jnp_fn)
  if backend == "tpu":
    return lax.platform_dependent(*operands, tpu=tpu, default=jnp_fn)
  return jnp_fn(*operands)


def cdiv(a: int, b: int) -> int:
  return -(-a // b)


def next_pow2(n: int) -> int:
  """The smallest power of two >= n (n >= 1)."""
  return 1 << max(int(n) - 1, 0).bit_length()


def largest_divisor(n: int, candidates: tuple[int, ...]) -> int | None:
  """The first of ``candidates`` (largest first) dividing ``n``, or None."""
  for c in candidates:
    if n % c == 0:
      return c
  return None
