#!/usr/bin/env bash
# Download the wheels of scripts/gpu_wheels.txt for a Python 3.12 x86_64 Linux GPU machine into .gpu-wheels/
# (ignored by git; carried to the machine with the working tree). Run where pip reaches PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .gpu-wheels
grep -v '^#' scripts/gpu_wheels.txt | grep -v '^$' | xargs python3 -m pip download --quiet --no-deps \
    --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any -d .gpu-wheels
ls -l .gpu-wheels
