#!/usr/bin/env bash
# Installs a configured and built dtrain tree into a fresh prefix and checks
# that the package's pieces are where consumers look for them.
#   usage: install.sh <build-dir> <prefix> <config-dir, relative to the prefix>
set -euo pipefail
build=$1 prefix=$2 config_dir=$3

rm -rf "$prefix"
cmake --install "$build" --prefix "$prefix"
for f in include/dtrain/trainer.hpp include/dtrain/version.hpp share/doc/dtrain/LICENSE \
         "$config_dir/dtrain-config.cmake" "$config_dir/dtrain-config-version.cmake" \
         "$config_dir/dtrainTargets.cmake" "$config_dir/DtrainDependencies.cmake" "$config_dir/FindNCCL.cmake"; do
  [[ -f "$prefix/$f" ]] || { echo "install.sh: $prefix/$f is missing after the install" >&2; exit 1; }
done
# The prefix must be relocatable: nothing in the config may name the build or source tree.
if grep -rl -e "$(cd "$build" && pwd)" -e "$(cd "$(dirname "$0")/../.." && pwd)/" "$prefix/$config_dir"; then
  echo "install.sh: the files above hard-code the build or source tree" >&2
  exit 1
fi
echo "install.sh: dtrain installed to $prefix"
