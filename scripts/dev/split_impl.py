#!/usr/bin/env python3
"""Maintainer tool: moves the multi-line, non-template member functions of
the non-template classes in a dtrain header into the header's .ipp file
(the Asio layout: the header declares them with DTRAIN_DECL, the .ipp
defines them, included at the header's end when DTRAIN_DEFINE_IMPL).

  scripts/dev/split_impl.py include/dtrain/backend/host/comm.hpp [Class ...] [--all-free] [--templates]

With --templates, the members of class templates move out of the class
into the header itself, right after it (so that `extern template` can keep
them out of user translation units for the instantiations dtrain::runtime
compiles).

Only what it is sure of moves: a definition in a class at namespace scope
whose signature ends with '{' on its own lines and whose body closes at the
class's indentation. Templates, constexpr, friend, deduced 'auto' returns,
requires-clauses and one-line bodies stay where they are. Free functions
marked 'inline' at namespace scope with a multi-line body move too (the
ones listed with --free NAME, or all with --all-free).
Run clang-format after it; check the build in both modes.
"""
import re
import sys
from pathlib import Path



def top_level(s):
    """(index, char) of s's characters outside brackets and template angles."""
    depth = angle = 0
    for i, c in enumerate(s):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "<":
            angle += 1
        elif c == ">":
            angle = max(0, angle - 1)
        elif depth == 0 and angle == 0:
            yield i, c


def match_paren(s, i):
    """Index of the ')' matching s[i] == '('."""
    depth = 0
    for j in range(i, len(s)):
        if s[j] in "([{":
            depth += 1
        elif s[j] in ")]}":
            depth -= 1
            if depth == 0:
                return j
    return -1


def split_params(p):
    cuts = [i for i, c in top_level(p) if c == ","]
    parts = [p[a + 1 : b] for a, b in zip([-1] + cuts, cuts + [len(p)])]
    return [x for x in parts if x.strip()]


def strip_default(param):
    for i, c in top_level(param):
        if c == "=":
            prev = param[i - 1] if i else ""
            nxt = param[i + 1] if i + 1 < len(param) else ""
            if prev not in "=!<>" and nxt != "=":
                return param[:i].rstrip()
    return param.rstrip()


def parse_signature(sig, cls, qual=None, tmpl=None):
    """(decl_text, out_of_class_head) or None. sig is the signature text up
    to but excluding the final '{'."""
    s = " ".join(sig.split())
    if any(w in s for w in ("template", "constexpr", "friend", "requires", "operator")):
        return None
    angle = 0
    lp = -1
    for idx, c in enumerate(s):
        if c == "<":
            angle += 1
        elif c == ">":
            angle -= 1
        elif c == "(" and angle == 0:
            lp = idx
            break
    m = re.search(r"(~?[A-Za-z_]\w*)\s*$", s[:lp]) if lp > 0 else None
    if not m:
        return None
    name = m.group(1)
    rp = match_paren(s, lp)
    if rp < 0:
        return None
    prefix = s[: m.start()].strip()
    params = s[lp + 1 : rp]
    tail = s[rp + 1 :].strip()
    init = ""
    # constructor initialiser list
    if tail.startswith(":") or re.match(r"^(noexcept\s*)?:", tail):
        k = tail.index(":")
        init = tail[k:]
        tail = tail[:k].strip()
    elif " : " in tail and "->" not in tail:
        k = tail.index(" : ")
        init = tail[k + 1 :]
        tail = tail[:k].strip()
    is_ctor = name == cls or name == "~" + cls
    specs = prefix
    ret = prefix
    ret = re.sub(r"\b(static|virtual|explicit|inline)\b", "", ret)
    ret = " ".join(ret.split())
    if prefix.startswith("auto") and "->" not in tail:
        return None
    if not is_ctor and not ret:
        return None
    if is_ctor and ret:
        return None
    quals = tail
    out_quals = re.sub(r"\b(override|final)\b", "", quals).strip()
    trailing = ""
    if "->" in out_quals:
        return None
    out_params = ", ".join(strip_default(p.strip()) for p in split_params(params))
    attrs = ""
    ma = re.match(r"^((?:\[\[[^\]]*\]\]\s*)+)(.*)$", specs)
    if ma:
        attrs, specs = ma.group(1).strip() + " ", ma.group(2).strip()
        ret = re.sub(r"\[\[[^\]]*\]\]\s*", "", ret).strip()
    decl = (attrs + "DTRAIN_DECL " + (specs + " " if specs else "") + name + "(" + params + ")" + (" " + quals if quals else "") + ";")
    q = qual or cls
    lead = (tmpl + "\n") if tmpl else "DTRAIN_DECL "
    if tmpl:
        decl = decl.replace("DTRAIN_DECL ", "", 1)
    if is_ctor:
        head = lead + q + "::" + name + "(" + out_params + ")" + (" " + out_quals if out_quals else "")
        if init:
            head += " " + init
    else:
        head = (lead + "auto " + q + "::" + name + "(" + out_params + ")" + (" " + out_quals if out_quals else "") +
                " -> " + ret)
    return decl, head


