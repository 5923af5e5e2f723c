"""The linen front end: a copy of the model whose methods run under interception.

Linen modules are tracked with ``flax.linen.intercept_methods`` (each submodule's call
pushes it on the context's stack), so an op's path is the issuing module's name path
below the quantized model.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

from flax import linen as nn

from lowprec.models.quantization import interception


def _track(next_fun, args, kwargs, context):
  ctx = interception.active()
  if ctx is None or ctx.kind != "linen" or context.module.scope is None:
    return next_fun(*args, **kwargs)
  ctx.stack.append((context.module, ""))
  try:
    return next_fun(*args, **kwargs)
  finally:
    ctx.stack.pop()


def _method(fn: Callable[..., Any], config: interception.Config) -> Callable[..., Any]:

  @functools.wraps(fn)
  def method(self, *args, **kwargs):
    if interception.active() is not None or self.scope is None:  # nested: outer rules
      return fn(self, *args, **kwargs)
    context = interception.Context(config, self, tuple(self.path), "linen")
    with interception.activate(context), nn.intercept_methods(_track):
      return fn(self, *args, **kwargs)

  return method


def quantize(model: nn.Module, config: interception.Config, methods: Sequence[str]
             ) -> nn.Module:
  """A copy of linen ``model`` whose ``methods`` run under interception."""
  base = getattr(type(model), "_unquantized_type", type(model))
  namespace = {"_unquantized_type": base, "_quantization_config": config}
  for name in methods:
    fn = getattr(base, name, None)
    if fn is None:
      raise ValueError(f"{base.__name__} has no method {name!r}")
    while hasattr(fn, "method_handler_wrapped"):  # linen's scope wrapper
      fn = fn.__wrapped__
    namespace[name] = _method(fn, config)
  model = model.copy()
  model.__class__ = type(base.__name__, (base,), namespace)
  return model
