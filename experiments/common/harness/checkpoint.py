"""orbax checkpoints of a training run, verified on restore, keeping a healthy one.

One checkpoint is a Composite of two items: ``state`` (the array pytree: params,
optimizer state, step counter and the loop's PRNG key) and ``meta`` (JSON: step, the
data iterator's position, the loop's record of the run so far, a SHA-256 of every
array and, when the checkpointer is given one, the run's config, so a resume can be
checked against the config the arrays were trained with even when ``config.json`` is
gone: :func:`experiments.common.harness.workdir.claim`). Saves are synchronous: the train step
donates its state buffers, and a synchronous save guarantees they are on disk before
they are reused.

Integrity: :meth:`Checkpointer.restore` recomputes every array's checksum and compares
it with the one recorded when the checkpoint was written;
:meth:`Checkpointer.restore_latest_intact` walks back from the newest step past
damaged or incomplete ones (a flipped bit, a missing or truncated file, a step whose
metadata never got written), logging one warning per bad step with the reason.

Retention: the newest ``max_to_keep`` steps, and always the newest *healthy* one (the
loop marks a checkpoint unhealthy when its loss was non-finite or above its blow-up
threshold), so a run that diverged can be resumed from before it did
(``--resume_step``).

In a multi-process job every process must call :meth:`save` / :meth:`restore` (orbax
coordinates them); the primary process writes the metadata and each array shard is
written once, by the process holding replica 0.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
from typing import Any, Mapping, NamedTuple

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging

from experiments.common.harness import run_metadata


class Snapshot(NamedTuple):
  """Everything needed to continue a run exactly.

  Attributes:
    state: the train state pytree (arrays only; includes its own step counter).
    rng: the loop's PRNG key (raw uint32[2]) from which each step's key is split.
    step: number of completed train steps.
    data_position: position of the training-batch iterator (batches consumed).
    record: JSON-able facts the loop keeps across a resume: the last logged train and
      eval metrics, the timed steps and seconds so far, whether the state is healthy.
  """

  state: Any
  rng: jax.Array
  step: int
  data_position: int
  record: Mapping[str, Any] = {}


class CheckpointError(RuntimeError):
  """A checkpoint cannot be restored intact (the message names the step and why)."""


def array_checksums(tree: Any) -> dict[str, str] | None:
  """``{leaf path: sha256 of dtype, shape and bytes}`` of every array in ``tree``.

  None when an array is not fully readable by this process (sharded across processes):
  such a checkpoint is restored without the check.
  """
  out = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable \
        and not leaf.is_fully_replicated:
      return None
    a = np.asarray(jax.device_get(leaf))
    h = hashlib.sha256(f"{a.dtype.str}{a.shape}".encode())
    h.update(np.ascontiguousarray(a).tobytes())
    out[jax.tree_util.keystr(path)] = h.hexdigest()
  return out


def _first_line(e: BaseException) -> str:
  """The first line of ``e``'s message, without the reprs of bound methods that
  tensorstore's messages carry, cut to 200 characters."""
  text = re.sub(r"<bound method [^>]*>", "...", str(e)).strip()
  return text.splitlines()[0][:200] if text else type(e).__name__


