#!/usr/bin/env bash
# Install SGLang into the active virtual environment for `kvstate fuzz --target sglang`, without
# its CUDA dependencies: the target drives sglang.srt.mem_cache (the DeepSeek-V4 pools, the
# unified radix tree) on device="cpu" only.
#   SGLANG_VERSION=0.5.23 tools/install_sglang.sh      (CI pins 0.5.23)
# torch must already be installed (pinned: pip install torch==2.13.0, the local CPU wheel); it is
# named again below so that no dependency swaps a CUDA build in.
set -euo pipefail
cd "$(dirname "$0")/.."
SGLANG_VERSION="${SGLANG_VERSION:-0.5.23}"
pip install -q --no-deps "sglang==${SGLANG_VERSION}"
# sglang.srt.utils.common imports triton at module level (it imports without a GPU).
pip install -q --no-deps triton==3.9.0
# The pure-Python imports that `import sglang.srt.mem_cache...` reaches (found by importing).
pip install -q torch==2.13.0 \
  numpy orjson psutil pybase64 requests packaging pillow starlette msgspec pydantic pyzmq tqdm \
  ipython aiohttp apache-tvm-ffi transformers dill sentencepiece compressed-tensors gguf openai \
  partial-json-parser datasets
# From outside the repository: its kernels/ folder would shadow the Hugging Face `kernels` name.
(cd / && python -c "import kvstate.targets.sglang.imports as i; i.load(); print('SGLang', i.version(), 'importable')")
