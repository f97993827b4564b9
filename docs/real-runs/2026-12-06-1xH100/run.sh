#!/usr/bin/env bash
# The real-library runs of issues 36 and 37 (one GPU, two ranks sharing it, the kit's DeepEP 2.1.0 and 2.5.0), from
# the checkout on the accelerator machine; carry .deepep-kit (and .mcore for the megatron parts: prepare.sh of
# 2026-12-03-1xH200 makes both).
#
#   PARTS="catalog21" bash docs/real-runs/2026-12-06-1xH100/run.sh
#   PARTS="megatron21 record25 catalog25 megatron25" bash docs/real-runs/2026-12-06-1xH100/run.sh
#
# Parts (each writes $OUT/<part>/...; the device tool brings back 8 files per call, 2 folders deep):
#   catalog21   the whole catalog on real-v1,real-v2,emulated-v1,emulated-v2, 25 examples, a cold kernel cache, through
#               python -m benchmarks --only catalog --cold (issue 37's cold figure), writing the 2.1.0 baseline of the
#               bump (issue 36): $OUT/catalog21/{benchmark.json,conformance.json,conformance.md,log.txt,baseline.json}
#   warm21      the same on the kernel cache catalog21 left (issue 37's warm figure; the machine kept warm)
#   megatron21  the seed PR's Megatron, both paths beside real-v2, $MEG_FILES at 3 examples, on 2.1.0, writing the
#               wrapper's baseline ($OUT/megatron/...)
#   record25    fixtures/record.py on DeepEP 2.5.0: the V2 sections, in worlds side by side, one per group of
#               $UNIT_GROUPS (record_groups.sh: default "meta,v2_contract v2_dispatch_options v2_single_reduction,
#               capture_build v2_fp8_dispatch integrator_calls,cuda_graphs"; run 25 recorded the cases and the bad
#               calls), its API surface; T (default 220) stops every world, SECTION_TIMEOUT (150) one unit
#               ($OUT/record25/rec.tgz, snapshotted every 15 s; $OUT/record25/summary.txt)
#   catalog25   the whole catalog on DeepEP 2.5.0 (real-v1,real-v2,emulated-v1,emulated-v2; the emulated ones follow
#               the real version), 10 examples, --baseline the catalog21 baseline: the bump explained
#               ($OUT/catalog25/{conformance.json,conformance.md,bump.md,log.txt})
#   p12-25      P12 alone on DeepEP 2.5.0 (real-v2, emulated-v2), 10 examples: the rerun after the fix of the suite's
#               message comparison that failed P12 in run 26 (a path through a relative include, ffd8b9d); cold,
#               its warm-up alone takes about 112 s (run 28a: stopped at 150 s), so T defaults to 270
#   megatron25  megatron21's run on DeepEP 2.5.0 with --baseline its 2.1.0 report: the wrapper through the bump
#   megatron-catalog21  the seed PR's Megatron, both paths beside real-v1 and real-v2, the whole catalog at 10 examples
#               on 2.1.0 (issue 37's last bullet), on the kernel cache /tmp/jit-21 an earlier part of a warm machine left
# A 2.1.0 part after a 2.5.0 part switches back (use_21: run 28's first call ran p12-25 before megatron21).
# T: the outer limit of a part in seconds (SIGTERM: the run stops and writes its partial report).
set -uo pipefail
cd "$(dirname "$0")/../../.."
export NCCL_MULTI_RANK_GPU_ENABLE=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
HERE=docs/real-runs/2026-12-06-1xH100
# the 2.1.0 report the 2.5.0 run is gated against (run 24a's was partial: --allow-partial), relative or absolute
BASELINE21=$(realpath "${BASELINE21:-$HERE/24a-catalog21/conformance.json}")
MEG_FILES=${MEG_FILES:-"conformance/properties/test_p01_payloads.py conformance/properties/test_p05_combine.py conformance/properties/test_p07_cached_dispatch.py conformance/properties/test_p09_gradients.py"}
started=$(date +%s)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
source .deepep-kit/activate.sh || exit 1   # 2.1.0 (a part on 2.5.0 switches)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

