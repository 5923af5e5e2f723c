"""The trainers several papers share, built on the harness's run and train loop.

``lm_trainer`` is the Shakespeare decoder-LM trainer of the LM papers (lm, alto,
optimizer_state, qlora and the later ones) and ``moe_lm`` its mixture-of-experts config;
``recipe_flag`` turns a ``--recipe`` into the rule list ``models.quantize_model`` applies
to the experiments' models; ``weight_inspection`` writes weight histograms and each
kernel's quantization error; ``rl/`` is the GRPO loop of the RL papers.
"""
