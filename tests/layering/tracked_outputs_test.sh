#!/usr/bin/env bash
# Fails when git tracks a build output: an object file, a library, compiled
# Python, or what CMake and Ninja leave in a build folder. Such a file in the
# repository is always a mistake (a build run at the root, then `git add .`);
# .gitignore keeps new ones out, this catches one that got in anyway.
#
# usage: tracked_outputs_test.sh [SOURCE_DIR]   (default: this script's repository)
# Exits 0 when there is none, 1 naming each one, 77 (skipped) when SOURCE_DIR
# is not a git checkout (a source archive) or git is not installed.
# A tracked file already deleted from the work tree is not counted: its
# deletion is on its way into the next commit.
set -u
src=${1:-$(cd "$(dirname "$0")/../.." && pwd)}

if ! command -v git >/dev/null 2>&1; then
  echo "tracked_outputs_test: SKIP: git is not installed"
  exit 77
fi
if ! git -C "$src" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  echo "tracked_outputs_test: SKIP: $src is not a git checkout"
  exit 77
fi

bad=0
while IFS= read -r -d '' f; do
  base=${f##*/}
  case "$base" in
    *.o | *.obj | *.a | *.lib | *.so | *.so.* | *.dylib | *.dll | *.exe | \
    *.gch | *.pch | *.pyc | *.pyo | \
    CMakeCache.txt | cmake_install.cmake | CTestTestfile.cmake | \
    build.ninja | rules.ninja | .ninja_log | .ninja_deps | \
    compile_commands.json | install_manifest.txt) ;;
    *)
      case "/$f" in
        */CMakeFiles/* | */__pycache__/*) ;;
        *) continue ;;
      esac
      ;;
  esac
  [ -e "$src/$f" ] || [ -L "$src/$f" ] || continue
  echo "tracked build output: $f"
  bad=$((bad + 1))
done < <(git -C "$src" ls-files -z -- .)

if [ "$bad" -ne 0 ]; then
  echo "tracked_outputs_test: FAIL: $bad build output(s) tracked by git;" \
       "remove them (git rm --cached FILE) and let .gitignore keep them out"
  exit 1
fi
echo "tracked_outputs_test: no build output is tracked"
exit 0
