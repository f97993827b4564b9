#!/usr/bin/env bash
# fixtures/record.py in several worlds side by side, one world (2 ranks) per group of units, so that one slow unit
# (a cold JIT compile, a hang until --section-timeout) costs only its own group, and the kernels of the groups compile
# at the same time (record.py runs its units in its own fixed order; the groups choose what comes first).
# Called by run.sh's part record25 (environment set up there); locally, on the emulation:
#   RECORD_ARGS="--deep-ep emulation:2.5.0 --device cpu" TGZ=/tmp/rec.tgz bash docs/real-runs/2026-12-06-1xH100/record_groups.sh
# UNIT_GROUPS: space-separated groups, each a --sections list; each records into $DIR/g<i>/ (rank files, progress,
# watchdog logs, log.txt).  T: every world is stopped (SIGTERM to its launcher) after T s; the rank files are saved
# after every unit, so what finished is kept.  $DIR is tarred into $TGZ every SNAP s and at the end (a call stopped
# from outside still brings the last snapshot back).  An API surface of deep_ep is written beside them (SURFACE=1).
set -uo pipefail
cd "$(dirname "$0")/../../.."
DIR=${DIR:-/tmp/rec25}
TGZ=${TGZ:?TGZ: where the snapshots of DIR go}
T=${T:-220}
SNAP=${SNAP:-15}
SECTION_TIMEOUT=${SECTION_TIMEOUT:-150}
RECORD_ARGS=${RECORD_ARGS:---rank-setup shared}
UNIT_GROUPS=${UNIT_GROUPS:-"meta,v2_contract v2_dispatch_options v2_single_reduction,capture_build v2_fp8_dispatch integrator_calls,cuda_graphs"}
rm -rf "$DIR"; mkdir -p "$DIR" "$(dirname "$TGZ")"
t0=$(date +%s)
snapshot() { tar czf "$TGZ.tmp" -C "$(dirname "$DIR")" "$(basename "$DIR")" 2>/dev/null && mv -f "$TGZ.tmp" "$TGZ"; }
if [ "${SURFACE:-1}" = 1 ]; then
  timeout 90 python3 -c "import json; from conformance.core.api_surface import surface_of; print(json.dumps(surface_of('deep_ep'), indent=1))" \
    > "$DIR/api-surface.json" 2> "$DIR/api-surface.err" &
fi
pids=(); i=0
for group in $UNIT_GROUPS; do
  d=$DIR/g$i; mkdir -p "$d"; echo "$group" > "$d/sections.txt"
  ( timeout -s TERM -k 5 "$T" python3 fixtures/record.py --out "$d" --nproc 2 $RECORD_ARGS \
      --section-timeout "$SECTION_TIMEOUT" --sections "$group" > "$d/log.txt" 2>&1
    echo "record.py exit $? at $(( $(date +%s) - t0 )) s (group $group)" >> "$d/log.txt" ) &
  pids+=($!); i=$((i + 1)); sleep 1
done
( while sleep "$SNAP"; do snapshot; done ) & snapper=$!
wait "${pids[@]}"
kill "$snapper" 2>/dev/null; wait "$snapper" 2>/dev/null
wait  # the API surface
python3 - "$DIR" > "$DIR/summary.txt" <<'EOF'
import json, sys
from pathlib import Path
root = Path(sys.argv[1])
for g in sorted(root.glob("g*")):
    print(f"{g.name} [{(g / 'sections.txt').read_text().strip()}]")
    for rank in (0, 1):
        p = g / f"progress-rank{rank}.json"
        if not p.exists():
            print(f"  rank {rank}: no progress file"); continue
        data = json.loads(p.read_text())
        for unit, s in data["units"].items():
            err = f" {s['error'][:160]}" if s.get("error") else ""
            print(f"  rank {rank} {unit}: {s.get('state')} {s.get('status', '')} {s.get('seconds', '')}{err}")
        print(f"  rank {rank}: starts {data['starts']}")
    log = (g / "log.txt").read_text(errors="replace").splitlines() if (g / "log.txt").exists() else []
    print("  " + (log[-1] if log else "(no log)"))
EOF
echo "record_groups: $(( $(date +%s) - t0 )) s" >> "$DIR/summary.txt"
snapshot
cat "$DIR/summary.txt"
