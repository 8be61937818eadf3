"""Weights and configuration: Hugging Face directories, GGUF files, the embedded model."""
