"""Models: transformers forwards (log-probs, critic), the tiny local model and its warm start,
its tokenizers, LoRA, model directories."""

from rllab._compat import former_names

__getattr__ = former_names(__name__)  # names of the former module rllab.models, with a warning, until rllab 1.0
