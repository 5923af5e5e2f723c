"""Compiles every kernel for H200, B200, TPU v5e and TPU v6e on a CPU-only machine.

    python -m lowprec.numerics.kernels.compile_check                # table kernel | H200 | B200 | v5e | v6e
    python -m lowprec.numerics.kernels.compile_check --all          # the full product (331 cases)
    python -m lowprec.numerics.kernels.compile_check --vmem --json=compile.json

Deviceless ahead-of-time compilation runs the real backend compilers without a device:
for the GPUs, Pallas' Triton lowering, the Triton compiler and ptxas (register
allocation, shared memory) against a ``GpuTargetConfigProto`` (``targets/*.txtpb``,
copied from the XLA repository, provenance in each file); for the TPUs, Mosaic's layout
passes and the TPU compiler against libtpu's compile-only topology. A kernel that lowers
(:mod:`numerics.kernels.lowering`) can still fail here.

The toolchain (``compile_requirements.txt``: the CUDA plugin, ptxas from the nvcc wheel,
libtpu, pinned to jax 0.10.2) comes with ``pip install -e ".[compile]"``, or lives in a
directory of its own (``pip install --no-deps --target DIR -r
numerics/kernels/compile_requirements.txt``, then ``--toolchain=DIR``), which keeps the
CUDA plugin's and libtpu's start-up messages out of every other JAX process. The check
reruns itself in a child process with ``JAX_PLATFORMS=cpu`` (else the CUDA plugin tries
to open a device), ptxas' report logged (``TF_CPP_VMODULE``) and XLA's
``--xla_gpu_fail_ptx_compilation_on_register_spilling`` (a kernel that spills fails).
Each compile's stderr is captured: a Triton failure names the MLIR op and the Python
source line it came from (the exception itself says only "Failed to compile Triton
kernel"); Mosaic's exception names the op (it carries no source line).

Per compiled case: GPU registers per thread, spill bytes and shared memory (ptxas and
the Triton emitter's log); TPU the smallest scoped-VMEM limit it compiles under
(``--vmem``: one compile per limit of :data:`VMEM_LADDER_KIB`, each in a child process
with libtpu's ``--xla_tpu_scoped_vmem_limit_kib``; ``memory_analysis()`` reports HBM
argument and output sizes only). And a roofline estimate: the call's HBM bytes over the
target's bandwidth, and for the matmul its FLOPs over the bf16 peak, whichever is longer.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Sequence

from absl import app
from absl import flags

_CHILD_ENV = "NUMERICS_COMPILE_CHECK_CHILD"
_SPILL_FLAG = "--xla_gpu_fail_ptx_compilation_on_register_spilling"
VMEM_LADDER_KIB = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)


@dataclasses.dataclass(frozen=True)
class Target:
  """A compile target and the figures of its roofline (vendor specifications)."""
  name: str
  platform: str        # "cuda" or "tpu"
  spec: str            # a targets/*.txtpb file (cuda) or a libtpu topology (tpu)
  hbm_bytes_per_s: float
  bf16_flops_per_s: float
  source: str          # where the two figures come from


TARGETS = (
    Target("H200", "cuda", "h200.txtpb", 4.8e12, 989e12,
           "NVIDIA H200 SXM: 4.8 TB/s HBM3e, 989 TFLOP/s dense BF16"),
    Target("B200", "cuda", "b200.txtpb", 8.0e12, 2250e12,
           "NVIDIA HGX B200: 8 TB/s HBM3e, 2.25 PFLOP/s dense BF16"),
    Target("v5e", "tpu", "v5e:2x2", 819e9, 197e12,
           "Cloud TPU v5e: 819 GB/s HBM2, 197 TFLOP/s BF16"),
    Target("v6e", "tpu", "v6e:2x2", 1638e9, 918e12,
           "Cloud TPU v6e: 1638 GB/s HBM, 918 TFLOP/s BF16"),
)
_TARGETS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "targets")


@dataclasses.dataclass
class Result:
  case: str
  kernel: str
  target: str
  ok: bool
  seconds: float
  error: str | None = None
  registers: int | None = None        # GPU: per thread (ptxas), the Pallas kernel
  spill_bytes: int | None = None      # GPU: spill stores + loads
  smem_bytes: int | None = None       # GPU: shared memory of the Triton kernel
  vmem_kib: int | None = None         # TPU: smallest scoped-VMEM limit that compiles
  roofline_us: float | None = None


def roofline_us(case, target: Target) -> float:
  """Microseconds at the target's HBM bandwidth (and bf16 peak, for the matmul)."""
  return 1e6 * max(case.hbm_bytes / target.hbm_bytes_per_s,
                   case.flops / target.bf16_flops_per_s)


