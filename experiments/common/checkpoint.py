"""orbax checkpoints of a training run: train state, PRNG key, data position and step.

One checkpoint is a Composite of two items: ``state`` (the array pytree: params, optimizer
state, step counter and the loop's PRNG key) and ``meta`` (JSON: step and the data
iterator's position). Saves are synchronous: the train step donates its state buffers,
and a synchronous save guarantees they are on disk before they are reused.
In a multi-process job every process must call :meth:`save` / :meth:`restore` (orbax
coordinates them); the primary process writes the metadata and each array shard is
written once, by the process holding replica 0.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import jax
import orbax.checkpoint as ocp


class Snapshot(NamedTuple):
  """Everything needed to continue a run exactly.

  Attributes:
    state: the train state pytree (arrays only; includes its own step counter).
    rng: the loop's PRNG key (raw uint32[2]) from which each step's key is split.
    step: number of completed train steps.
    data_position: position of the training-batch iterator (batches consumed).
  """

  state: Any
  rng: jax.Array
  step: int
  data_position: int


class Checkpointer:
  """A thin wrapper over ``ocp.CheckpointManager`` for :class:`Snapshot`."""

  def __init__(self, directory: str, *, max_to_keep: int = 2):
    if not os.path.isabs(directory):
      raise ValueError(f"checkpoint directory must be absolute (orbax requires it): {directory}")
    if max_to_keep < 1:
      raise ValueError(f"max_to_keep must be >= 1, got {max_to_keep}")
    self.directory = directory
    self._manager = ocp.CheckpointManager(
        directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                             enable_async_checkpointing=False))

  def latest_step(self) -> int | None:
    """The newest saved step, or None."""
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def save(self, snapshot: Snapshot) -> None:
    """Saves ``snapshot`` under its step (a step already saved is left as it is)."""
    if snapshot.step in self._manager.all_steps():
      return
    self._manager.save(
        snapshot.step,
        args=ocp.args.Composite(
            state=ocp.args.StandardSave({"state": snapshot.state, "rng": snapshot.rng}),
            meta=ocp.args.JsonSave({"step": int(snapshot.step),
                                    "data_position": int(snapshot.data_position)})),
        force=True)
    self._manager.wait_until_finished()

  def restore(self, abstract_state: Any, abstract_rng: Any, step: int | None = None
              ) -> Snapshot:
    """Restores ``step`` (default: the latest) into the structure of the abstract trees.

    Args:
      abstract_state: the state pytree or a tree of ``jax.ShapeDtypeStruct`` (with
        shardings, for multi-device runs) describing it.
      abstract_rng: likewise for the PRNG key.
      step: which checkpoint; None for the latest.
    """
    step = self.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"no checkpoint in {self.directory}")
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct,
                            {"state": abstract_state, "rng": abstract_rng})
    restored = self._manager.restore(
        step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract),
                                      meta=ocp.args.JsonRestore()))
    meta = restored.meta
    if int(meta["step"]) != step:
      raise ValueError(f"checkpoint {step} in {self.directory} records step {meta['step']}")
    return Snapshot(state=restored.state["state"], rng=restored.state["rng"],
                    step=int(meta["step"]), data_position=int(meta["data_position"]))

  def close(self) -> None:
    self._manager.close()
