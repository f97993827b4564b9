#!/usr/bin/env bash
# The real-library runs of issues 24 and 25 on one H200 (two ranks sharing it), from the checkout on the accelerator
# machine, with the kit copied into .deepep-kit (carried) and the seed PR's Megatron as .mcore/*.tar.xz (carried:
# megatron-core 0.16.1 cp312 with ../shared/clients/megatron-seed-pr/fused_a2a-deepep-v2.patch applied).
#
#   PARTS="megatron catalog" T=270 bash docs/real-runs/2026-12-03-1xH200/run.sh
#
# Each part writes $OUT/<part>/{conformance.json,conformance.md,log.txt,jit.log} (and benchmark.json: catalog, warm;
# the device tool brings back eight files per call).  Parts:
#   megatron  megatron-fused-a2a-v1,megatron-fused-a2a-v2,real-v1,real-v2, 10 examples per property (issue 24),
#             on the kernel cache at /tmp/jit-catalog (whatever a catalog part left there)
#   catalog   real-v1,real-v2,emulated-v1,emulated-v2, 25 examples per property, a cold JIT cache (issue 25), through
#             python -m benchmarks --device cuda --only catalog --cold (the run and its figures);
#             JITTAR=1 also packs the kernel cache into $OUT/jit-cache.tar.xz for the next call
#   warm      the same with the kernel cache of the catalog part, in place where the machine was kept warm, else
#             .jitcache/jit-cache.tar.xz.part-* (carried); its warm-up marker makes the warm-up skip (issue 25's warm
#             figure)
#   megatron-late  the wrapper's P13 and P25 on the kernel cache in place (after warm)
#   integrators  issue 27's properties (P26 worst-case outputs read whole, P27 fresh groups, P28 back to back, P29
#             CUDA graphs) and P12
#             (which now names a call that leaves the CUDA stream switched) on real-v1,real-v2,emulated-v1,emulated-v2,
#             15 examples, on the kernel cache in place
#   graphs    P26, P29 (CUDA graphs), P21 (expand-mode combine with 1-D weights) and P27 on real-v1,real-v2,
#             emulated-v1,emulated-v2, $EXAMPLES (8) examples, no JIT warm-up (a cold machine)
#   rerun     the property files $FILES on real-v1,real-v2,emulated-v1,emulated-v2, $EXAMPLES (8) examples, seed $SEED
#             (2801), no JIT warm-up: a fix checked on the real library
#   fresh     docs/real-runs/2026-12-05-1xH200/fresh_nccl_group.py: P27's finding and its workarounds ($OUT/fresh/log.txt)
#   record    fixtures/record.py --sections $SECTIONS (default integrator_calls,cuda_graphs,capture_build; each unit
#             stopped after $SECTION_TIMEOUT s, default 120) on the real library (two ranks sharing the GPU): the
#             recording the emulation-fidelity self-test replays ($OUT/record/rank{0,1}.pt, log.txt)
# T: the outer time limit of each part in seconds (SIGTERM: the run stops and writes its partial report).  For the
#   catalog parts keep T + 150 s within the device call's limit: the benchmark waits up to 120 s for a stopped run's
#   report, then reads it and the rank profiles (run 21a, T=540: the 600 s call ended before anything was copied).
set -uo pipefail
cd "$(dirname "$0")/../../.."
source .deepep-kit/activate.sh || exit 1
export NCCL_MULTI_RANK_GPU_ENABLE=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
T=${T:-540}
mkdir -p /tmp/mcore /tmp/conformance-ep/deepep_conformance_ep-0.0.dist-info
tar xJf .mcore/megatron-core-0.16.1-seed-pr-cp312.tar.xz -C /tmp/mcore || exit 1
# the plug-ins' entry points, as an installed deepep-conformance registers them (the checkout is not installed here)
printf 'Metadata-Version: 2.1\nName: deepep-conformance-ep\nVersion: 0.0\n' \
  > /tmp/conformance-ep/deepep_conformance_ep-0.0.dist-info/METADATA
printf '[deepep_conformance.backends]\nmegatron-fused-a2a-v1 = conformance.integrations.megatron:MegatronFusedA2AV1\nmegatron-fused-a2a-v2 = conformance.integrations.megatron:MegatronFusedA2AV2\n' \
  > /tmp/conformance-ep/deepep_conformance_ep-0.0.dist-info/entry_points.txt
export PYTHONPATH="$PWD:/tmp/mcore:/tmp/conformance-ep"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "from megatron.core.transformer.moe import fused_a2a as f; print('seed PR Megatron: HAVE_DEEP_EP_V2', f.HAVE_DEEP_EP_V2)"

run_part() {  # name, then pytest arguments
  local name=$1; shift
  local dir=/tmp/reports-$name
  rm -rf "$dir"; mkdir -p "$OUT/$name"
  local started; started=$(date +%s)
  timeout -s TERM -k 30 "${TM:-$T}" python3 -m pytest -p no:cacheprovider --rank-setup shared --device cuda --nodes 1 \
      --report-dir "$dir" "$@" 2>&1 | tee "$OUT/$name/log.txt"
  echo "part $name: wall $(( $(date +%s) - started )) s (exit ${PIPESTATUS[0]})" | tee -a "$OUT/$name/log.txt"
  for f in conformance.json conformance.md ${JITLOG-jit.log}; do [ -f "$dir/$f" ] && cp "$dir/$f" "$OUT/$name/"; done
}

