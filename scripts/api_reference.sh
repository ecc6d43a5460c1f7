#!/usr/bin/env bash
# The API reference of dtrain's public headers, with Doxygen (installed by
# scripts/setup.sh): writes OUT_DIR/html/index.html (default build/api).
# Any Doxygen warning fails the run; the warnings are in OUT_DIR/warnings.log.
#   scripts/api_reference.sh [OUT_DIR]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$(realpath -m "${1:-$root/build/api}")"
command -v doxygen > /dev/null || { echo "api_reference.sh: doxygen is not installed: run scripts/setup.sh (or apt-get install doxygen)" >&2; exit 2; }
mkdir -p "$out"
cd "$root"
DTRAIN_API_OUT="$out" doxygen docs/api/Doxyfile
echo "API reference: $out/html/index.html"