def continues(lines, i):
    """Whether line i continues a declaration begun above it (a template
    header or requires-clause)."""
    j = i - 1
    while j >= 0 and not lines[j].strip():
        return False
    if j < 0:
        return False
    prev = lines[j].strip()
    if prev.startswith("//"):
        return False
    return not (prev.endswith(";") or prev.endswith("}") or prev.endswith("{") or prev.endswith(":"))


def process(path, classes, all_free, free_names, templates=False):
    text = Path(path).read_text()
    lines = text.split("\n")
    out = []
    impl = []  # (namespace path, text)
    ns = []
    i = 0
    cls = None
    cls_indent = None
    moved = []
    pp = 0
    after = []
    cls_tmpl = cls_qual = None
    while i < len(lines):
        line = lines[i]
        if re.match(r"^\s*#\s*if", line):
            pp += 1
        elif re.match(r"^\s*#\s*endif", line):
            pp -= 1
        if pp > 0:
            out.append(line)
            i += 1
            continue
        mns = re.match(r"^namespace (\w+(?:::\w+)*) \{", line)
        if mns and cls is None:
            ns.append(mns.group(1))
            out.append(line)
            i += 1
            continue
        if re.match(r"^\}  // namespace", line) and cls is None:
            ns.pop()
            out.append(line)
            i += 1
            continue
        mc = re.match(r"^(class|struct) (\w+)(?: final)?(?: : [^{]*)? \{$", line)
        if mc and cls is None:
            tmpl = qual = None
            if i > 0 and lines[i - 1].startswith("template <"):
                if not templates:
                    out.append(line)
                    i += 1
                    continue
                params = lines[i - 1][len("template <"):].rstrip()
                if not params.endswith(">"):
                    out.append(line)
                    i += 1
                    continue
                params = params[:-1]
                parts = [strip_default(x.strip()) for x in split_params(params)]
                names = [x.split()[-1].lstrip(".") for x in parts]
                tmpl = "template <" + ", ".join(parts) + ">"
                qual = mc.group(2) + "<" + ", ".join(names) + ">"
            if not classes or mc.group(2) in classes:
                cls = mc.group(2)
                cls_tmpl, cls_qual = tmpl, qual
                after = []
            out.append(line)
            i += 1
            continue
        if cls is not None and line == "};":
            cls = None
            out.append(line)
            if after:
                out.append("")
                out.extend(after[:-1])
                after = []
            i += 1
            continue
        if cls is not None and re.match(r"^  [A-Za-z~\[]", line) and not line.startswith("  template") \
                and not re.match(r"^  (public|private|protected):", line) \
                and not re.match(r"^  (struct|class|enum|union|using|typedef|static_assert|friend)\b", line) \
                and not continues(lines, i):
            # gather signature lines until one ends with '{' (or ';' -> not a definition)
            j = i
            sig_lines = []
            ok = False
            while j < len(lines) and j < i + 8:
                sig_lines.append(lines[j])
                st = lines[j].rstrip()
                if st.endswith(";") or st.endswith("}") or "//" in st:
                    break
                if st.endswith("{"):
                    ok = True
                    break
                j += 1
            if ok and sig_lines[-1].rstrip().endswith("{") and not sig_lines[-1].rstrip().endswith("= {"):
                # body: until a line == "  }" at class indent
                k = j + 1
                while k < len(lines) and lines[k] != "  }" and not lines[k].startswith("};"):
                    k += 1
                if k < len(lines) and lines[k] == "  }" and k > j + 1:
                    sig = "\n".join(sig_lines).rstrip()[:-1]
                    parsed = parse_signature(sig, cls, cls_qual, cls_tmpl)
                    if parsed:
                        decl, head = parsed
                        out.append("  " + decl)
                        body = [l[2:] if l.startswith("  ") else l for l in lines[j + 1 : k]]
                        text = head + " {\n" + "\n".join(body) + "\n}"
                        if cls_tmpl:
                            after.extend(text.split("\n") + [""])
                        else:
                            impl.append((list(ns), text + "\n"))
                        moved.append(cls + "::" + re.search(r"(~?\w+)\s*\(", " ".join(sig.split())).group(1))
                        i = k + 1
                        continue
            out.append(line)
            i += 1
            continue
        # free inline functions at namespace scope
        mf = re.match(r"^inline (?!constexpr)(.*)\{$", line)
        if cls is None and mf and (all_free or any(re.search(r"\b" + n + r"\(", line) for n in free_names)):
            k = i + 1
            while k < len(lines) and lines[k] != "}":
                k += 1
            if k < len(lines) and not continues(lines, i):
                sig = line[len("inline "):].rstrip()[:-1].rstrip()
                params_start = sig.index("(")
                rp = match_paren(sig, params_start)
                if rp > 0:
                    params = sig[params_start + 1 : rp]
                    out_params = ", ".join(strip_default(p.strip()) for p in split_params(params))
                    if "::" not in sig[:params_start].split()[-1]:
                        out.append("DTRAIN_DECL " + sig + ";")
                    impl.append((list(ns), "DTRAIN_DECL " + sig[:params_start + 1] + out_params + sig[rp:] + " {\n" +
                                 "\n".join(lines[i + 1 : k]) + "\n}\n"))
                    moved.append(re.search(r"(\w+)\s*\(", sig).group(1))
                    i = k + 1
                    continue
        out.append(line)
        i += 1
    if not impl:
        Path(path).write_text("\n".join(out))
        print(path, ": moved", len(moved), "(templates, in the header):", ", ".join(moved))
        return
    ipp = Path(path).with_suffix(".ipp")
    header_name = Path(path).name
    rel = str(Path(path)).split("include/", 1)[1]
    prev = ipp.read_text() if ipp.exists() else None
    parts = []
    if prev is None:
        parts.append("// The definitions " + header_name + " declares with DTRAIN_DECL: included at the\n"
                     "// end of the header when DTRAIN_DEFINE_IMPL (core/macros.hpp), so they are\n"
                     "// compiled into every user translation unit (header-only) or once, into\n"
                     "// dtrain::runtime (separate compilation).\n#pragma once\n\n#include \"" + rel + "\"\n")
    else:
        parts.append(prev.rstrip("\n") + "\n")
    cur = None
    for nsp, t in impl:
        if nsp != cur:
            if cur:
                for n in reversed(cur):
                    parts.append("}  // namespace " + n + "\n")
            for n in nsp:
                parts.append("\nnamespace " + n + " {\n")
            cur = nsp
        parts.append("\n" + t)
    if cur:
        for n in reversed(cur):
            parts.append("}  // namespace " + n + "\n")
    ipp.write_text("".join(parts))
    res = "\n".join(out)
    inc = "#if DTRAIN_DEFINE_IMPL\n#include \"" + rel[:-4] + ".ipp\"\n#endif\n"
    if inc not in res:
        res = res.rstrip("\n") + "\n\n" + inc
    Path(path).write_text(res)
    print(path, ": moved", len(moved), ":", ", ".join(moved))


if __name__ == "__main__":
    args = sys.argv[1:]
    all_free = "--all-free" in args
    free_names = []
    templates = False
    rest = []
    it = iter(args)
    for a in it:
        if a == "--all-free":
            continue
        if a == "--templates":
            templates = True
            continue
        if a == "--free":
            free_names.append(next(it))
            continue
        rest.append(a)
    process(rest[0], set(rest[1:]), all_free, free_names, templates)
