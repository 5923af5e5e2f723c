"""The library inside someone else's project: their own ``models`` package, our ``lowprec``.

Before: the install put top-level ``numerics``, ``models``, ``experiments`` and
``launch`` packages on the path, so in a project with its own ``models/``, ``from models
import quantize_model`` failed (and an editable install grafted our files onto theirs).
Here a project is built in a temporary directory with its own ``models`` package (a
small ViT from stock linen layers, with a patch conv and an ``x @ w``), and only
``lowprec`` is on its path (a link to this checkout's, not the checkout itself); it
quantizes its model through the documented import path and trains it.
"""

import json
import os
import subprocess
import sys
import textwrap

from experiments.common.harness.repo_paths import REPO_DIR

_USER_MODELS = textwrap.dedent("""
    from flax import linen as nn
    import jax.numpy as jnp

    class ViT(nn.Module):  # the project's own model, written without lowprec in mind
      @nn.compact
      def __call__(self, img):
        x = nn.Conv(32, (4, 4), strides=(4, 4), name="patch")(img)
        x = x.reshape(x.shape[0], -1, 32)
        x = x + nn.MultiHeadDotProductAttention(2, name="attn")(x, x)
        w = self.param("w", nn.initializers.lecun_normal(), (32, 32))
        x = x + nn.gelu(x @ w)
        return nn.Dense(10, name="head")(x.mean(axis=1))
""")

_TRAIN = textwrap.dedent("""
    import json, sys
    import jax, jax.numpy as jnp, optax
    import models                                    # the project's own package
    from lowprec.models import quantize_model        # ours, under a name that cannot clash
    from lowprec.models.quantization import projections_only, recording
    from lowprec import numerics

    img = jax.random.normal(jax.random.key(0), (4, 16, 16, 3))
    labels = jnp.arange(4) % 10
    model = quantize_model(models.ViT(), projections_only("mxfp8"))
    params = model.init(jax.random.key(1), img)
    opt = optax.adam(1e-3)
    state = opt.init(params)

    @jax.jit
    def step(params, state):
      def loss_fn(p):
        logits = model.apply(p, img)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
      loss, grads = jax.value_and_grad(loss_fn)(params)
      updates, state = opt.update(grads, state, params)
      return optax.apply_updates(params, updates), state, loss

    with recording() as ops:
      jax.eval_shape(model.apply, params, img)
    losses = []
    for _ in range(3):
      params, state, loss = step(params, state)
      losses.append(float(loss))
    print(json.dumps({
        "models_file": models.__file__, "losses": losses,
        "ops": [[o.path, o.kind, o.rule.recipe_name if o.rule else None] for o in ops],
        "e4m3_max": numerics.formats.get("e4m3").max,
        "top_level": sorted(m for m in ("numerics", "experiments", "launch")
                            if m in sys.modules)}))
""")


def _project(tmp_path):
  site = tmp_path / "site"
  site.mkdir()
  (site / "lowprec").symlink_to(os.path.join(REPO_DIR, "lowprec"))
  project = tmp_path / "userproj"
  (project / "models").mkdir(parents=True)
  (project / "models" / "__init__.py").write_text(_USER_MODELS)
  (project / "train.py").write_text(_TRAIN)
  env = {**os.environ, "PYTHONPATH": str(site)}
  return project, env


def test_a_project_with_its_own_models_package_quantizes_and_trains_through_lowprec(
    tmp_path):
  project, env = _project(tmp_path)
  out = subprocess.run([sys.executable, "train.py"], cwd=project, env=env,
                       capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  result = json.loads(out.stdout.strip().splitlines()[-1])
  assert result["models_file"] == str(project / "models" / "__init__.py")
  assert result["top_level"] == []  # nothing of ours under a name that could clash
  assert result["e4m3_max"] == 448.0
  kinds = {(path, kind): recipe for path, kind, recipe in result["ops"]}
  assert kinds[("patch", "conv")] == "mxfp8" and kinds[("", "matmul")] == "mxfp8"
  assert kinds[("head", "dot_general")] == "bf16" and kinds[("attn", "attention")] == "bf16"
  assert kinds[("attn/query", "dot_general")] == "mxfp8"
  assert all(l == l and l < 10 for l in result["losses"])  # finite, trained


def test_importing_the_numerics_library_pulls_no_harness_dependency(tmp_path):
  """``lowprec.numerics`` needs jax, optax, ml_dtypes and numpy only: no flax, and none
  of the harness's TensorBoard, matplotlib or orbax."""
  _, env = _project(tmp_path)
  code = ("import sys; from lowprec import numerics; import lowprec.numerics.qdot; "
          "print(sorted(m for m in ('flax', 'matplotlib', 'tensorboard', 'orbax', "
          "'models', 'experiments') if m in sys.modules))")
  out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.strip() == "[]"
