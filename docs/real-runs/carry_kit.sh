#!/usr/bin/env bash
# The real-DeepEP kit (../shared/deepep-kit, 24.6 MB) no longer fits a device call beside this checkout's tracked
# files (42.5 MB on 2026-12-07; the call carries at most 64 MiB): copy it into the ignored .deepep-kit with the 2.1.0
# wheel's files as an xz tarball (4.9 MB for the wheel's 6.9 MB) and without the 2.5.0 source tarball (activate.sh
# does not use it), then rebuild the wheel on the device before sourcing the kit (run 33, docs/real-runs/README.md).
#
#   here:        bash docs/real-runs/carry_kit.sh pack [KIT]      (KIT: default ../shared/deepep-kit)
#   the device:  bash docs/real-runs/carry_kit.sh unpack || exit 1; source .deepep-kit/activate.sh || exit 1; ...
#
# The rebuilt wheel has the same files with the same CRCs as the kit's (checked by `pack`).
set -euo pipefail
cd "$(dirname "$0")/../.."
WHEEL=deep_ep-2.1.0-cp312-cp312-linux_x86_64.whl
PACKED=deep_ep-2.1.0-whl-contents.tar.xz

crcs() {  # the wheel's files and their CRCs, one line
  python3 -c "import sys, zipfile; print(sorted((i.filename, i.CRC) for i in zipfile.ZipFile(sys.argv[1]).infolist()
              if not i.is_dir()))" "$1"
}

rebuild() {  # the wheel from the packed files, into $1
  local work
  work=$(mktemp -d)
  tar xJf ".deepep-kit/$PACKED" -C "$work"
  (cd "$work" && python3 -m zipfile -c "$1" ./*)
  rm -rf "$work"
}

case "${1:?pack or unpack}" in
  pack)
    kit=$(cd "${2:-../shared/deepep-kit}" && pwd)
    mkdir -p .deepep-kit
    grep -qx '/.deepep-kit/' .git/info/exclude 2>/dev/null || echo /.deepep-kit/ >> .git/info/exclude
    for f in "$kit"/*; do
      case $(basename "$f") in *.whl|*-src.tar.gz) ;; *) cp "$f" .deepep-kit/ ;; esac
    done
    cp "$kit"/deepinfer_ep-2.5.0-*.whl .deepep-kit/
    work=$(mktemp -d)
    (cd "$work" && python3 -m zipfile -e "$kit/$WHEEL" . && tar cJf - ./*) > ".deepep-kit/$PACKED"
    rm -rf "$work"
    check=$(mktemp -d)
    rebuild "$check/$WHEEL"
    [ "$(crcs "$kit/$WHEEL")" = "$(crcs "$check/$WHEEL")" ] || { echo "carry_kit: the rebuilt wheel differs" >&2; exit 1; }
    rm -rf "$check"
    du -sh .deepep-kit ;;
  unpack)
    [ -f ".deepep-kit/$WHEEL" ] || rebuild "$PWD/.deepep-kit/$WHEEL"
    echo "carry_kit: .deepep-kit/$WHEEL rebuilt" ;;
  *) echo "carry_kit: pack or unpack" >&2; exit 2 ;;
esac
