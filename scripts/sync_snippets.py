#!/usr/bin/env python3
"""Rewrites every C++ block of the docs from the compiled source it shows.

A C++ block in README.md or docs/**/*.md sits under a marker naming a region of
a source the build compiles:

    <!-- snippet: docs/snippets/guide.cpp#guide_strategies -->
    ```cpp
    ... the lines between `// [snippet:guide_strategies]` and
        `// [/snippet:guide_strategies]` of that file, dedented ...
    ```

docs_test (every_cpp_block_is_a_region_of_a_compiled_source) fails when a block
differs from its region. After a change to a region (an edit, scripts/format.sh)
this script brings the blocks back in line:

  scripts/sync_snippets.py          rewrite the blocks that differ, naming them
  scripts/sync_snippets.py --check  exit 1 naming each block that differs
"""

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKER = re.compile(r"^<!--\s*snippet:\s*([^#\s]+)#([A-Za-z0-9_]+)\s*-->$")


def region(path, name):
    """The region's lines with their common indentation removed (docs_test's rule), or None."""
    with open(os.path.join(ROOT, path)) as f:
        lines = f.read().split("\n")
    opening, closing = f"// [snippet:{name}]", f"// [/snippet:{name}]"
    try:
        begin = next(i for i, l in enumerate(lines) if l.strip() == opening)
        end = next(i for i in range(begin + 1, len(lines)) if lines[i].strip() == closing)
    except StopIteration:
        return None
    body = lines[begin + 1:end]
    indent = min((len(l) - len(l.lstrip(" ")) for l in body if l.strip()), default=0)
    return [l[indent:].rstrip() if l.strip() else "" for l in body]


def pages():
    out = [os.path.join(ROOT, "README.md")]
    for folder, _, files in os.walk(os.path.join(ROOT, "docs")):
        out += [os.path.join(folder, f) for f in files if f.endswith(".md")]
    return sorted(out)


def sync(path, write):
    """The blocks of one page that differ from their regions; rewritten when `write`."""
    with open(path) as f:
        lines = f.read().split("\n")
    out, changed, i = [], [], 0
    while i < len(lines):
        m = MARKER.match(lines[i].strip())
        out.append(lines[i])
        if m and i + 1 < len(lines) and lines[i + 1].strip() in ("```cpp", "```c++"):
            end = next((j for j in range(i + 2, len(lines)) if lines[j].strip() == "```"), None)
            code = region(m.group(1), m.group(2))
            if end is not None and code is not None:
                if lines[i + 2:end] != code:
                    changed.append(f"{os.path.relpath(path, ROOT)}:{i + 1} ({m.group(1)}#{m.group(2)})")
                out += [lines[i + 1]] + code + [lines[end]]
                i = end + 1
                continue
        i += 1
    if write and changed:
        with open(path, "w") as f:
            f.write("\n".join(out))
    return changed


def main(argv):
    check = argv == ["--check"]
    if argv and not check:
        print(__doc__, file=sys.stderr)
        return 2
    changed = [c for p in pages() for c in sync(p, not check)]
    for c in changed:
        print(("differs: " if check else "rewrote: ") + c)
    if check and changed:
        print("scripts/sync_snippets.py: run it without --check to bring the blocks in line")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
