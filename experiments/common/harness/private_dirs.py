"""Per-user private directories for what a run keeps between runs (the compilation cache).

A default location shared by every user of a machine (``/tmp/jax_cache_lm``) lets the
first user to create it decide what the others load: JAX runs a cached executable
without checking who wrote it. So a default here lives under the user's own cache home
(``$XDG_CACHE_HOME``, else ``~/.cache``), falling back to ``<tmp>/lowprec-<uid>`` where
the home cannot be written, is created with mode 0700, and is used only when it is
private: the directory is owned by this user and no other user can write it or any
directory above it (a directory writable by others is accepted above it only with the
sticky bit, as ``/tmp`` has, which stops others renaming what is inside).
"""

from __future__ import annotations

import os
import stat
import tempfile

APP = "lowprec"


class UnsafeDirectory(OSError):
  """A directory another user could write (or swap), so its contents cannot be trusted."""


def cache_home() -> str:
  """This user's cache directory: ``$XDG_CACHE_HOME`` when absolute, else ``~/.cache``."""
  xdg = os.environ.get("XDG_CACHE_HOME", "")
  return xdg if os.path.isabs(xdg) else os.path.join(os.path.expanduser("~"), ".cache")


def unsafe_reason(path: str) -> str | None:
  """Why ``path`` is not a private directory of this user (None when it is).

  ``path`` (symbolic links resolved) must be a directory owned by the effective user
  and not writable by group or others; each directory above it must not be writable
  by group or others unless its sticky bit is set."""
  real = os.path.realpath(path)
  try:
    st = os.stat(real)
  except OSError as e:
    return f"{real} cannot be read ({e.strerror})"
  if not stat.S_ISDIR(st.st_mode):
    return f"{real} is not a directory"
  if st.st_uid != os.geteuid():
    return f"{real} is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
  if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
    return f"{real} is writable by other users (mode {stat.S_IMODE(st.st_mode):o})"
  parent = os.path.dirname(real)
  while True:
    st = os.stat(parent)
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
      return (f"{parent}, above {real}, is writable by other users without the sticky "
              f"bit (mode {stat.S_IMODE(st.st_mode):o}), so they could replace what is "
              "below it")
    if parent == os.path.dirname(parent):
      return None
    parent = os.path.dirname(parent)


def private_directory(path: str) -> str:
  """Creates ``path`` (and missing parents) with mode 0700 and returns it, or raises
  :class:`UnsafeDirectory` naming why it is not private (:func:`unsafe_reason`)."""
  os.makedirs(path, mode=0o700, exist_ok=True)
  reason = unsafe_reason(path)
  if reason is not None:
    raise UnsafeDirectory(reason)
  return path


def default_cache_dir(name: str) -> str:
  """This user's private directory ``name`` for cached data: under :func:`cache_home`
  (``<cache home>/lowprec/<name>``), or ``<tmp>/lowprec-<uid>/<name>`` when the cache
  home cannot be created. Created 0700; raises :class:`UnsafeDirectory` when the one
  chosen is not private."""
  try:
    return private_directory(os.path.join(cache_home(), APP, name))
  except UnsafeDirectory:
    raise
  except OSError:  # no writable home (a service account, a read-only home)
    return private_directory(os.path.join(tempfile.gettempdir(), f"{APP}-{os.geteuid()}",
                                          name))
