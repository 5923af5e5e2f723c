"""models: Flax modules, and quantization of any Flax model by rules.

    models.quantize_model(model, [models.Rule("head", "bf16"), models.Rule(".*", "mxfp8")])
"""

if __name__ != "lowprec.models":  # one module object per module (docs/layout.md)
  raise ImportError(f"this package is lowprec.models; import it as `from lowprec import "
                    f"models` (it was imported as {__name__!r}, which would make a second "
                    f"copy of every module and class)")

from lowprec.models.quantization import Rule, quantize_model

__all__ = ["Rule", "quantize_model"]
