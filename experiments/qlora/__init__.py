"""QLoRA in miniature (issue 22): NF4 + LoRA vs bf16 + LoRA vs full fine-tuning."""