def target_device(target: Target):
  """The compile-only device of ``target`` (needs ``JAX_PLATFORMS=cpu``)."""
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  if target.platform == "cuda":
    with open(os.path.join(_TARGETS_DIR, target.spec)) as f:
      spec = f.read()
    return topologies.get_topology_desc(platform="cuda", topology_name="",
                                        target_config=spec, topology="1x1x1").devices[0]
  return topologies.get_topology_desc(topology_name=target.spec, platform="tpu").devices[0]


class _CapturedStderr:
  """Redirects file descriptor 2 (where XLA, ptxas and MLIR write) to a file."""

  def __enter__(self):
    sys.stderr.flush()
    self._file = tempfile.TemporaryFile(mode="w+b")
    self._saved = os.dup(2)
    os.dup2(self._file.fileno(), 2)
    return self

  def __exit__(self, *exc):
    sys.stderr.flush()
    os.dup2(self._saved, 2)
    os.close(self._saved)
    self._file.seek(0)
    self.text = self._file.read().decode("utf-8", "replace")
    self._file.close()
    return False


_PTXAS_FN = re.compile(r"Function properties for (\S+)\n\s*(\d+) bytes stack frame, "
                       r"(\d+) bytes spill stores, (\d+) bytes spill loads\n"
                       r"ptxas info\s*: Used (\d+) registers(?:, used \d+ barriers)?"
                       r"(?:, (\d+) bytes smem)?")
_SMEM = re.compile(r"Shared memory usage: (\d+) B")
_MLIR_ERROR = re.compile(r"error: (.*)")
_FRAME = re.compile(r'"([^"]+)"\("([^"]+)":(\d+)')  # "function"("file":line


def _gpu_report(log: str, kernel: str) -> dict[str, int]:
  """Registers, spills and shared memory of the Pallas kernel ``kernel`` in a log."""
  out = {}
  for fn, _, stores, loads, regs, smem in _PTXAS_FN.findall(log):
    if fn == kernel:
      out = dict(registers=int(regs), spill_bytes=int(stores) + int(loads),
                 smem_bytes=int(smem or 0))
  smem = [int(s) for s in _SMEM.findall(log)]
  if out and smem:
    out["smem_bytes"] = max([out["smem_bytes"]] + smem)
  return out


def _short_path(path: str) -> str:
  for root in ("numerics/", "models/", "experiments/"):
    if root in path:
      return root + path.split(root, 1)[1]
  return os.path.basename(path)


def failure_cause(exc: BaseException, log: str) -> str:
  """One line: the backend's message, the MLIR op and (Triton) the source line."""
  for log_line in log.splitlines():  # MLIR's "loc(...): error: ..." lines (Triton)
    error = _MLIR_ERROR.search(log_line)
    if error:
      line = error.group(1).strip()
      frames = _FRAME.findall(log_line[:error.start()])
      if frames:
        fn, path, lineno = frames[0]
        line += f" [at {_short_path(path)}:{lineno} in {fn}]"
      return line[:400]
  text = str(exc)
  op = re.search(r"The MLIR operation involved:\s*\n\s*(.*)", text)
  head = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
  if "CompileTimeScopedVmemOom" in text:
    alloc = re.search(r"Scoped allocation with size \S+ and limit \S+", text)
    head = "scoped VMEM exhausted" + (f" ({alloc.group(0)})" if alloc else "")
  if op and op.group(1).strip() not in head:
    head += f" [op: {op.group(1).strip()}]"
  return head[:400]


