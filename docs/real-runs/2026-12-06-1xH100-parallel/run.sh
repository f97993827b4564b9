#!/usr/bin/env bash
# Issue 37's warm figure with several worlds side by side on the one GPU (one H100 or H200, two ranks per world
# sharing it, the kit's DeepEP 2.1.0): `--rank-setup shared -n K`, each xdist worker its own 2-rank world on GPU 0,
# the JIT warm-up made once by the first worker.  From the checkout on the accelerator machine, carrying .deepep-kit:
#
#   source .deepep-kit/activate.sh || exit 1; PARTS=smoke bash docs/real-runs/2026-12-06-1xH100-parallel/run.sh
#   source .deepep-kit/activate.sh || exit 1; PARTS="cold warm" bash docs/real-runs/2026-12-06-1xH100-parallel/run.sh
#
# Parts (each leaves $OUT/<part>.tgz: the device tool brings back 8 files per call, 2 folders deep):
#   smoke  P1, P12, P15, P23 on real-v1,real-v2,emulated-v1,emulated-v2 at 3 examples, -n 2, cold cache /tmp/jit-smoke:
#          V1's intranode IPC, V2's NCCL communicator, the low-latency NVSHMEM buffer, a sticky fault's world restart
#          and the one warm-up, with two worlds on the GPU (limit T_SMOKE, default 230 s)
#   cold   the whole catalog, 4 backends, 25 examples, -n $K, through python -m benchmarks --device cuda --only catalog
#          --cold --jit-cache /tmp/jit-21 (issue 37's cold figure; limit T_COLD, default 330 s)
#   warm   the same on the kernel cache cold left, without --cold (issue 37's warm figure, one invocation; limit
#          T_WARM, default 230 s, or less if the call's 600 s would be passed: CALL_S, default 585)
#   cold25 the whole catalog on DeepEP 2.5.0 (the kit's, switched to after a 2.1.0 part: run 32), 4 backends, 25
#          examples, -n $K, cold cache /tmp/jit-25, gated with --baseline the 2.1.0 baseline part cold wrote (cold writes
#          it when a cold25 part follows): both versions and the bump explained in one call (limit T_COLD25, default
#          the call's time left)
# Each tarball: conformance.json, conformance.md, jit.log, log.txt, benchmark.json (cold, warm) and the warm-up runs'
# logs; $OUT/log.txt is the call's output, $OUT/gpu.txt nvidia-smi's card, $OUT/smi.csv the GPU's memory and use
# every 5 s.
set -uo pipefail
cd "$(dirname "$0")/../../.."
export NCCL_MULTI_RANK_GPU_ENABLE=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
K=${K:-4}
CALL_S=${CALL_S:-585}
started=$(date +%s)
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
echo "cores: $(nproc); K=$K"
nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu --format=csv,noheader -l 5 > "$OUT/smi.csv" 2>&1 &
smi=$!
trap 'kill $smi 2>/dev/null' EXIT
python3 -c "import deep_ep, sys; v = deep_ep.__version__; print('deep_ep', v); sys.exit(v != '2.1.0')" || exit 1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
BACKENDS=real-v1,real-v2,emulated-v1,emulated-v2

pack() {  # part, report dir: the part's files into $OUT/<part>.tgz
  local part=$1 dir=$2
  (cd "$dir" && tar czf "$OUT/$part.tgz" --ignore-failed-read conformance.json conformance.md jit.log log.txt \
    benchmark.json bump.md baseline-2.1.0.json warm-up/*/log.txt 2>/dev/null)
  echo "part $part packed: $(tar tzf "$OUT/$part.tgz" | wc -l) files ($(( $(date +%s) - started )) s into the call)"
}

for part in ${PARTS:?PARTS: the parts to run}; do
  case $part in
    smoke)
      export EP_JIT_CACHE_DIR=/tmp/jit-smoke; dir=/tmp/reports-smoke; rm -rf "$dir"; mkdir -p "$dir"
      t0=$(date +%s)
      timeout -s TERM -k 30 "${T_SMOKE:-230}" python3 -m pytest -p no:cacheprovider --rank-setup shared --device cuda \
        --nodes 1 -n 2 --dist worksteal --backends $BACKENDS --max-examples 3 --conformance-seed 3700 \
        --allow-partial --report-dir "$dir" conformance/properties/test_p01_payloads.py \
        conformance/properties/test_p12_bad_input.py conformance/properties/test_p15_ll_dispatch.py \
        conformance/properties/test_p23_ll_shrink.py 2>&1 | tee "$dir/log.txt"
      echo "part smoke: wall $(( $(date +%s) - t0 )) s (exit ${PIPESTATUS[0]})" | tee -a "$dir/log.txt"
      pack smoke "$dir" ;;
    cold|warm)
      export EP_JIT_CACHE_DIR=/tmp/jit-21; dir=/tmp/reports-$part; rm -rf "$dir"; mkdir -p "$dir"
      extra=
      case " $PARTS " in *" cold25 "*) [ "$part" = cold ] && extra="--write-baseline $dir/baseline-2.1.0.json";; esac
      if [ "$part" = cold ]; then cold=--cold; seed=3701; limit=${T_COLD:-330}
      else cold=; seed=3702; left=$(( CALL_S - ($(date +%s) - started) - 25 )); limit=${T_WARM:-230}
           [ "$left" -lt "$limit" ] && limit=$left; fi
      echo "part $part: limit $limit s ($(( $(date +%s) - started )) s into the call)"
      python3 -m benchmarks --device cuda --only catalog $cold --jit-cache "$EP_JIT_CACHE_DIR" \
        --catalog-report "$dir" --catalog-limit "$limit" --out "$dir/benchmark.json" \
        --catalog-args "--rank-setup shared --device cuda --nodes 1 -n $K --dist worksteal --backends $BACKENDS --max-examples 25 --conformance-seed $seed $extra" \
        2>&1 | tee "$dir/log.txt"
      pack "$part" "$dir" ;;
    cold25)
      DEEPEP_KIT_VERSION=2.5.0 source .deepep-kit/activate.sh || exit 1
      python3 -c "import deep_ep, sys; v = deep_ep.__version__; print('deep_ep', v); sys.exit(v != '2.5.0')" || exit 1
      export EP_JIT_CACHE_DIR=/tmp/jit-25; dir=/tmp/reports-cold25; rm -rf "$dir"; mkdir -p "$dir"
      base=/tmp/reports-cold/baseline-2.1.0.json
      [ -f "$base" ] && gate="--baseline $base" || { gate=; echo "part cold25: no 2.1.0 baseline (part cold first)"; }
      left=$(( CALL_S - ($(date +%s) - started) - 25 )); limit=${T_COLD25:-$left}; [ "$left" -lt "$limit" ] && limit=$left
      echo "part cold25: limit $limit s ($(( $(date +%s) - started )) s into the call)"
      python3 -m benchmarks --device cuda --only catalog --cold --jit-cache "$EP_JIT_CACHE_DIR" \
        --catalog-report "$dir" --catalog-limit "$limit" --out "$dir/benchmark.json" \
        --catalog-args "--rank-setup shared --device cuda --nodes 1 -n $K --dist worksteal --backends $BACKENDS --max-examples 25 --conformance-seed 3703 $gate" \
        2>&1 | tee "$dir/log.txt"
      pack cold25 "$dir" ;;
    *) echo "unknown part $part" >&2; exit 2 ;;
  esac
done
echo "the call: $(( $(date +%s) - started )) s"
