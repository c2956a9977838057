"""Hugging Face checkpoint reading: config, resolution, weights, tokenizer and chat template."""
