"""rllab_backends — rollout backends: where completions come from (``register_rollout_backends``).

* :mod:`rllab_backends.hf` — ``hf`` (alias ``transformers``): in-process sampling with a
  transformers causal LM and a KV cache, the default on a machine without a GPU server;
* :mod:`rllab_backends.sglang` — ``sglang``: SGLang servers over their native HTTP API, with
  weight sync after each step, retries and fault handling.
"""

import rllab

from . import hf, sglang


@rllab.hookimpl
def register_rollout_backends(register):
    register("hf", hf.hf, config=hf.HFBackendConfig, aliases=("transformers",))
    register("sglang", sglang.sglang, config=sglang.SGLangBackendConfig)
