"""qwix 0.1.8 itself, as the oracle of the ``qwix`` convention: its codes, scales (as
our scale codes) and dequantized values for 1x32 (mxfp8, mxfp4) or 1x16 (nvfp4) blocks
along the last axis of a 2D float32 array."""

import jax.numpy as jnp
import numpy as np
import qwix

QTYPES = {("mx", "e4m3"): "mxfp8", ("mx", "e2m1"): "mxfp4", ("nvfp4", "e2m1"): "nvfp4"}


def quantize(x: np.ndarray, qtype: str):
  """(element codes uint8, scale codes uint8 per block, dequantized float32) of qwix.

  MX scale codes are ``log2(scale) + 127`` (255 where qwix's scale is Inf or NaN, which
  E8M0 cannot hold); NVFP4 scale codes are the E4M3 bits of qwix's scale.
  """
  block = 16 if qtype == "nvfp4" else 32
  qa = qwix.quantize(jnp.asarray(x, jnp.float32), qtype, channelwise_axes=(0,),
                     tiled_axes={1: block})
  codes = np.asarray(qa.qvalue).view(np.uint8)
  scale = np.asarray(qa.scale, np.float32).reshape(-1)
  if qtype == "nvfp4":
    scales = np.asarray(jnp.asarray(scale).astype(jnp.float8_e4m3fn)).view(np.uint8)
  else:
    with np.errstate(divide="ignore", invalid="ignore"):
      e = np.log2(scale)
    finite = np.isfinite(e)
    assert np.all(e[finite] == np.round(e[finite])), "qwix MX scale not a power of two"
    scales = np.where(finite, np.nan_to_num(e) + 127, 255).astype(np.uint8)
  return codes, scales, np.asarray(qwix.dequantize(qa), np.float32)
