"""models: Flax modules, and quantization of any Flax model by rules.

    models.quantize_model(model, [models.Rule("head", "bf16"), models.Rule(".*", "mxfp8")])
"""

from lowprec.models.quantization import Rule, quantize_model

__all__ = ["Rule", "quantize_model"]
