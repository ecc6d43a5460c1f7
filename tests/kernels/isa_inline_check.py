#!/usr/bin/env python3
"""Every functor inlined into the host loops compiled per instruction level.

Host::for_each and Host::sum run a functor through loops compiled once for
each instruction level (backend/host/device_isa.hpp: run_range_avx2/avx512,
sum_range_avx2/avx512). They are only as fast as what gets inlined into
them: a call GCC leaves out of line is compiled for the baseline level
(SSE2) and runs there. GCC's `flatten` does not override its stack-frame
limit, so a row functor with a few lane arrays (a softmax, a norm, a loss)
fell out of the AVX-512 loop unless its row code was DTRAIN_ALWAYS_INLINE.

This check reads the machine code of the given objects (dtrain::runtime's,
where the built-in functors' loops are compiled) and fails, naming the loop
and the callee, when a per-level loop calls anything but the C library's
memory functions and libm.

    tests/kernels/isa_inline_check.py OBJECT...   (a CMake list a;b;c counts as several)
"""
import platform
import re
import shutil
import subprocess
import sys

ALLOWED = re.compile(r"(memset|memcpy|memmove|__stack_chk_fail|"
                     r"(exp|exp2|expm1|log|log2|log1p|pow|sqrt|tanh|erf|erfc|sin|cos)f?)(@plt)?")
LOOP = re.compile(r"(run|sum)_range_avx(2|512)<")


def objdump(*args):
    return subprocess.run(["objdump", *args], check=True, capture_output=True, text=True).stdout


def local_functions(obj):
    """Offset in .text -> name, for the object's local functions (a clone, a lambda)."""
    names = {}
    for line in objdump("-t", "-C", obj).splitlines():
        # 0000000000000920 l     F .text	000000000000043f NAME
        m = re.match(r"([0-9a-f]+) .{6}F \.text\t[0-9a-f]+ (.*)$", line)
        if m:
            names[int(m.group(1), 16)] = m.group(2)
    return names


def check(obj):
    """(loops checked, [(loop, callee)]) for one object."""
    local = local_functions(obj)
    loops, bad = 0, []
    name, checked, pending = None, False, None
    for line in objdump("-dr", "--no-show-raw-insn", "-C", obj).splitlines():
        head = re.match(r"[0-9a-f]+ <(.*)>:$", line)
        if head:
            name = head.group(1)
            checked = bool(LOOP.search(name))
            loops += checked
            pending = None
            continue
        if not checked:
            continue
        if "\tcall " in line:
            target = re.search(r"<([^>]*)>$", line)
            pending = target.group(1) if target else line.strip()
            continue
        if pending is not None:
            callee = pending
            pending = None
            # The relocation names the callee, or the section of a local one:
            # .text+0x91c is a call to offset 0x91c + 4.
            reloc = re.search(r"R_X86_64_(?:PLT32|PC32)\s+(.*)$", line)
            if reloc:
                callee = reloc.group(1)
                section = re.fullmatch(r"\.text\+0x([0-9a-f]+)", callee)
                if section:
                    callee = local.get(int(section.group(1), 16) + 4, callee)
                else:
                    callee = re.sub(r"[-+]0x[0-9a-f]+$", "", callee)
            if not ALLOWED.fullmatch(callee) and (name, callee) not in bad:
                bad.append((name, callee))
    return loops, bad


def main(argv):
    objects = [o for a in argv for o in a.split(";") if o]
    if not objects:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    if platform.machine() not in ("x86_64", "AMD64"):
        print("skipped: the per-level loops exist on x86-64 only")
        return 77
    if shutil.which("objdump") is None:
        print("isa_inline_check: objdump (binutils) is missing", file=sys.stderr)
        return 1
    loops, bad = 0, []
    for obj in objects:
        n, b = check(obj)
        loops += n
        bad += b
    for name, callee in bad:
        print(f"out of line in {name}:\n    calls {callee}")
    if loops == 0:
        print("isa_inline_check: no per-level loop (run_range_avx512 ...) in the objects: nothing was checked")
        return 1
    if bad:
        print(f"{len(bad)} call(s) left out of the per-level loops: mark the callee DTRAIN_ALWAYS_INLINE, "
              "or a lambda DTRAIN_LAMBDA_INLINE (core/macros.hpp)")
        return 1
    print(f"isa_inline_check: {loops} per-level loops in {len(objects)} objects, every functor inlined")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
