"""Models: transformers forwards (log-probs, critic), the tiny local model and its warm start,
its tokenizers, LoRA, model directories."""
