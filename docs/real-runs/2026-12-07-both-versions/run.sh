#!/usr/bin/env bash
# Run 33: both versions of the real DeepEP in ONE device call, each catalog cold, at fewer examples than run 32 (which
# ran out of its 600 s call at 25 examples: two cold JIT warm-ups of about 125 s each).  One H100 or H200, two ranks
# per world sharing it, `--rank-setup shared -n K`, each xdist worker its own 2-rank world on GPU 0: first the whole
# catalog on the kit's DeepEP 2.1.0 (part cold, writing the 2.1.0 baseline), then on the kit's DeepEP 2.5.0 (part
# cold25, gated with --baseline against that baseline: the bump explained).  A copy of
# ../2026-12-06-1xH100-parallel/run.sh with EXAMPLES (default 10) for --max-examples in parts cold and cold25 (25 there).
# From the checkout on the accelerator machine, carrying .deepep-kit:
#
#   source .deepep-kit/activate.sh || exit 1; PARTS="cold cold25" K=4 EXAMPLES=10 T_COLD=300 CALL_S=585 bash docs/real-runs/2026-12-07-both-versions/run.sh
#
# (Run 33's call carried the kit with its 2.1.0 wheel repacked as deep_ep-2.1.0-whl-contents.tar.xz and without the
# 2.5.0 source tarball, to keep the call under 64 MiB, and rebuilt the wheel before sourcing the kit: see the README.)
#
# Parts (each leaves $OUT/<part>.tgz: the device tool brings back 8 files per call, 2 folders deep):
#   smoke  P1, P12, P15, P23 on real-v1,real-v2,emulated-v1,emulated-v2 at 3 examples, -n 2, cold cache /tmp/jit-smoke
#          (limit T_SMOKE, default 230 s)
#   cold   the whole catalog on 2.1.0, 4 backends, $EXAMPLES examples, -n $K, through python -m benchmarks --device cuda
#          --only catalog --cold --jit-cache /tmp/jit-21 (limit T_COLD, default 330 s; run 33: 300 s); writes the 2.1.0
#          baseline when a cold25 part follows
#   warm   the same on the kernel cache cold left, without --cold (limit T_WARM, default 230 s, or less if the call's
#          time would be passed: CALL_S, default 585)
#   cold25 the whole catalog on DeepEP 2.5.0 (the kit's, switched to after the 2.1.0 part), 4 backends, $EXAMPLES
#          examples, -n $K, cold cache /tmp/jit-25, gated with --baseline the 2.1.0 baseline part cold wrote (limit
#          T_COLD25, default the call's time left)
# The paths after --write-baseline and --baseline are written with '=': written after a space, an existing path
# outside the checkout (call 1's /tmp/reports-cold/baseline-2.1.0.json) made pytest take its folder for the rootdir
# before the suite's options were known, so the checkout's conftest (which loads the plugin when the suite is not
# installed) was not loaded and part cold25 stopped at once with "unrecognized arguments".  BASELINE (default that
# path) names another 2.1.0 baseline for a part cold25 run alone (meant for a second call that was not made:
# no machine started; it would have gated 2.5.0 against the baseline call 1's part cold wrote).
# Each tarball: conformance.json, conformance.md, jit.log, log.txt, benchmark.json, bump.md and baseline-2.1.0.json
# where written, and the warm-up runs' logs; $OUT/log.txt is the call's whole output (the script tees it there),
# $OUT/gpu.txt nvidia-smi's card, $OUT/smi.csv the GPU's memory and use every 5 s.
set -uo pipefail
cd "$(dirname "$0")/../../.."
export NCCL_MULTI_RANK_GPU_ENABLE=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
K=${K:-4}
EXAMPLES=${EXAMPLES:-10}
CALL_S=${CALL_S:-585}
started=$(date +%s)
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1  # the call's whole output, also when the call is stopped
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
echo "cores: $(nproc); K=$K; EXAMPLES=$EXAMPLES"
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
      case " $PARTS " in *" cold25 "*) [ "$part" = cold ] && extra="--write-baseline=$dir/baseline-2.1.0.json";; esac
      if [ "$part" = cold ]; then cold=--cold; seed=3701; limit=${T_COLD:-330}
      else cold=; seed=3702; left=$(( CALL_S - ($(date +%s) - started) - 25 )); limit=${T_WARM:-230}
           [ "$left" -lt "$limit" ] && limit=$left; fi
      echo "part $part: limit $limit s ($(( $(date +%s) - started )) s into the call)"
      python3 -m benchmarks --device cuda --only catalog $cold --jit-cache "$EP_JIT_CACHE_DIR" \
        --catalog-report "$dir" --catalog-limit "$limit" --out "$dir/benchmark.json" \
        --catalog-args "--rank-setup shared --device cuda --nodes 1 -n $K --dist worksteal --backends $BACKENDS --max-examples $EXAMPLES --conformance-seed $seed $extra" \
        2>&1 | tee "$dir/log.txt"
      pack "$part" "$dir" ;;
    cold25)
      DEEPEP_KIT_VERSION=2.5.0 source .deepep-kit/activate.sh || exit 1
      python3 -c "import deep_ep, sys; v = deep_ep.__version__; print('deep_ep', v); sys.exit(v != '2.5.0')" || exit 1
      export EP_JIT_CACHE_DIR=/tmp/jit-25; dir=/tmp/reports-cold25; rm -rf "$dir"; mkdir -p "$dir"
      base=${BASELINE:-/tmp/reports-cold/baseline-2.1.0.json}
      [ -f "$base" ] && gate="--baseline=$base" || { gate=; echo "part cold25: no 2.1.0 baseline (part cold first)"; }
      left=$(( CALL_S - ($(date +%s) - started) - 25 )); limit=${T_COLD25:-$left}; [ "$left" -lt "$limit" ] && limit=$left
      echo "part cold25: limit $limit s ($(( $(date +%s) - started )) s into the call)"
      python3 -m benchmarks --device cuda --only catalog --cold --jit-cache "$EP_JIT_CACHE_DIR" \
        --catalog-report "$dir" --catalog-limit "$limit" --out "$dir/benchmark.json" \
        --catalog-args "--rank-setup shared --device cuda --nodes 1 -n $K --dist worksteal --backends $BACKENDS --max-examples $EXAMPLES --conformance-seed 3703 $gate" \
        2>&1 | tee "$dir/log.txt"
      pack cold25 "$dir" ;;
    *) echo "unknown part $part" >&2; exit 2 ;;
  esac
done
echo "the call: $(( $(date +%s) - started )) s"