use_21() {  # back to 2.1.0 after a 2.5.0 part: drop 2.5.0's folder from PYTHONPATH (use_25 puts it first)
  PYTHONPATH=$(printf '%s' "$PYTHONPATH" | tr ':' '\n' | grep -vx /tmp/deepep-2.5.0 | paste -sd: -)
  export PYTHONPATH
  python3 -c "import deep_ep, sys; v = deep_ep.__version__; print('deep_ep', v); sys.exit(v != '2.1.0')" || exit 1
}
use_25() {
  DEEPEP_KIT_VERSION=2.5.0 source .deepep-kit/activate.sh || exit 1
  export EP_JIT_CACHE_DIR=/tmp/jit-25
}
megatron_path() {
  mkdir -p /tmp/mcore /tmp/conformance-ep/deepep_conformance_ep-0.0.dist-info
  [ -d /tmp/mcore/megatron ] || tar xJf .mcore/megatron-core-0.16.1-seed-pr-cp312.tar.xz -C /tmp/mcore || exit 1
  printf 'Metadata-Version: 2.1\nName: deepep-conformance-ep\nVersion: 0.0\n' \
    > /tmp/conformance-ep/deepep_conformance_ep-0.0.dist-info/METADATA
  printf '[deepep_conformance.backends]\nmegatron-fused-a2a-v1 = conformance.integrations.megatron:MegatronFusedA2AV1\nmegatron-fused-a2a-v2 = conformance.integrations.megatron:MegatronFusedA2AV2\n' \
    > /tmp/conformance-ep/deepep_conformance_ep-0.0.dist-info/entry_points.txt
  case ":$PYTHONPATH:" in *:/tmp/mcore:*) ;; *) export PYTHONPATH="$PYTHONPATH:/tmp/mcore:/tmp/conformance-ep";; esac
}
run_pytest() {  # name, limit, then pytest arguments: the report in /tmp/reports-<name>, its files in $OUT/<name>
  local name=$1 limit=$2; shift 2
  local dir=/tmp/reports-$name; rm -rf "$dir"; mkdir -p "$OUT/$name"
  local t0; t0=$(date +%s)
  timeout -s TERM -k 30 "$limit" python3 -m pytest -p conformance.plugin -p no:cacheprovider --rank-setup shared \
    --device cuda --nodes 1 --report-dir "$dir" "$@" 2>&1 | tee "$OUT/$name/log.txt"
  echo "part $name: wall $(( $(date +%s) - t0 )) s (exit ${PIPESTATUS[0]}; $(( $(date +%s) - started )) s into the call)" \
    | tee -a "$OUT/$name/log.txt"
  for f in conformance.json conformance.md bump.md; do [ -f "$dir/$f" ] && cp "$dir/$f" "$OUT/$name/"; done
}

for part in ${PARTS:?PARTS: the parts to run}; do
  case $part in
    catalog21|warm21)
      use_21; export EP_JIT_CACHE_DIR=/tmp/jit-21
      cold=--cold; seed=2606; extra="--write-baseline $PWD/reports/baseline-2.1.0.json"
      [ "$part" = warm21 ] && { cold=; seed=2607; extra=; }
      mkdir -p "$OUT/$part" reports; rm -rf "/tmp/reports-$part"
      python3 -m benchmarks --device cuda --only catalog $cold --jit-cache "$EP_JIT_CACHE_DIR" \
        --catalog-report "/tmp/reports-$part" --catalog-limit "${T:-530}" --out "$OUT/$part/benchmark.json" \
        --catalog-args "--rank-setup shared --device cuda --nodes 1 --backends real-v1,real-v2,emulated-v1,emulated-v2 --max-examples 25 --conformance-seed $seed $extra" \
        2>&1 | tee "$OUT/$part/log.txt"
      for f in conformance.json conformance.md jit.log; do [ -f "/tmp/reports-$part/$f" ] && cp "/tmp/reports-$part/$f" "$OUT/$part/"; done
      [ -f reports/baseline-2.1.0.json ] && [ "$part" = catalog21 ] && cp reports/baseline-2.1.0.json "$OUT/$part/baseline.json" ;;
    megatron21)
      use_21; export EP_JIT_CACHE_DIR=/tmp/jit-21; megatron_path
      run_pytest megatron21 "${T:-150}" --backends megatron-fused-a2a-v1,megatron-fused-a2a-v2,real-v2 --deep-ep real \
        --max-examples 3 --conformance-seed 2608 --warm-up off --allow-partial \
        --write-baseline "$PWD/reports/megatron-2.1.0.json" $MEG_FILES
      cp reports/megatron-2.1.0.json "$OUT/megatron21/baseline.json" 2>/dev/null ;;
    megatron-catalog21)
      use_21; export EP_JIT_CACHE_DIR=/tmp/jit-21; megatron_path
      run_pytest megatron-catalog21 "${T:-540}" --backends megatron-fused-a2a-v1,megatron-fused-a2a-v2,real-v1,real-v2 \
        --deep-ep real --max-examples 10 --conformance-seed 2609 --allow-partial ;;
    record25)
      use_25; mkdir -p "$OUT/record25"
      DIR=/tmp/rec25 TGZ="$OUT/record25/rec.tgz" T="${T:-220}" SECTION_TIMEOUT="${SECTION_TIMEOUT:-150}" \
        bash "$HERE/record_groups.sh" 2>&1
      cp /tmp/rec25/summary.txt "$OUT/record25/" 2>/dev/null ;;
    catalog25)
      use_25
      run_pytest catalog25 "${T:-300}" --backends real-v1,real-v2,emulated-v1,emulated-v2 --max-examples 10 \
        --conformance-seed 2606 --allow-partial --baseline "$BASELINE21" ;;
    p12-25)
      use_25
      run_pytest p12-25 "${T:-270}" --backends real-v2,emulated-v2 --max-examples 10 --conformance-seed 2606 \
        --allow-partial conformance/properties/test_p12_bad_input.py ;;
    megatron25)
      use_25; megatron_path
      run_pytest megatron25 "${T:-100}" --backends megatron-fused-a2a-v1,megatron-fused-a2a-v2,real-v2 --deep-ep real \
        --max-examples 3 --conformance-seed 2608 --warm-up off --allow-partial \
        --baseline "$PWD/reports/megatron-2.1.0.json" $MEG_FILES ;;
    *) echo "unknown part $part" >&2; exit 2 ;;
  esac
done
echo "the call: $(( $(date +%s) - started )) s"