def compile_case(case, target: Target, device) -> Result:
  """Compiles ``case`` for ``target`` (in this process, which must be a child)."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jax.sharding import Mesh, NamedSharding, PartitionSpec  # pylint: disable=g-import-not-at-top
  sharding = NamedSharding(Mesh(np.array([device]), ("x",)), PartitionSpec())
  args = jax.tree.map(
      lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), case.args)
  t0 = time.perf_counter()
  with _CapturedStderr() as err:
    try:
      jax.jit(case.fn).trace(*args).lower().compile()
      exc = None
    except Exception as e:  # pylint: disable=broad-except  (reported, not hidden)
      exc = e
  seconds = time.perf_counter() - t0
  result = Result(case.name, case.kernel, target.name, exc is None, seconds,
                  roofline_us=roofline_us(case, target))
  if exc is not None:
    result.error = failure_cause(exc, err.text)
  elif target.platform == "cuda":
    for k, v in _gpu_report(err.text, case.kernel).items():
      setattr(result, k, v)
  return result


def _child_env(toolchain: str | None, vmem_limit_kib: int | None = None) -> dict:
  env = dict(os.environ)
  env[_CHILD_ENV] = "1"
  env["JAX_PLATFORMS"] = "cpu"
  # libtpu otherwise takes /tmp/libtpu_lockfile, one process per machine: two checks
  # (or two tests) at once would fail. Compile-only use opens no device.
  env["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"
  env["TF_CPP_MIN_LOG_LEVEL"] = "0"
  env["TF_CPP_VMODULE"] = "subprocess_compilation=2,xtile_compiler=2"
  if _SPILL_FLAG not in env.get("XLA_FLAGS", ""):
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + _SPILL_FLAG).strip()
  if vmem_limit_kib is not None:
    env["LIBTPU_INIT_ARGS"] = (env.get("LIBTPU_INIT_ARGS", "") +
                               f" --xla_tpu_scoped_vmem_limit_kib={vmem_limit_kib}").strip()
  if toolchain:
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.abspath(toolchain)] + [p for p in [env.get("PYTHONPATH")] if p])
  return env


def toolchain_missing() -> str | None:
  """Why this interpreter cannot run the check (None when it can)."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  missing = [m for m in ("jax_plugins.xla_cuda12", "libtpu", "nvidia.cuda_nvcc")
             if _find_spec(importlib.util, m) is None]
  if missing:
    return (f"the compile toolchain is not importable ({', '.join(missing)} missing): "
            f"pip install -e \".[compile]\", or --toolchain=DIR")
  return None


def _find_spec(util, name):
  try:
    return util.find_spec(name)
  except ModuleNotFoundError:
    return None


