#!/usr/bin/env bash
# Prepares, on the machine with the checkout (it reaches the package index), what run.sh carries to the accelerator
# machine: the kit (.deepep-kit) and the seed PR's Megatron for Python 3.12 (.mcore/megatron-core-0.16.1-seed-pr-
# cp312.tar.xz: the cp312 wheel of megatron-core 0.16.1, unpacked, ../shared/clients/megatron-seed-pr/
# fused_a2a-deepep-v2.patch applied; test input, never committed: these folders and .jitcache (the kernel cache the
# part "warm" carries) are ignored through .git/info/exclude).
#
#   bash docs/real-runs/2026-12-03-1xH200/prepare.sh      # then: device run, carry [".deepep-kit", ".mcore"]
set -euo pipefail
cd "$(dirname "$0")/../../.."
shared=${SHARED:-../shared}
for folder in .deepep-kit .mcore .jitcache; do
  grep -qx "/$folder/" .git/info/exclude 2>/dev/null || echo "/$folder/" >> "$(git rev-parse --git-common-dir)/info/exclude"
done
mkdir -p .deepep-kit && cp "$shared"/deepep-kit/* .deepep-kit/
work=$(mktemp -d)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$work/wheel" megatron-core==0.16.1
python3 -m zipfile -e "$work"/wheel/megatron_core-0.16.1-*.whl "$work/site"
patch -d "$work/site" -p1 < "$shared/clients/megatron-seed-pr/fused_a2a-deepep-v2.patch"
grep -q HAVE_DEEP_EP_V2 "$work/site/megatron/core/transformer/moe/fused_a2a.py"
mkdir -p .mcore && tar cJf .mcore/megatron-core-0.16.1-seed-pr-cp312.tar.xz -C "$work/site" .
rm -rf "$work"
du -sh .deepep-kit .mcore
