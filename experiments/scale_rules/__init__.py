"""Block-scale rules compared as post-training quantization (issue 54)."""
