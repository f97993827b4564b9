#!/usr/bin/env bash
# The checks the one-GPU machine allows (docs/real-runs/README.md): run from the checkout, AFTER
#     source .deepep-kit/activate.sh
# (sourced, so that LD_PRELOAD and the other settings reach pytest and the ranks). Writes into ${OUT:-/tmp/out}.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
step() { echo; echo "=== $*"; }

step "deep_ep imports"
python3 -c "import deep_ep, torch; print('deep_ep', deep_ep.__version__, 'torch', torch.__version__, 'GPUs', torch.cuda.device_count())"

step "--backends real on one GPU (expect one line, exit 4)"
python3 -m pytest --backends real -q -p no:cacheprovider --report-dir="$OUT/real-2ranks"; echo "exit $?"
python3 -m pytest --backends real --ranks-per-node 1 -q -p no:cacheprovider --report-dir="$OUT/real-1rank"; echo "exit $?"

step "API surface of the real deep_ep against the snapshot"
python3 - > "$OUT/api-surface-real.json" <<'EOF'
import json
from conformance.core.api_surface import SNAPSHOT, changes_as_json, diff_surface, load_snapshot, surface_of
surface = surface_of("deep_ep")
print(json.dumps({"surface": surface, "changes": changes_as_json(diff_surface(load_snapshot(SNAPSHOT), surface))},
                 indent=1))
EOF
python3 -c "import json; d=json.load(open('$OUT/api-surface-real.json')); print(len(d['changes']), 'changes:'); [print(' ', c) for c in d['changes']]"

step "main job here (pytest -n 4 --nodes 2): the options give the emulation on the CPU (1 GPU for 4 ranks)"
timeout 400 python3 -m pytest -n 4 --nodes 2 -q -p no:cacheprovider --report-dir="$OUT/main" 2>&1 | tail -22

step "a 1-rank CUDA world on the emulation (NCCL, the GPU)"
timeout 300 python3 -m pytest --device cuda --ranks-per-node 1 --backends emulated --max-examples 10 -q \
    -p no:cacheprovider --report-dir="$OUT/cuda-1rank" 2>&1 | tail -18

step "experiment: two ranks on one GPU, real V1 intranode (CUDA IPC only, gloo group)"
timeout 240 python3 docs/real-runs/two_ranks_one_gpu.py 2>&1 | tee "$OUT/two_ranks_one_gpu.log" | cut -c1-600
echo "exit ${PIPESTATUS[0]}"
