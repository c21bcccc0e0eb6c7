"""Models: transformers forwards (log-probs, critic), the tiny local model and its warm start,
its tokenizers, LoRA, model directories."""

from rllab._compat import FORMER

__getattr__ = FORMER.package_getattr(__name__)  # names of the former module rllab.models, with a warning, until rllab 1.0
