"""Multi-digit addition as a verifiable-reward task for RL on a tiny LM (runs on CPU).

A problem is ``a + b`` with ``a, b`` uniform in ``[0, 10**digits)``. The prompt is the
zero-padded ``"a+b="`` (``2 * digits + 2`` tokens); the answer is the sum's
``digits + 1`` digits *least-significant first* (the carry then flows in generation
order, which a 2-layer transformer can learn) followed by the end marker ``"."``. The
reward of a completion is 1 when it equals the answer up to and including the first
end marker (exact match), else 0.

Everything is a pure function of ``(seed, position)`` like the other loaders, so runs
resume exactly and every arm of a sweep sees the same problems.
"""

from __future__ import annotations

import numpy as np

CHARS = "_0123456789+=."  # "_" (id 0) pads; "." ends an answer
PAD, PLUS, EQUALS, END = 0, CHARS.index("+"), CHARS.index("="), CHARS.index(".")
VOCAB_SIZE = len(CHARS)


def prompt_length(digits: int) -> int:
  return 2 * digits + 2


def answer_length(digits: int) -> int:
  return digits + 2


def _digits_of(x: np.ndarray, width: int) -> np.ndarray:
  """int64[B] -> int32[B, width] token ids, most-significant digit first."""
  powers = 10 ** np.arange(width - 1, -1, -1, dtype=np.int64)
  return ((x[:, None] // powers) % 10 + 1).astype(np.int32)  # digit d is token d + 1


def problems(*, seed: int, position: int, batch_size: int, digits: int
             ) -> dict[str, np.ndarray]:
  """A batch of addition problems.

  Returns ``prompts`` int32[B, 2d+2], ``answers`` int32[B, d+2] (the correct
  completion), ``a`` and ``b`` int64[B].
  """
  if not 1 <= digits <= 9:
    raise ValueError(f"digits must be in [1, 9], got {digits}")
  if batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}")
  rng = np.random.default_rng([seed, position, 0xADD])
  a = rng.integers(0, 10 ** digits, batch_size, dtype=np.int64)
  b = rng.integers(0, 10 ** digits, batch_size, dtype=np.int64)
  column = lambda v: np.full((batch_size, 1), v, np.int32)
  prompts = np.concatenate([_digits_of(a, digits), column(PLUS), _digits_of(b, digits),
                            column(EQUALS)], axis=1)
  answers = np.concatenate([_digits_of(a + b, digits + 1)[:, ::-1], column(END)], axis=1)
  return {"prompts": prompts, "answers": answers, "a": a, "b": b}


def grouped_prompts(*, seed: int, position: int, num_prompts: int, group_size: int,
                    digits: int) -> dict[str, np.ndarray]:
  """:func:`problems` with each problem repeated ``group_size`` times, group-major
  (rows ``g * group_size .. (g + 1) * group_size - 1`` are problem g), for GRPO."""
  if group_size < 1:
    raise ValueError(f"group_size must be >= 1, got {group_size}")
  p = problems(seed=seed, position=position, batch_size=num_prompts, digits=digits)
  return {k: np.repeat(v, group_size, axis=0) for k, v in p.items()}


def supervised_batch(*, seed: int, position: int, batch_size: int, digits: int
                     ) -> dict[str, np.ndarray]:
  """Teacher-forcing batch of prompt + answer: ``inputs``/``targets`` int32[B, L-1]
  (L = 3d + 4) and ``mask`` float32[B, L-1], 1 where the target is an answer token."""
  p = problems(seed=seed, position=position, batch_size=batch_size, digits=digits)
  seq = np.concatenate([p["prompts"], p["answers"]], axis=1)
  mask = np.zeros(seq.shape, np.float32)
  mask[:, prompt_length(digits):] = 1.0
  return {"inputs": seq[:, :-1], "targets": seq[:, 1:], "mask": mask[:, 1:]}


def completion_mask(completions: np.ndarray) -> np.ndarray:
  """float32[B, N]: 1 up to and including the first end marker, 0 after it (tokens a
  policy emits after ending its answer are not part of it)."""
  completions = np.asarray(completions)
  ended_before = np.cumsum(completions == END, axis=1) - (completions == END)
  return (ended_before == 0).astype(np.float32)


def rewards(completions: np.ndarray, answers: np.ndarray) -> np.ndarray:
  """float32[B]: 1.0 where the completion equals the answer through its end marker.

  The answer's own end marker is its last token, so this is exact equality of the
  first ``d + 2`` completion tokens."""
  completions, answers = np.asarray(completions), np.asarray(answers)
  if completions.shape[0] != answers.shape[0] or completions.shape[1] < answers.shape[1]:
    raise ValueError(f"completions {completions.shape} cannot hold answers "
                     f"{answers.shape}")
  n = answers.shape[1]
  return np.all(completions[:, :n] == answers, axis=1).astype(np.float32)


def decode(tokens: np.ndarray) -> list[str]:
  """Token ids [B, L] -> strings (for logs and tests)."""
  return ["".join(CHARS[t] for t in row) for row in np.asarray(tokens)]