for part in ${PARTS:-megatron}; do
  case $part in
    megatron)  # after catalog/warm on the same machine: their kernel cache in place
      export EP_JIT_CACHE_DIR=/tmp/jit-catalog
      run_part megatron --backends megatron-fused-a2a-v1,megatron-fused-a2a-v2,real-v1,real-v2 --deep-ep real \
        --max-examples 10 --conformance-seed 2403 ;;
    megatron-late)  # the wrapper's P25 (run A was stopped in P11; LATE: other property files)
      JITLOG= run_part megatron-late --backends megatron-fused-a2a-v1,megatron-fused-a2a-v2,real-v1,real-v2 \
        --deep-ep real --max-examples 10 --conformance-seed 2405 --warm-up off \
        ${LATE:-conformance/properties/test_p25_clean_exit.py} ;;
    integrators)  # issue 27 (and P12's stream check), beside the emulation
      export EP_JIT_CACHE_DIR=/tmp/jit-catalog
      run_part integrators --backends real-v1,real-v2,emulated-v1,emulated-v2 --deep-ep real --max-examples 15 \
        --conformance-seed 2701 conformance/properties/test_p26_worst_case_whole.py \
        conformance/properties/test_p27_fresh_groups.py conformance/properties/test_p28_back_to_back.py \
        conformance/properties/test_p12_bad_input.py conformance/properties/test_p29_cuda_graphs.py ;;
    graphs)  # issue 27 on a cold machine: P26 (the allocator filled in both pools), P29, P21, P27
      export EP_JIT_CACHE_DIR=/tmp/jit-catalog
      run_part graphs --backends real-v1,real-v2,emulated-v1,emulated-v2 --deep-ep real --max-examples "${EXAMPLES:-8}" \
        --conformance-seed 2702 --warm-up off conformance/properties/test_p26_worst_case_whole.py \
        conformance/properties/test_p29_cuda_graphs.py conformance/properties/test_p21_buffer_options.py \
        conformance/properties/test_p27_fresh_groups.py ;;
    rerun)  # chosen property files, beside the emulation (a fix checked on the real library)
      export EP_JIT_CACHE_DIR=/tmp/jit-catalog
      run_part rerun --backends real-v1,real-v2,emulated-v1,emulated-v2 --deep-ep real --max-examples "${EXAMPLES:-8}" \
        --conformance-seed "${SEED:-2801}" --warm-up off ${FILES:?FILES: the property files to run} ;;
    fresh)  # P27's finding reproduced outside the suite, with its workarounds
      mkdir -p "$OUT/fresh"
      timeout -s TERM -k 10 "${TM:-$T}" python3 docs/real-runs/2026-12-05-1xH200/fresh_nccl_group.py 2>&1 \
        | tee "$OUT/fresh/log.txt" ;;
    record)  # the recorder's issue-27 section on the real library
      export EP_JIT_CACHE_DIR=/tmp/jit-catalog
      mkdir -p "$OUT/record"; rm -rf /tmp/rec-integrators
      timeout -s TERM -k 30 "${TM:-$T}" python3 fixtures/record.py --out /tmp/rec-integrators --nproc 2 \
        --rank-setup shared --sections "${SECTIONS:-integrator_calls,cuda_graphs,capture_build}" \
        --section-timeout "${SECTION_TIMEOUT:-120}" 2>&1 | tee "$OUT/record/log.txt"
      for f in rank0.pt rank1.pt; do [ -f "/tmp/rec-integrators/$f" ] && cp "/tmp/rec-integrators/$f" "$OUT/record/"; done ;;
    catalog|warm)  # python -m benchmarks --device cuda --only catalog: the run and its figures
      export EP_JIT_CACHE_DIR=/tmp/jit-catalog
      cold=--cold; seed=2503
      if [ "$part" = warm ]; then  # the cache of the catalog part: in place (machine kept warm) or carried
        cold=; seed=2504
        if ls .jitcache/jit-cache.tar.xz.part-* >/dev/null 2>&1; then
          rm -rf "$EP_JIT_CACHE_DIR"; cat .jitcache/jit-cache.tar.xz.part-* | tar xJf - -C /tmp || exit 1
        elif [ ! -d "$EP_JIT_CACHE_DIR" ]; then echo "warm: no kernel cache in place or carried" >&2; exit 1; fi
      fi
      mkdir -p "$OUT/$part"; rm -rf "/tmp/reports-$part"
      python3 -m benchmarks --device cuda --only catalog $cold --jit-cache "$EP_JIT_CACHE_DIR" \
        --catalog-report "/tmp/reports-$part" --catalog-limit "$T" --out "$OUT/$part/benchmark.json" \
        --catalog-args "--rank-setup shared --device cuda --nodes 1 --backends real-v1,real-v2,emulated-v1,emulated-v2 --max-examples 25 --conformance-seed $seed ${EXTRA:-}" \
        2>&1 | tee "$OUT/$part/log.txt"
      for f in conformance.json conformance.md jit.log; do [ -f "/tmp/reports-$part/$f" ] && cp "/tmp/reports-$part/$f" "$OUT/$part/"; done
      if [ "$part" = catalog ] && [ "${JITTAR:-0}" = 1 ]; then  # in parts of at most 15 MB (the tool's file limit)
        tar cJf /tmp/jit-cache.tar.xz -C /tmp jit-catalog && split -b 15000000 /tmp/jit-cache.tar.xz "$OUT/jit-cache.tar.xz.part-"
        ls -la "$OUT"
      fi ;;
  esac
done
