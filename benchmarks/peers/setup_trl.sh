#!/usr/bin/env bash
# A separate virtual environment with TRL, for benchmarks/peers/trl_grpo.py.
#
#   bash benchmarks/peers/setup_trl.sh            # creates benchmarks/peers/.venv-trl
#   VENV=/some/dir bash benchmarks/peers/setup_trl.sh
#
# torch is pinned and installed first, so pip takes the CPU wheel (never a multi-GB CUDA build).
# transformers is pinned to the version of the python that runs rllab (when it has one), so
# both frameworks drive the same model code and the comparison measures the trainers alone.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${VENV:-$here/.venv-trl}"
python="${PYTHON:-python3}"
torch_version="2.13.0"
trl_version="1.16.0"

transformers_pin=""
if tv="$("$python" -c 'import transformers; print(transformers.__version__)' 2>/dev/null)"; then
    transformers_pin="transformers==$tv"
fi

if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet "torch==$torch_version"
"$venv/bin/python" -m pip install --quiet "trl==$trl_version" $transformers_pin
"$venv/bin/python" - <<'PY'
import torch, transformers, trl
print(f"TRL venv ready: torch {torch.__version__}, transformers {transformers.__version__}, trl {trl.__version__}")
PY
echo "$venv/bin/python"
