"""What a compiled program's optimized HLO text holds: its GEMMs and custom calls.

    compiled = jax.jit(f).trace(*args).lower().compile()
    for g in hlo_program.gemms(compiled.as_text()):
      print(g.op, g.operand_types, g.out_type, g.flops)

A GEMM is a ``dot`` or ``scaled-dot`` instruction (also the one inside a GPU gemm
fusion: XLA keeps the fused computation in the text), a TPU ``convolution`` (the TPU
compiler rewrites a dot into one), or a cuBLAS / cuBLASLt / cuDNN GEMM custom call
(``__cublas$gemm``, ``__cublas$lt$matmul``, ``__cublas$lt$matmul$f8``,
``__cudnn$blockScaledDot``). Its operand types are those the instruction itself takes:
where XLA fuses a dequantizing ``convert`` into a gemm fusion, the fusion's parameters
are narrow but the dot's operands are not, and the GEMM does not run on narrow
operands. Issue 53's check of native GEMMs reads :func:`narrow_gemms` of a native
recipe's H200 / B200 program.

:func:`custom_calls` lists every custom call with the bytes of its operands and
results: XLA's cost analysis counts a custom call (a Pallas kernel, a cuBLAS GEMM) as
unknown, so a step's estimate adds them (experiments/benchmarks/step_compile.py).

Types are HLO's names: ``f32``, ``bf16``, ``f8e4m3fn``, ``f8e5m2``, ``f4e2m1fn``,
``f8e8m0fnu`` (a block scale).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Sequence

_DOT_OPS = ("dot", "scaled-dot", "convolution")
_GEMM_CALL = re.compile(r"^__cublas\$(gemm|lt\$matmul|lt\$groupedMatmul)|"
                        r"^__cudnn\$blockScaledDot")
_TARGET = re.compile(r'custom_call_target="([^"]+)"')
_DEF = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_ARRAY = re.compile(r"^(\w+)\[([^\]]*)\](?:\{[^}]*\})?")
_OPCODE = re.compile(r"^\s*([a-z][\w\-]*)\(")
_LHS_CONTRACTING = re.compile(r"lhs_contracting_dims=\{([\d,]*)\}")
NARROW_PREFIXES = ("f8", "f4", "s4", "u4")
_BITS = {"pred": 8, "s4": 4, "u4": 4, "f4e2m1fn": 4, "f64": 64, "s64": 64, "u64": 64,
         "c64": 64, "c128": 128, "f32": 32, "s32": 32, "u32": 32, "bf16": 16, "f16": 16,
         "s16": 16, "u16": 16, "token": 0}


@dataclasses.dataclass(frozen=True)
class Array:
  """An array shape: HLO element type and dimensions."""
  dtype: str
  dims: tuple[int, ...]

  @property
  def nbytes(self) -> float:
    bits = _BITS.get(self.dtype, 8)  # every f8 / s8 / u8 type
    return math.prod(self.dims) * bits / 8


@dataclasses.dataclass(frozen=True)
class Gemm:
  """One GEMM of a program: its instruction, computation, element types and FLOPs."""

  name: str
  op: str                         # "dot", "scaled-dot", "convolution" or "custom-call"
  target: str | None              # the custom call's target (None for the others)
  operand_types: tuple[str, ...]  # the two matrix operands (the scales follow, if any)
  out_type: str                   # the result's element type (a tuple's first array)
  computation: str
  flops: float | None             # 2 M N K (None where the text does not say K)

  @property
  def narrow(self) -> bool:
    """Whether both matrix operands are 8-bit or 4-bit (the GEMM runs on them)."""
    return len(self.operand_types) >= 2 and all(
        t.startswith(NARROW_PREFIXES) for t in self.operand_types[:2])


@dataclasses.dataclass(frozen=True)
class CustomCall:
  """A custom call: its target and the bytes of its operands and results."""
  name: str
  target: str
  operand_bytes: float
  result_bytes: float
  computation: str


@dataclasses.dataclass(frozen=True)
class _Instruction:
  name: str
  results: tuple[Array, ...]
  opcode: str
  operands: tuple[tuple[Array, ...], ...]
  attrs: str
  computation: str


def _closing(text: str, start: int) -> int:
  """The index just past the bracket that closes ``text[start]``."""
  pairs = {"(": ")", "{": "}", "[": "]"}
  stack = []
  for i in range(start, len(text)):
    c = text[i]
    if c in pairs:
      stack.append(pairs[c])
    elif stack and c == stack[-1]:
      stack.pop()
      if not stack:
        return i + 1
  return len(text)


def _split_top(text: str) -> list[str]:
  """``text`` split at the commas outside brackets."""
  parts, depth, cur = [], 0, []
  for c in text:
    depth += (c in "([{") - (c in ")]}")
    if c == "," and depth == 0:
      parts.append("".join(cur).strip())
      cur = []
    else:
      cur.append(c)
  if "".join(cur).strip():
    parts.append("".join(cur).strip())
  return parts


def _array(m: re.Match) -> Array:
  dims = tuple(int(d.strip().lstrip("<=")) for d in m.group(2).split(",") if d.strip())
  return Array(m.group(1), dims)


def _shape(text: str) -> tuple[tuple[Array, ...], str] | None:
  """The arrays of a shape at the start of ``text`` (a tuple's elements) and the rest."""
  if text.startswith("("):
    end = _closing(text, 0)
    arrays = tuple(_array(m) for m in (_ARRAY.match(p) for p in _split_top(text[1:end - 1]))
                   if m)
    return arrays, text[end:]
  m = _ARRAY.match(text)
  return ((_array(m),), text[m.end():]) if m else None


def _instructions(hlo_text: str):
  """Every instruction of the text, its operands' shapes resolved in its computation."""
  shapes: dict[str, tuple[Array, ...]] = {}
  computation = ""
  for line in hlo_text.splitlines():
    stripped = line.strip()
    if stripped.endswith("{") and "=" not in stripped.split("(", 1)[0]:
      computation = stripped.split()[1 if stripped.startswith("ENTRY") else 0].lstrip("%")
      shapes = {}
      continue
    d = _DEF.match(line)
    parsed = _shape(d.group(2).strip()) if d else None
    if parsed is None:
      continue
    results, rest = parsed
    op = _OPCODE.match(rest)
    if not op:
      continue
    open_at = rest.index("(", op.start(1))
    close = _closing(rest, open_at)
    operands = []
    for text in _split_top(rest[open_at + 1:close - 1]):
      inline = _shape(text)  # printed with its shape: "bf16[8,8]{1,0} %x"
      operands.append(inline[0] if inline else shapes.get(text.split()[-1].lstrip("%"), ()))
    shapes[d.group(1)] = results
    yield _Instruction(d.group(1), results, op.group(1), tuple(operands), rest[close:],
                       computation)


def is_gemm_call(target: str) -> bool:
  """Whether a custom-call target is a cuBLAS / cuBLASLt / cuDNN GEMM."""
  return bool(_GEMM_CALL.search(target))


def _dtype(arrays: tuple[Array, ...]) -> str:
  return arrays[0].dtype if arrays else "?"


def _gemm_flops(ins: _Instruction) -> float | None:
  """2 x (result elements) x (contracted elements) of a dot or a cuBLAS GEMM."""
  if not ins.results or not ins.operands or not ins.operands[0]:
    return None
  if ins.opcode in ("dot", "scaled-dot"):
    m = _LHS_CONTRACTING.search(ins.attrs)
    dims = [int(d) for d in m.group(1).split(",") if d] if m else None
  elif ins.opcode == "custom-call":
    key = "backend_config="
    at = ins.attrs.find(key + "{")
    try:
      start = at + len(key)
      config = json.loads(ins.attrs[start:_closing(ins.attrs, start)]) if at >= 0 else {}
      numbers = config["gemm_backend_config"]["dot_dimension_numbers"]
      dims = [int(d) for d in numbers["lhs_contracting_dimensions"]]
    except (KeyError, TypeError, ValueError):  # no GEMM config (a cuDNN call)
      dims = None
  else:
    dims = None
  if dims is None:
    return None
  lhs = ins.operands[0][0].dims
  return 2.0 * math.prod(ins.results[0].dims) * math.prod(lhs[d] for d in dims)


def gemms(hlo_text: str) -> list[Gemm]:
  """Every GEMM of an HLO module's text (``compiled.as_text()``), in text order."""
  out = []
  for ins in _instructions(hlo_text):
    target = None
    if ins.opcode == "custom-call":
      t = _TARGET.search(ins.attrs)
      target = t.group(1) if t else None
      if not (target and is_gemm_call(target)):
        continue
    elif ins.opcode not in _DOT_OPS:
      continue
    out.append(Gemm(ins.name, ins.opcode, target,
                    tuple(_dtype(o) for o in ins.operands), _dtype(ins.results),
                    ins.computation, _gemm_flops(ins)))
  return out


def narrow_gemms(hlo_text: str) -> list[Gemm]:
  """The GEMMs of ``hlo_text`` whose two matrix operands are 8- or 4-bit."""
  return [g for g in gemms(hlo_text) if g.narrow]


def summary(program: str | Sequence[Gemm]) -> dict[str, int]:
  """``{"<lhs> x <rhs> -> <out> <op or target>": count}`` over the GEMMs of an HLO
  text (or of the list :func:`gemms` returned)."""
  counts: dict[str, int] = {}
  for g in gemms(program) if isinstance(program, str) else program:
    key = f"{' x '.join(g.operand_types[:2])} -> {g.out_type} {g.target or g.op}"
    counts[key] = counts.get(key, 0) + 1
  return dict(sorted(counts.items()))


def custom_calls(hlo_text: str) -> list[CustomCall]:
  """Every custom call of ``hlo_text`` with its operand and result bytes."""
  out = []
  for ins in _instructions(hlo_text):
    if ins.opcode != "custom-call":
      continue
    t = _TARGET.search(ins.attrs)
    out.append(CustomCall(ins.name, t.group(1) if t else "?",
                          sum(a.nbytes for o in ins.operands for a in o),
                          sum(a.nbytes for a in ins.results), ins.computation))
  return out
