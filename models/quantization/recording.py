"""What a quantized model did with each contraction it saw: :func:`recording`.

Every op the interception sees (caught by a rule or not) is recorded as an
:class:`OpRecord` with the reason it ran as it did, so a model's quantization plan can
be read before training (``jax.eval_shape`` traces without computing).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator, NamedTuple, Sequence

from lowprec.models.quantization.rules import Rule, check_rules

ROOT = '"" (root)'  # the quantized model's own path in a plan


class OpRecord(NamedTuple):
  """One intercepted op.

  ``path``: the issuing module's path; ``op_id``: the op's name in that module
  (``dot_general_0``, ``einsum_1``, ``conv_0``, ...; the key of its state and
  telemetry); ``rule``: the rule that decided it (None: no rule matched); ``kind``:
  its :data:`lowprec.models.quantization.rules.OPS` kind; ``reason``: how it ran, in
  words (the rule named by its index in ``quantize_model``'s ``rules``: ``rules[2]``).
  """

  path: str
  op_id: str
  rule: Rule | None
  lhs_shape: tuple[int, ...]
  rhs_shape: tuple[int, ...]
  kind: str = ""
  reason: str = ""


_local = threading.local()


def _recorders() -> list[list[OpRecord]]:
  if not hasattr(_local, "recorders"):
    _local.recorders = []
  return _local.recorders


def record(op: OpRecord) -> None:
  """Appends ``op`` to every :func:`recording` open in this thread."""
  for records in _recorders():
    records.append(op)


@contextlib.contextmanager
def recording() -> Iterator[list[OpRecord]]:
  """Collects an :class:`OpRecord` for every op a quantized model sees in this thread
  inside the ``with`` block (trace the model, e.g. with ``jax.eval_shape``, to read
  its plan)."""
  records: list[OpRecord] = []
  _recorders().append(records)
  try:
    yield records
  finally:
    _recorders().remove(records)


def unused_rules(rules: Sequence[Rule], records: Sequence[OpRecord]) -> tuple[Rule, ...]:
  """The rules that caught no op in ``records`` (a typo in a path, usually)."""
  used = {id(r.rule) for r in records if r.rule is not None}
  return tuple(r for r in check_rules(rules) if id(r) not in used)


def plan(records: Sequence[OpRecord]) -> str:
  """A markdown table of ``records``: path | op | kind | operands | how it ran. The
  quantized model itself is ``"" (root)``: its path, which a rule for it matches."""
  lines = ["| module | op | kind | lhs x rhs | how it ran |", "|---|---|---|---|---|"]
  for r in records:
    cells = (r.path or ROOT, r.op_id, r.kind, f"{r.lhs_shape} x {r.rhs_shape}", r.reason)
    # A path regex's alternatives ("head|lm_head") would split a markdown cell.
    lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
  return "\n".join(lines)