def run_child(case_names: Sequence[str], target_names: Sequence[str], *, all_cases: bool,
              toolchain: str | None, vmem_limit_kib: int | None = None,
              timeout_s: float | None = None) -> list[Result]:
  """Compiles the named cases for the named targets in a child process."""
  cmd = [sys.executable, "-m", "lowprec.numerics.kernels.compile_check", "--child",
         "--targets=" + ",".join(target_names)]
  cmd.append("--all" if all_cases else "--noall")
  with tempfile.TemporaryDirectory() as tmp:
    names = os.path.join(tmp, "cases.json")
    out = os.path.join(tmp, "results.json")
    with open(names, "w") as f:
      json.dump(list(case_names), f)
    cmd += [f"--case_file={names}", f"--json={out}"]
    proc = subprocess.run(cmd, env=_child_env(toolchain, vmem_limit_kib),
                          capture_output=True, text=True, timeout=timeout_s, check=False)
    if proc.returncode != 0 or not os.path.exists(out):
      raise RuntimeError(f"the compile check's child failed (rc={proc.returncode}):\n"
                         f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    with open(out) as f:
      return [Result(**r) for r in json.load(f)["results"]]


def _compile_in_child(case_names, target_names, all_cases: bool) -> list[Result]:
  from lowprec.numerics.kernels import cases as cases_lib  # pylint: disable=g-import-not-at-top
  table = cases_lib.all_cases() if all_cases else cases_lib.CASES
  results = []
  for target in (t for t in TARGETS if t.name in target_names):
    device = target_device(target)
    for name in case_names:
      results.append(compile_case(table[name], target, device))
  return results


def measure_vmem(results: list[Result], case_names, *, all_cases: bool,
                 toolchain: str | None) -> None:
  """Fills ``vmem_kib`` of the TPU results: the smallest limit of the ladder that
  compiles (one child process per limit, each compiling the cases still open)."""
  open_ = {(r.case, r.target): r for r in results if r.ok and r.target in ("v5e", "v6e")}
  for limit in VMEM_LADDER_KIB:
    if not open_:
      return
    targets = sorted({t for _, t in open_})
    names = [n for n in case_names if any((n, t) in open_ for t in targets)]
    for r in run_child(names, targets, all_cases=all_cases, toolchain=toolchain,
                       vmem_limit_kib=limit):
      if r.ok and (r.case, r.target) in open_:
        open_.pop((r.case, r.target)).vmem_kib = limit


def _cell(r: Result) -> str:
  if not r.ok:
    return f"FAILS: {r.error}"
  if r.registers is not None:
    smem = ("" if not r.smem_bytes else f", {r.smem_bytes} B smem" if r.smem_bytes < 1024
            else f", {r.smem_bytes // 1024} KiB smem")
    return f"{r.registers} regs, {r.spill_bytes} B spill{smem}"
  if r.vmem_kib is not None:  # between the largest limit that failed and this one
    i = VMEM_LADDER_KIB.index(r.vmem_kib)
    low = f"{VMEM_LADDER_KIB[i - 1] / 1024:g}-" if i else "<= "
    return f"VMEM {low}{r.vmem_kib / 1024:g} MiB"
  return "compiles"


def table(results: list[Result], case_names: Sequence[str]) -> str:
  """The markdown table kernel | H200 | B200 | v5e | v6e (and roofline estimates)."""
  by = {(r.case, r.target): r for r in results}
  names = [t.name for t in TARGETS]
  lines = ["| kernel | " + " | ".join(names) + " | roofline estimate, us (" +
           " / ".join(names) + ") |", "|---" * (len(names) + 2) + "|"]
  for case in case_names:
    cells = [_cell(by[(case, t)]) if (case, t) in by else "-" for t in names]
    est = " / ".join(f"{by[(case, t)].roofline_us:.0f}" if (case, t) in by else "-"
                     for t in names)
    lines.append(f"| {case} | " + " | ".join(cells) + f" | {est} |")
  return "\n".join(lines)


def define_flags() -> None:
  """Defines this script's flags; called only when it runs as a script, so that
  importing the module (a test, another script) defines no flag names."""
  flags.DEFINE_bool("all", False, "Compile the full product of cases (331).")
  flags.DEFINE_list("targets", [t.name for t in TARGETS], "Targets to compile for.")
  flags.DEFINE_string("cases", "", "Only the cases whose name contains this.")
  flags.DEFINE_bool("vmem", False, "Measure each TPU case's scoped VMEM (a ladder "
                    "of limits, one child process per limit).")
  flags.DEFINE_string("toolchain", None, "Directory holding the compile "
                      "toolchain (else it must be importable).")
  flags.DEFINE_string("json", None, "Write the results here.")
  flags.DEFINE_bool("child", False, "The check's own child process (internal).")
  flags.DEFINE_string("case_file", None, "The child's case names (internal).")


def main(argv: Sequence[str]) -> int:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  target_names = list(flags.FLAGS.targets)
  unknown = set(target_names) - {t.name for t in TARGETS}
  if unknown:
    raise app.UsageError(f"unknown targets {sorted(unknown)}; known: "
                         f"{[t.name for t in TARGETS]}")
  if flags.FLAGS.child:
    if os.environ.get(_CHILD_ENV) != "1":
      raise app.UsageError("--child is the check's own child process")
    with open(flags.FLAGS.case_file) as f:
      names = json.load(f)
    results = _compile_in_child(names, target_names, flags.FLAGS.all)
    with open(flags.FLAGS.json, "w") as f:
      json.dump({"results": [dataclasses.asdict(r) for r in results]}, f)
    return 0

  from lowprec.numerics.kernels import cases as cases_lib  # pylint: disable=g-import-not-at-top
  names = [n for n in (cases_lib.all_cases() if flags.FLAGS.all else cases_lib.CASES)
           if flags.FLAGS.cases in n]
  toolchain = flags.FLAGS.toolchain
  if toolchain is None and (why := toolchain_missing()):
    print(why, file=sys.stderr)
    return 2
  import jax  # pylint: disable=g-import-not-at-top
  t0 = time.perf_counter()
  results = run_child(names, target_names, all_cases=flags.FLAGS.all, toolchain=toolchain)
  if flags.FLAGS.vmem:
    measure_vmem(results, names, all_cases=flags.FLAGS.all, toolchain=toolchain)
  elapsed = time.perf_counter() - t0
  failed = [r for r in results if not r.ok]
  print(f"jax {jax.__version__}; deviceless compile for {', '.join(target_names)}\n")
  print(table(results, names))
  print(f"\n{len(results)} compiles, {len(failed)} failed, {elapsed:.0f} s")
  for t in TARGETS:
    print(f"roofline {t.name}: {t.source}")
  if flags.FLAGS.json:
    with open(flags.FLAGS.json, "w") as f:
      json.dump({"jax": jax.__version__, "targets": [dataclasses.asdict(t) for t in TARGETS],
                 "seconds": elapsed,
                 "results": [dataclasses.asdict(r) for r in results]}, f, indent=1)
  return 1 if failed else 0


if __name__ == "__main__":
  define_flags()
  app.run(lambda argv: sys.exit(main(argv)))
