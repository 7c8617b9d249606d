#!/bin/sh
# The benchmark-only venv for bench_resize's torchft column (git-ignored): exact pins, the CPU torch.
# torch==2.13.0 resolves to the local CPU build here; never install an unpinned torch (it pulls CUDA).
set -eu
cd "$(dirname "$0")/../.."
python3 -m venv benchmarks/.venv-torchft
benchmarks/.venv-torchft/bin/pip install torch==2.13.0 torchft==0.2.0 numpy
benchmarks/.venv-torchft/bin/python -c "import torch, torchft; print('torch', torch.__version__, 'torchft ok')"
