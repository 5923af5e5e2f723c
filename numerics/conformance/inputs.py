"""The input tensors of the conformance vectors: blocks chosen to hit every branch.

Each MX tensor is ``(rows, 32)`` (one 1x32 block per row), each NVFP4 tensor
``(rows, 16)``. The blocks, per element format (``max``, ``emax``, ``emin``, mantissa
bits ``m``):

* zeros (``+0`` and ``-0``);
* ties: the block amax pinned at ``2^emax``, where every scale rule and convention gives
  the scale ``2^0`` in element units, and elements at every midpoint of the element grid
  below it (each binade and the subnormals; ties to even down and up), one float32 ulp
  either side of them, and values that round up into the next binade or to zero; then
  the top binade's midpoints in a block pinned at ``max``;
* saturation: amaxes above ``max`` in the top binade (``floor`` saturates them), the
  midpoint between ``max`` and the next grid value;
* power-of-two edges: amax ``max * 2^k`` and ``2^k``, exactly and one ulp either side
  (``rceil``/``ceil`` step, and the ``k`` where qwix's float32 ``log2`` is inexact);
* float32 subnormals, alone and inside a normal block; tiny blocks (E8M0 clamps at
  ``2^-127``, qwix's ``s < 2^-63`` branch); huge blocks up to ``FLT_MAX``;
* NaN and +-Inf blocks.

NVFP4 tensors add blocks far below the tensor amax (E4M3 scales subnormal, clamped or
zero), a tensor whose blocks all round to a zero qwix scale, and E2M1 ties of ``x / s``
that a float32 reciprocal ``x * (1/s)`` rounds past.
"""

from __future__ import annotations

import numpy as np

from lowprec.numerics import formats as formats_lib

F32 = np.float32
_ULP_UP = np.nextafter


def _up(v: float) -> F32:
  return _ULP_UP(F32(v), F32(np.inf))


def _down(v: float) -> F32:
  return _ULP_UP(F32(v), F32(0))


def _blocks(values, width: int, pin: float | None, fill: float = 0.0) -> np.ndarray:
  """Rows of ``width``: ``values`` in order, each row's first element ``pin`` (when
  given, so every row has that amax) and the rest ``fill``."""
  per = width - (pin is not None)
  vals = [F32(v) for v in values]
  rows = []
  for i in range(0, max(len(vals), 1), per):
    chunk = vals[i:i + per]
    row = ([F32(pin)] if pin is not None else []) + chunk
    row += [F32(fill)] * (width - len(row))
    rows.append(row)
  return np.array(rows, np.float32)


def _tie_values(f: formats_lib.Format) -> list[F32]:
  """Grid midpoints of ``f`` below ``2^emax`` (scale 2^0), one ulp either side, and
  rounding carries; negated copies follow."""
  m, out = f.man_bits, []
  q_sub = 2.0 ** (f.emin - m)
  for k in (0.5, 1.5, 2.5):  # subnormal ties: to zero, up to 2 quanta, down to 2
    if k * q_sub < 2.0 ** f.emin:
      out += [k * q_sub, _up(k * q_sub), _down(k * q_sub)]
  out += [0.25 * q_sub, 0.75 * q_sub]  # below half a quantum, above
  for j in range(f.emin, f.emax):
    q = 2.0 ** (j - m)
    for t in (2.0 ** j + 0.5 * q, 2.0 ** j + 1.5 * q):  # ties to even: down, up
      out += [t, _up(t), _down(t)]
    carry = 2.0 ** (j + 1) - 0.5 * q  # the last tie of the binade rounds up a binade
    out += [carry, _down(carry)]
  return out + [-v for v in out]


def _top_binade(f: formats_lib.Format) -> list[F32]:
  """Ties in ``[2^emax, max]`` (a block pinned at ``max``: scale 2^0 for every rule
  but ``ceil`` and ``alto``)."""
  q = 2.0 ** (f.emax - f.man_bits)
  ties = [t for t in np.arange(2.0 ** f.emax + 0.5 * q, f.max, q)]
  return ties + [_up(t) for t in ties] + [-t for t in ties]


