#!/usr/bin/env bash
# Real-library runs the one-GPU machine allows with two ranks sharing its GPU (docs/real-runs/README.md): run
# from the checkout AFTER  `source .deepep-kit/activate.sh`.  Writes into ${OUT:-/tmp/out}.
set -u
OUT=${OUT:-/tmp/out}
SEED=${SEED:-12}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
step() { echo; echo "=== $* ($(date -u +%T))"; }

step "P12's refusal rows on the real V1 (every applicable row, both ranks on one GPU)"
timeout 240 python3 docs/real-runs/refusal_sweep.py --backends real-v1 --device cuda --rank-setup shared \
    --out "$OUT/sweep-real-v1.json" 2>&1 | tail -15; echo "exit ${PIPESTATUS[0]}"

step "the suite: real V1 against the emulated V1, two ranks on one GPU"
timeout 400 python3 -m pytest --backends real-v1,emulated-v1 --rank-setup shared --device cuda \
    --max-examples "${EXAMPLES:-50}" --conformance-seed "$SEED" -q -p no:cacheprovider \
    --report-dir="$OUT/shared-v1" 2>&1 | tail -25; echo "exit ${PIPESTATUS[0]}"

step "experiment: the real V2 with two ranks on one GPU, NCCL_MULTI_RANK_GPU_ENABLE=1"
NCCL_MULTI_RANK_GPU_ENABLE=1 timeout 300 python3 -m pytest --backends real-v2,emulated-v2 --rank-setup shared \
    --device cuda --max-examples 10 --conformance-seed "$SEED" --example-timeout 60 -v -p no:cacheprovider \
    --report-dir="$OUT/shared-v2" 2>&1 | tail -25; echo "exit ${PIPESTATUS[0]}"