class Checkpointer:
  """A thin wrapper over ``ocp.CheckpointManager`` for :class:`Snapshot`."""

  def __init__(self, directory: str, *, max_to_keep: int = 2, config: Any = None):
    """``config``: the run's config dataclass, recorded in every checkpoint it saves."""
    if not os.path.isabs(directory):
      raise ValueError(f"checkpoint directory must be absolute (orbax requires it): {directory}")
    if max_to_keep < 1:
      raise ValueError(f"max_to_keep must be >= 1, got {max_to_keep}")
    self.directory = directory
    self.max_to_keep = max_to_keep
    self._config = None if config is None else run_metadata.config_record(config)
    # Retention is ours (see the module docstring), so orbax keeps everything.
    self._manager = ocp.CheckpointManager(
        directory,
        options=ocp.CheckpointManagerOptions(create=True, enable_async_checkpointing=False))

  def latest_step(self) -> int | None:
    """The newest saved step, or None."""
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return sorted(self._manager.all_steps())

  def save(self, snapshot: Snapshot) -> None:
    """Saves ``snapshot`` under its step (a step already saved is left as it is), then
    deletes the steps retention no longer needs."""
    if snapshot.step in self._manager.all_steps():
      return
    trees = {"state": snapshot.state, "rng": snapshot.rng}
    self._check_space(snapshot.step, trees)
    meta = {"step": int(snapshot.step), "data_position": int(snapshot.data_position),
            "record": dict(snapshot.record), "checksums": array_checksums(trees)}
    if self._config is not None:
      meta["config"] = self._config
    self._manager.save(snapshot.step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(trees), meta=ocp.args.JsonSave(meta)), force=True)
    self._manager.wait_until_finished()
    self._prune()

  def _check_space(self, step: int, trees: Any) -> None:
    """Raises ENOSPC before writing when the disk cannot hold the checkpoint.

    A write that runs out of space half way fails inside tensorstore's threads, which
    print a traceback per pending write; checking first gives one clear error instead.
    The estimate is the arrays' bytes plus 10% and 256 KiB of metadata (measured: a
    180 KB state took 216 KB on disk)."""
    nbytes = sum(np.dtype(x.dtype).itemsize * int(np.prod(x.shape))
                 for x in jax.tree.leaves(trees))
    needed = int(1.1 * nbytes) + (256 << 10)
    free = shutil.disk_usage(self.directory).free
    if free < needed:
      raise OSError(errno.ENOSPC, f"No space left on device for checkpoint step {step}: "
                    f"{free} bytes free, about {needed} needed", self.directory)

  def delete_after(self, step: int) -> None:
    """Deletes every checkpoint newer than ``step`` (an abandoned trajectory)."""
    for s in self.all_steps():
      if s > step:
        self._manager.delete(s)

  def _meta(self, step: int) -> dict[str, Any] | None:
    """The JSON metadata of ``step``, or None when it cannot be read."""
    try:
      meta = self._manager.restore(step, args=ocp.args.Composite(
          meta=ocp.args.JsonRestore())).meta
    except Exception:  # pylint: disable=broad-except  (unreadable: treated as absent)
      return None
    return meta if isinstance(meta, dict) else None

  def _healthy(self, step: int) -> bool:
    meta = self._meta(step)
    return meta is not None and bool(meta.get("record", {}).get("healthy", True))

  def steps_with_metadata(self) -> list[int]:
    """The steps whose metadata reads back (an empty or half-written step's does not)."""
    return [step for step in self.all_steps() if self._meta(step) is not None]

  def recorded_config(self) -> dict[str, Any] | None:
    """The config record (``{"config_class", "config"}``) of the newest checkpoint whose
    metadata reads back; None when none records one (saved without a ``config``)."""
    for step in reversed(self.all_steps()):
      meta = self._meta(step)
      if meta is not None:
        return meta.get("config")
    return None

  def _prune(self) -> None:
    steps = self.all_steps()
    keep = set(steps[-self.max_to_keep:])
    healthy = next((s for s in reversed(steps) if self._healthy(s)), None)
    if healthy is not None:
      keep.add(healthy)
    for s in steps:
      if s not in keep:
        self._manager.delete(s)

  def _read(self, step: int, abstract: Any):
    return self._manager.restore(
        step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract),
                                      meta=ocp.args.JsonRestore()))

  def restore(self, abstract_state: Any, abstract_rng: Any, step: int | None = None
              ) -> Snapshot:
    """Restores ``step`` (default: the latest) into the structure of the abstract trees
    and verifies every array's checksum.

    Args:
      abstract_state: the state pytree or a tree of ``jax.ShapeDtypeStruct`` (with
        shardings, for multi-device runs) describing it.
      abstract_rng: likewise for the PRNG key.
      step: which checkpoint; None for the latest.

    Raises:
      FileNotFoundError: no checkpoint.
      CheckpointError: the checkpoint is incomplete, unreadable or fails its checksums.
    """
    step = self.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"no checkpoint in {self.directory}")
    if step not in self.all_steps():
      raise CheckpointError(f"no checkpoint at step {step} in {self.directory} (steps: "
                            f"{self.all_steps()})")
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct,
                            {"state": abstract_state, "rng": abstract_rng})
    try:
      restored = self._read(step, abstract)
    except Exception as e:  # pylint: disable=broad-except  (tensorstore, json, missing files)
      raise CheckpointError(f"checkpoint step {step} in {self.directory} cannot be "
                            f"read ({type(e).__name__}: {_first_line(e)})") from e
    meta = restored.meta
    if meta is None or int(meta.get("step", -1)) != step:
      raise CheckpointError(f"checkpoint step {step} in {self.directory} has no valid "
                            f"metadata (records step {None if meta is None else meta.get('step')})")
    expected = meta.get("checksums")
    trees = {"state": restored.state["state"], "rng": restored.state["rng"]}
    if expected is not None:
      got = array_checksums(trees)
      if got is not None and got != expected:
        bad = sorted(k for k in expected if got.get(k) != expected[k])
        raise CheckpointError(
            f"checkpoint step {step} in {self.directory} fails its checksums: "
            f"{len(bad)} array(s) differ from what was written ({', '.join(bad[:4])}"
            f"{', ...' if len(bad) > 4 else ''})")
    return Snapshot(state=trees["state"], rng=trees["rng"], step=int(meta["step"]),
                    data_position=int(meta["data_position"]),
                    record=meta.get("record", {}))

  def restore_latest_intact(self, abstract_state: Any, abstract_rng: Any,
                            max_step: int | None = None) -> Snapshot:
    """The newest checkpoint (at or below ``max_step``) that restores intact; a warning
    names each newer step skipped and why.

    Raises:
      CheckpointError: no step restores intact (listing every step's reason).
    """
    reasons = []
    for step in reversed(self.all_steps()):
      if max_step is not None and step > max_step:
        continue
      try:
        snapshot = self.restore(abstract_state, abstract_rng, step)
      except CheckpointError as e:
        logging.warning("skipping damaged checkpoint: %s", e)
        reasons.append(str(e).replace(f"checkpoint step {step} in {self.directory} ",
                                      f"step {step} "))
        continue
      if reasons:
        logging.warning("restored step %d, the newest intact checkpoint in %s", step,
                        self.directory)
      return snapshot
    raise CheckpointError(
        f"no intact checkpoint to resume from in {self.directory}"
        + (f" ({'; '.join(reasons)})" if reasons else "") + ". Put back an intact copy "
        f"of it, or move it aside (mv {self.directory} {self.directory}.damaged) and "
        "run again without --resume to train from step 0.")

  def close(self) -> None:
    self._manager.close()
