#!/usr/bin/env python3
"""Doxygen INPUT_FILTER for dtrain's headers (docs/api/Doxyfile).

dtrain documents its public headers with plain `//` comments written as
sentences, above what they describe or at the end of its line. Doxygen reads
only `///`-style comments, so this filter turns, on the fly and without
touching the sources:
  - the comment block at the top of a header (after #pragma once) into the
    file's description;
  - a comment block directly above a declaration into its description;
  - a trailing `// ...` after a member into a member description (`///<`).
Comments inside function bodies stay plain. Characters Doxygen would read as
commands, HTML or links (\\ @ < > & # % $ ::) are escaped, so prose such as
`<rank>:<n>` is shown as written. The line count never changes, so Doxygen's
line numbers still point into the real file.
"""
import re
import sys

ESCAPE = re.compile(r'([\\@<>&#%$])')


def prose(text):
    # Inline code between backticks is left to Doxygen's Markdown.
    parts = text.split('`')
    # `::` starts an explicit link in Doxygen; `\\::` writes it as text.
    return '`'.join(p if i % 2 else ESCAPE.sub(r'\\\1', p).replace('::', '\\::') for i, p in enumerate(parts))


def main(path):
    with open(path, encoding='utf-8') as f:
        lines = f.read().split('\n')
    out = []
    depth = 0          # brace depth outside namespaces and classes is what matters
    body_depth = []    # depths at which a function body was opened
    seen_code = False
    described = False  # the file's description was written
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        in_body = bool(body_depth)
        if stripped.startswith('//') and not stripped.startswith('///') and not in_body:
            # A block of comment lines.
            j = i
            while j < len(lines) and lines[j].strip().startswith('//') and not lines[j].strip().startswith('///'):
                j += 1
            block = lines[i:j]
            nxt = lines[j].strip() if j < len(lines) else ''
            if not seen_code and not described:
                # The header's own description. `\\file` ends with its
                # comment, so the text follows on the same line.
                first = True
                for b in block:
                    indent, text = b.split('//', 1)
                    out.append(indent + ('/** \\file */ /// ' if first else '/// ') + prose(text.strip()))
                    first = False
                described = True
            elif not seen_code:
                out.extend(block)
            elif nxt and not nxt.startswith('#') and not nxt.startswith('}') and nxt != '':
                for b in block:
                    indent, text = b.split('//', 1)
                    out.append(indent + '/// ' + prose(text.strip()))
            else:
                out.extend(block)
            i = j
            continue
        if stripped and not stripped.startswith('#') and not stripped.startswith('//'):
            seen_code = True
        # A trailing comment on a declaration line outside function bodies.
        code = line
        m = re.match(r'^(.*?;)\s+//\s?(.*)$', line)
        if m and not in_body and '"' not in m.group(1):
            code = m.group(1) + '  ///< ' + prose(m.group(2))
        out.append(code)
        # Track function bodies: an opening brace on a line that is not a
        # namespace, class, struct, enum or union opens a body.
        opens = line.count('{')
        closes = line.count('}')
        if opens > closes and not re.match(r'^\s*(namespace|class|struct|enum|union|template|extern)\b', stripped) \
                and not re.search(r'\b(class|struct|union|enum)\b[^;()]*\{', line):
            body_depth.append(depth)
        depth += opens - closes
        while body_depth and depth <= body_depth[-1]:
            body_depth.pop()
        i += 1
    sys.stdout.write('\n'.join(out))


if __name__ == '__main__':
    main(sys.argv[1])
