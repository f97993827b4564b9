#!/usr/bin/env bash
# Run 23 (issue 36): the real DeepEP 2.5.0 recorded by fixtures/record.py (the V2 cases, the bad calls, the V2
# sections and v2_contract), its API surface, and v2_contract on 2.1.0 (the other side of the bump).
# Device call:  bash docs/real-runs/2026-12-06/record.sh   (carry .deepep-kit; writes $OUT)
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
T=${T:-560}
start=$(date +%s)
left() { echo $(( T - ($(date +%s) - start) )); }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
source .deepep-kit/activate.sh || exit 1
echo "== 2.1.0: v2_contract ($(left) s left)"
timeout 150 python3 fixtures/record.py --out rec21 --nproc 2 --rank-setup shared --sections meta,v2_contract \
  --section-timeout 100 2>&1 | tail -n 30
DEEPEP_KIT_VERSION=2.5.0 source .deepep-kit/activate.sh || exit 1
echo "== 2.5.0: API surface ($(left) s left)"
python3 - > rec25-api-surface.json <<'PY'
import json
from conformance.core.api_surface import surface_of
print(json.dumps(surface_of("deep_ep"), indent=1))
PY
python3 -c "import json; d=json.load(open('rec25-api-surface.json')); print(d['version'], sorted(d['classes']), d['probe'])"
echo "== 2.5.0: recording ($(left) s left)"
timeout $(( $(left) - 25 )) python3 fixtures/record.py --out rec25 --nproc 2 --rank-setup shared --section-timeout 120 \
  --sections meta,v2_contract,cases,errors,v2_dispatch_options,v2_single_reduction,v2_fp8_dispatch,integrator_calls,cuda_graphs,capture_build \
  2>&1 | tail -n 60
echo "== packing ($(left) s left)"
tar czf "$OUT/rec.tgz" rec21 rec25 rec25-api-surface.json
ls -la "$OUT"
echo "took $(( $(date +%s) - start )) s"
