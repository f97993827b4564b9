#!/usr/bin/env bash
# Issue 14 on the one-GPU machine (two ranks sharing its GPU, docs/real-runs/README.md).  Run from the checkout
# AFTER `source .deepep-kit/activate.sh`.  PARTS: a space-separated list of
#   record   fixtures/record.py --sections "$SECTIONS" (default new) from the real DeepEP
#   emu      the emulation alone on CUDA (every property): does the stand-in itself run on a GPU?
#   v1       the V1 properties of issue 14 (and P5, P10, P12) on $V1_BACKENDS (default real-v1,emulated-v1)
#   v2       the V2 properties of issue 14 (and P10, P11) on $V2_BACKENDS (default real-v2,emulated-v2)
# Writes into ${OUT:-/tmp/out}: one .tgz per part (the device tool returns at most 8 files).
set -u
OUT=${OUT:-/tmp/out}
SEED=${SEED:-14}
EXAMPLES=${EXAMPLES:-5}
PARTS=${PARTS:-record v1 v2}
mkdir -p "$OUT/work"
export PYTHONPATH=. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
step() { echo; echo "=== $* ($(date -u +%T))"; }
pack() { tar -C "$OUT/work" -czf "$OUT/$1.tgz" "$1" 2>/dev/null; ls -la "$OUT/$1.tgz"; }
suite() {  # suite NAME LIMIT ARGS...: pytest into $OUT/work/NAME
  local name=$1 limit=$2; shift 2
  mkdir -p "$OUT/work/$name"
  NCCL_MULTI_RANK_GPU_ENABLE=1 timeout "$limit" python3 -m pytest --rank-setup shared --device cuda \
      --max-examples "$EXAMPLES" --conformance-seed "$SEED" --example-timeout 60 --max-restarts 1 --allow-partial \
      -v -p no:cacheprovider --report-dir="$OUT/work/$name" "$@" > "$OUT/work/$name/log.txt" 2>&1
  echo "exit $?"; grep -E "^(P[0-9]|PARTIAL|conformance report|=====)" "$OUT/work/$name/log.txt" | tail -32
  pack "$name"
}
python3 -c "import deep_ep, torch; print('deep_ep', deep_ep.__file__, 'torch', torch.__version__, 'gpus', torch.cuda.device_count())"

for part in $PARTS; do
  case $part in
    record)
      step "record sections ${SECTIONS:-new} from the real DeepEP (two ranks on GPU 0)"
      timeout "${RECORD_LIMIT:-230}" python3 fixtures/record.py --out "$OUT/work/record" --deep-ep real --device cuda \
          --rank-setup shared --nproc 2 --sections "${SECTIONS:-new}" --timing off --section-timeout 60 \
          --max-restarts 2 > "$OUT/work/record.log" 2>&1
      echo "exit $?"; grep -E "^rank 0|record.py" "$OUT/work/record.log" | tail -20
      mkdir -p "$OUT/work/record"; cp "$OUT/work/record.log" "$OUT/work/record/"; pack record ;;
    emu)
      step "the emulation alone on CUDA, every property (V2 with NCCL_MULTI_RANK_GPU_ENABLE=1)"
      suite emu "${EMU_LIMIT:-200}" --backends emulated ;;
    v1)
      step "V1: the issue-14 properties (FP8, low latency, worst case, configs, events) on ${V1_BACKENDS:-real-v1,emulated-v1}"
      suite v1 "${V1_LIMIT:-300}" --backends "${V1_BACKENDS:-real-v1,emulated-v1}" \
          -k "p15 or p16 or p17 or p18 or p19 or p23 or p24 or p05 or p10 or p12" ;;
    v2)
      step "V2: the issue-14 properties on ${V2_BACKENDS:-real-v2,emulated-v2} (NCCL_MULTI_RANK_GPU_ENABLE=1)"
      suite v2 "${V2_LIMIT:-300}" --backends "${V2_BACKENDS:-real-v2,emulated-v2}" \
          -k "p18 or p19 or p20 or p21 or p22 or p11 or p10" ;;
  esac
done
rm -rf "$OUT/work"
