#!/usr/bin/env bash
# Install vLLM into the active virtual environment for `kvstate fuzz --target vllm`, without its
# CUDA dependencies: the target drives vllm.v1.core.kv_cache_manager on a CPU only.
#   VLLM_VERSION=0.33.0 tools/install_vllm.sh      (CI pins 0.33.0; the target drives 0.20+)
# torch must already be installed (pinned: pip install torch==2.13.0, the local CPU wheel).
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM_VERSION="${VLLM_VERSION:-0.33.0}"
pip install -q --no-deps "vllm==${VLLM_VERSION}"
# vLLM's pure-Python imports: pyproject's `vllm` extra, read here so that kvstate itself is not
# reinstalled (which would rebuild its compiled modules).
python - <<'PY' | xargs pip install -q
import tomllib
print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["vllm"]))
PY
pip install -q --no-deps xgrammar
# From outside the repository: its kernels/ folder would shadow the Hugging Face `kernels` name.
(cd / && python -c "import vllm.v1.core.kv_cache_manager; print('vLLM', __import__('vllm').__version__, 'importable')")
