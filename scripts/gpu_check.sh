#!/usr/bin/env bash
# The GPU check, one command on a GPU machine (docs/testing.md): installs the wheels of scripts/gpu_wheels.txt from
# .gpu-wheels/ (fetch them first, where pip reaches PyPI: bash scripts/fetch_gpu_wheels.sh), runs the CUDA tier
# (tests/test_device.py --device cuda) and the GPU benchmark (python -m benchmarks.heads --device cuda), and writes
# into OUT as it goes, so a run cut off keeps what it measured:
#   OUT/gpu_check.log  every step and its exit status     OUT/machine.json  GPU, driver, torch and package versions
#   OUT/test-gpu.log   the CUDA tier's pytest output       OUT/bench.log     the benchmark's progress
#   OUT/bench/results.json, OUT/bench/table.md             the benchmark (rewritten after every setting)
# Exits non-zero when anything failed or did not run: never a silent skip.
#   bash scripts/gpu_check.sh [OUT [TEST_SECONDS BENCH_SECONDS [BENCH_OPTION...]]]   (OUT: records/gpu_check/DATE-TIME,
#   where the committed GPU runs are, unless given)
# By default (within 5 minutes with the install): the CUDA tier, the Triton kernels' checks in bf16 / fp16 / fp32
# included (60 s; 26 s on an H100 before the kernels), then the benchmark at the issue's two bf16 shapes, d = 2048,
# V = 50k and SmolLM2-135M's d = 576, V = 49,152 (every head by default and with the kernels, the fused peers, the
# roofline), and the whole-model step of a SmolLM2-135M-shaped Llama (210 s). Options after the two limits replace
# the benchmark's defaults; the full grid (d = 1024 / 2048, V = 32k / 50k, bf16 and fp32, the autograd rows too) is
# a second, optional call:  bash scripts/gpu_check.sh OUT-grid 0 540 --dtype bfloat16 float32 --no-model
# (TEST_SECONDS 0 skips the tier.)
set -uo pipefail
OUT=${1:-records/gpu_check/$(date -u +%Y-%m-%d-%H%M)}
TEST_SECONDS=${2:-60}
BENCH_SECONDS=${3:-210}
BENCH_OPTIONS=("${@:4}")
[ ${#BENCH_OPTIONS[@]} -gt 0 ] || BENCH_OPTIONS=(--shapes 2048x50000 576x49152 --dtype bfloat16 --no-reference)
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
failed=()
log() { echo "[gpu_check $(date +%T)] $*" | tee -a "$OUT/gpu_check.log"; }
step() {  # step NAME LOG COMMAND...: run, log the exit status, remember a failure
    local name=$1 out=$2; shift 2
    log "$name: $*"
    "$@" 2>&1 | tee "$out"
    local rc=${PIPESTATUS[0]}
    [ "$rc" = 0 ] && log "$name: ok" || { log "$name: FAILED (exit $rc$([ "$rc" = 124 ] && echo ', timed out'))"; failed+=("$name"); }
}

# the wheels first: machine.json reports the versions that will run
if ls .gpu-wheels/*.whl > /dev/null 2>&1; then
    step wheels "$OUT/wheels.log" $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/gpu-check-site .gpu-wheels/*.whl
    export PYTHONPATH=/tmp/gpu-check-site${PYTHONPATH:+:$PYTHONPATH}
else
    log "wheels: FAILED: no .gpu-wheels/*.whl here (bash scripts/fetch_gpu_wheels.sh, then carry .gpu-wheels)"
    failed+=(wheels)
fi
$PY - > "$OUT/machine.json" <<'PYEOF'
import importlib.metadata as md, json, platform, subprocess, torch
def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None
info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "packages": {n: version(n) for n in ["transformers", "accelerate", "peft", "trl", "datasets", "liger-kernel",
                                             "cut-cross-entropy", "triton", "pytest"]}}
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    info.update(gpu=p.name, memory_gib=round(p.total_memory / 2**30, 1), multiprocessors=p.multi_processor_count,
                capability=f"{p.major}.{p.minor}")
    try:
        info["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                        capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception as e:  # noqa: BLE001
        info["driver"] = f"nvidia-smi: {e}"
print(json.dumps(info, indent=1))
PYEOF
cat "$OUT/machine.json" | tee -a "$OUT/gpu_check.log"
if ! $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    log "FAILED: CUDA is not available here (machine.json): nothing ran"
    exit 1
fi
for module in trl datasets liger_kernel cut_cross_entropy; do
    $PY -c "import $module" > /dev/null 2>&1 || { log "import $module: FAILED"; failed+=("import-$module"); }
done

if [ "$TEST_SECONDS" != 0 ]; then
    step test-gpu "$OUT/test-gpu.log" timeout "$TEST_SECONDS" $PY -m pytest tests/test_device.py --device cuda \
        -p no:xdist -q -ra --durations=10
fi
step bench "$OUT/bench.log" timeout "$BENCH_SECONDS" $PY -m benchmarks.heads --device cuda --out "$OUT/bench" \
    "${BENCH_OPTIONS[@]}"

if [ ${#failed[@]} -gt 0 ]; then
    log "FAILED: ${failed[*]}"
    exit 1
fi
log "all passed"
