#!/usr/bin/env bash
# Formats every C++ and CUDA source of the tree with the project's
# .clang-format (clang-format 14), in place; `--check` only reports the files
# that differ (what the CTest format_check runs).
#   usage: scripts/format.sh [--check]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
formatter=""
for c in clang-format-14 clang-format; do
  if command -v "$c" >/dev/null && "$c" --version | grep -q 'version 14\.'; then formatter=$c; break; fi
done
if [[ -z $formatter ]]; then
  echo "scripts/format.sh: needs clang-format 14 (Debian 12: apt-get install clang-format; scripts/setup.sh installs it for the tests)" >&2
  exit 77
fi
# The tracked sources (every source when this is not a git checkout).
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files -- '*.hpp' '*.ipp' '*.cuh' '*.cpp' '*.cu' '*.h')
else
  mapfile -t files < <(find include tests examples tools bench cmake docs/snippets test_package \
                            -type f \( -name '*.hpp' -o -name '*.ipp' -o -name '*.cuh' -o -name '*.cpp' -o -name '*.cu' -o -name '*.h' \))
fi
if [[ ${1:-} == --check ]]; then
  bad=()
  for f in "${files[@]}"; do
    "$formatter" --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
  done
  if ((${#bad[@]})); then
    printf 'not formatted: %s\n' "${bad[@]}"
    echo "scripts/format.sh: ${#bad[@]} of ${#files[@]} files differ from .clang-format: run scripts/format.sh"
    exit 1
  fi
  echo "scripts/format.sh: all ${#files[@]} C++ and CUDA sources are formatted"
  exit 0
fi
"$formatter" -i "${files[@]}"
echo "scripts/format.sh: formatted ${#files[@]} files"
