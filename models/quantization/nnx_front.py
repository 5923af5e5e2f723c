"""The NNX front end: a clone of the model whose modules are tracked.

Each module of the clone gets a subclass whose ``__call__`` pushes it on the context's
stack (its path is its attribute path, list indices included), and layers that hold a
contraction function as an attribute (``nnx.Linear``'s ``dot_general``, ``nnx.Einsum``'s
``einsum_op``, ``nnx.Conv``'s ``conv_general_dilated``) get the intercepting one.
"""

from __future__ import annotations

from flax import nnx

from lowprec.models.quantization import context as context_lib
from lowprec.models.quantization import interception
from lowprec.models.quantization import products

_TRACKED: dict[type, type] = {}
# (the function a layer may hold, its intercepting replacement)
_REPLACEMENTS = tuple(
    (getattr(interception, original), getattr(interception, replacement))
    for original, replacement in (("LAX_DOT_GENERAL", "_intercepted_dot_general"),
                                  ("JNP_EINSUM", "_intercepted_einsum"),
                                  ("LAX_CONV", "_intercepted_conv"))) + tuple(
    (original, replacement) for _, _, original, replacement in products.INSTALLED)


def _has_call(cls: type) -> bool:
  return any("__call__" in vars(k) for k in cls.__mro__ if k is not object)


def _tracked_class(cls: type) -> type:
  if cls in _TRACKED:
    return _TRACKED[cls]
  call = cls.__call__

  def __call__(self, *args, **kwargs):
    ctx = context_lib.active()
    config = getattr(self, "_quantization_config", None)
    if ctx is None and config is not None:  # the quantized model itself
      with interception.activate(context_lib.Context(config, self, (), "nnx")):
        return call(self, *args, **kwargs)
    if ctx is None or ctx.kind != "nnx":
      return call(self, *args, **kwargs)
    ctx.stack.append((self, self._quantization_path))
    try:
      return call(self, *args, **kwargs)
    finally:
      ctx.stack.pop()

  tracked = type(cls.__name__, (cls,), {"__call__": __call__, "_unquantized_type": cls})
  _TRACKED[cls] = tracked
  return tracked


def quantize(model: nnx.Module, config: context_lib.Config, rngs: nnx.Rngs | None
             ) -> nnx.Module:
  """A clone of NNX ``model`` whose calls run under interception."""
  model = nnx.clone(model)
  if not _has_call(type(model)):
    raise ValueError(f"{type(model).__name__} has no __call__ to quantize")
  for path, module in nnx.iter_modules(model):
    base = getattr(type(module), "_unquantized_type", type(module))
    if _has_call(base):
      module.__class__ = _tracked_class(base)
    module._quantization_path = "/".join(str(p) for p in path)
    for name, value in list(vars(module).items()):
      for original, replacement in _REPLACEMENTS:
        if value is original:
          setattr(module, name, replacement)
  model._quantization_config = config
  if rngs is not None:
    model.quant_rngs = rngs
  return model
