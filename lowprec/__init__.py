"""lowprec: low-precision numerics for JAX, under one name that cannot collide.

    from lowprec import numerics                        # formats, casts, MX / NVFP4, qdot
    from lowprec.numerics import qdot, recipes, qconv
    from lowprec.models import quantize_model, Rule     # Flax models (needs flax)
    from lowprec.models.quantization import projections_only, recording

The library's packages are ``lowprec.numerics`` (arrays in, arrays out: jax, optax,
ml_dtypes, numpy) and ``lowprec.models`` (Flax modules and ``quantize_model``). They
live in the repository's top-level ``numerics/`` and ``models/`` folders; an install
puts them under ``lowprec/`` (no top-level ``numerics`` or ``models`` package), so a
project with packages of those names keeps them. The experiment harness
(``experiments``, ``launch``) runs from a clone of the repository and is not installed.
"""

# In a source checkout, lowprec/numerics and lowprec/models are links to the
# repository's top-level folders, so lowprec.numerics and lowprec.models (and nothing
# else of the checkout) import under this name, and static tools can follow them.