def mx_inputs(fmt: str) -> np.ndarray:
  """The MX conformance tensor of element format ``fmt``, shape ``(rows, 32)``."""
  f = formats_lib.get(fmt)
  w, top = 32, 2.0 ** f.emax
  rows = [np.array([[0.0, -0.0] * 16], np.float32)]
  rows.append(_blocks(_tie_values(f), w, top))
  rows.append(_blocks(_top_binade(f), w, f.max))
  # Saturation above max: the tie between max and the next grid value (RNE: to max
  # when max's mantissa is even), the top binade's end.
  sat = [f.max * 1.0001, f.max + 2.0 ** (f.emax - f.man_bits) / 2,
         (f.max + 2 ** (f.emax + 1)) / 2, 2 ** (f.emax + 1) * 0.99,
         _down(2 ** (f.emax + 1))]
  rows += [_blocks([v / 3, -v / 7], w, -v if i % 2 else v) for i, v in enumerate(sat)]
  # Power-of-two edges: amax max * 2^k and 2^k, exactly and one ulp either side.
  for k in (-62, -30, -15, -13, -1, 0, 13, 15, 26, 60, 93, 114):
    for base in (float(f.max) * 2.0 ** k, 2.0 ** k):
      if base * 2 < float(np.finfo(np.float32).max):
        for v in (base, _up(base), _down(base)):
          rows.append(_blocks([v / 2, -v / 3, v / 5], w, v))
  sub = [2.0 ** -149, 2.0 ** -140, -(2.0 ** -130), 3 * 2.0 ** -149]
  rows.append(_blocks(sub, w, None))  # float32 subnormals only
  rows.append(_blocks(sub, w, top))  # inside a normal block
  for amax in (2.0 ** -120, 1e-30, 2.0 ** -70, np.finfo(np.float32).max, 2.0 ** 127,
               3e38):
    rows.append(_blocks([amax / 3, -amax / 1.5, amax * 0.75], w, -amax))
  for special in (np.nan, np.inf, -np.inf):
    rows.append(_blocks([1.0, -2.0, 0.0], w, special))
  return np.concatenate(rows).astype(np.float32)


def nvfp4_inputs() -> dict[str, np.ndarray]:
  """The NVFP4 conformance tensors (each ``(rows, 16)``): the tensor scale makes the
  blocks of a tensor interact, so the cases are separate tensors."""
  f = formats_lib.get("e2m1")
  w = 16
  edges = [np.array([[0.0, -0.0] * 8], np.float32), _blocks(_tie_values(f), w, 4.0)]
  edges += [_blocks([a / 3, -a / 2, a * 0.75, 0.0], w, a)
            for a in (6.0, _up(6.0), 7.0, 448.0 * 6, 448.0 * 6.5, 2.0 ** 12)]
  # Scale 0.9375: x / s is an E2M1 tie (1.25, 2.5) that x * (1/s) rounds above.
  edges.append(_blocks([1.171875, -1.171875, 2.34375], w, 5.625))
  wide = [_blocks([a / 3, -a / 2, a / 6 * 5, 0.0, -0.0], w, a) for a in
          (1.0, 2.0 ** -4, 2.0 ** -8, 6 * 2.0 ** -10, _up(6 * 2.0 ** -10),
           _down(6 * 2.0 ** -10), 2.0 ** -12, 2.0 ** -16, 2.0 ** -20, 6 * 2.0 ** -63,
           2.0 ** -70, 2.0 ** -130)]
  sub = [2.0 ** -149, -(2.0 ** -140), 2.0 ** -130]
  tensors = {
      "edges": np.concatenate(edges),
      "wide": np.concatenate(wide),
      "scale_zero": np.concatenate([_blocks([a, -a / 2, 0.0], w, a) for a in
                                    (1e-3, 2.0 ** -20, 5e-4)]),
      "subnormal": np.concatenate([_blocks(sub, w, None), _blocks(sub, w, 1.0)]),
      "huge": np.concatenate([_blocks([1.0, -3e38], w, np.finfo(np.float32).max),
                              _blocks([0.5, -0.25], w, 1.0)]),
      "zero": np.zeros((2, w), np.float32),
      "nan_inf": np.concatenate([_blocks([1.0, -2.0], w, a)
                                 for a in (np.nan, np.inf, -np.inf, 3.0)]),
  }
  # One shape for all (zero rows change no tensor amax): one compilation per convention.
  rows = max(len(v) for v in tensors.values())
  return {k: np.concatenate([v, np.zeros((rows - len(v), w), np.float32)])
          for k, v in tensors.items()}
