"""Every figure in the docs' prose, checked by value against the results file it comes from.

A figure is a number with the unit of a time, rate, size, ratio or share ("1.15x",
"25.0 GB/s", "+2.4%", "130 ms", "64 MiB", "3.2 min"), or a range of them
("1.10-1.34x"), or a number in a hand-written table's column whose header names
such a unit. Each paragraph, list or hand-written table that holds figures
carries one comment saying where they come from:

    <!-- source: setting -->            not measurements: goals, sizes, options,
                                        arithmetic on them
    <!-- source: history -->            measured by a run whose results are not kept
                                        (maintainers' pages under docs/dev/ only)
    <!-- source: training.json
      66.2 GB/s = adamw.results[elements=10000000].stream.gbps
      1.09x = adamw.results[elements=10000000].peer_fused.ms / adamw.results[elements=10000000].dtrain.ms
      1.10-1.34x = min(runs[*].ratio), max(runs[*].ratio)
      setting: 1.2x 280 MB
    -->

When a results file is named, every figure of the block is either given an
expression on a line `FIGURE = EXPRESSION`, or listed on a `setting:` (or, on
maintainers' pages, `history:`) line; the expression's value, rounded as the
figure is printed, must be the figure. An expression is arithmetic (+ - * /,
parentheses; spaces around a minus) over numbers, the functions in FUNCTIONS,
and paths into the file:

    key.key[3].key          a member, an element (negative counts from the end)
    list[field=value,f2=v]  the first element whose fields have these values
    list[*].key             every element (a list: give it to min, max, ...)
    ["key with spaces"]     a member whose name is not a plain word
    other.json:key          a path into another file the comment names

So a changed figure, a changed results file or a figure added without its
source fails the docs test (bench/docs_tables.py --check), naming the line.
"""

import ast
import json
import math
import os
import re
import statistics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results")

_UNIT = r"(?:x|\s?(?:%|ms|us|ns|s|min|GB/s|MB/s|GiB/s|MiB|GiB|KiB|MB|GB|kB))"
_NUMBER = r"\d[\d,]*(?:\.\d+)?"
# One figure or a range of two ("1.10-1.34x", "16-29 min"); not inside a word,
# a path, a version or an anchor.
FIGURE = re.compile(rf"(?<![\w.#/-])[-+]?{_NUMBER}(?:[-–]{_NUMBER})?{_UNIT}(?![\w/])")
SOURCE = re.compile(r"<!--\s*source:(.*?)-->", re.S)
KINDS = ("history", "setting")
FUNCTIONS = {"min": min, "max": max, "sum": sum, "len": len, "abs": abs, "round": round,
             "mean": statistics.fmean, "median": statistics.median}
# A hand-written table's column holds figures when its header names a unit.
_HEADER_UNIT = re.compile(r"(?:^|[\s(])(ms|us|s|min|GB/s|MB/s|MiB|GiB|MB|GB|x|%)(?:\)|$|\s)")
_CELL_NUMBER = re.compile(rf"^\**([-+]?{_NUMBER})\**$")


def normal(figure):
    """A figure's text without spaces and with one kind of dash: how mappings are matched."""
    return re.sub(r"\s+", "", figure).replace("–", "-")


def parse_figure(figure):
    """'1.10-1.34x' -> [(1.10, 2), (1.34, 2)]; '+5.0%' -> [(5.0, 1)]: values and decimals."""
    text = normal(figure)
    body = re.match(rf"[-+]?{_NUMBER}(?:-{_NUMBER})?", text).group(0)
    sign = -1.0 if body.startswith("-") else 1.0
    parts = re.findall(_NUMBER, body)
    out = []
    for i, p in enumerate(parts):
        p = p.replace(",", "")
        decimals = len(p.split(".")[1]) if "." in p else 0
        out.append(((sign if i == 0 else 1.0) * float(p), decimals))
    return out


class ExpressionError(Exception):
    pass


def _select(items, selector):
    """One step of a path on a list or dict: an index, *, a quoted key, or field=value filters."""
    sel = selector.strip()
    if sel == "*":
        if not isinstance(items, list):
            raise ExpressionError(f"[*] on a {type(items).__name__}, not a list")
        return items, True
    if re.fullmatch(r"-?\d+", sel):
        if not isinstance(items, list):
            raise ExpressionError(f"[{sel}] on a {type(items).__name__}, not a list")
        try:
            return items[int(sel)], False
        except IndexError:
            raise ExpressionError(f"[{sel}]: the list has {len(items)} elements") from None
    quoted = re.fullmatch(r"\"([^\"]*)\"|'([^']*)'", sel)
    if quoted:
        return _member(items, quoted.group(1) if quoted.group(1) is not None else quoted.group(2)), False
    if not isinstance(items, list):
        raise ExpressionError(f"[{sel}] on a {type(items).__name__}, not a list")
    tests = []
    for cond in sel.split(","):
        key, eq, want = cond.partition("=")
        if not eq:
            raise ExpressionError(f"[{sel}]: a selector is an index, *, a quoted key or field=value")
        tests.append((key.strip(), want.strip()))
    for item in items:
        if all(_matches(_field(item, k), v) for k, v in tests):
            return item, False
    raise ExpressionError(f"no element with {sel}")


def _field(item, dotted):
    for key in dotted.split("."):
        if not isinstance(item, dict) or key not in item:
            return None
        item = item[key]
    return item


def _matches(value, want):
    if value is None:
        return want in ("null", "None")
    if isinstance(value, bool):
        return want.lower() == str(value).lower()
    if isinstance(value, (int, float)):
        try:
            return float(want) == float(value)
        except ValueError:
            return False
    return str(value) == want


def _member(item, key):
    if not isinstance(item, dict):
        raise ExpressionError(f"'{key}' asked of a {type(item).__name__}, not an object")
    if key not in item:
        known = ", ".join(list(item)[:12])
        raise ExpressionError(f"no member '{key}' (members: {known}{', ...' if len(item) > 12 else ''})")
    return item[key]


_PATH = re.compile(r"(?:(?P<file>[\w.-]+\.json):)?(?:(?P<head>[A-Za-z_][\w-]*)|(?=\[))"
                   r"(?P<rest>(?:\.[A-Za-z_][\w-]*|\[[^\]]*\])*)")


def resolve(path_match, files, default):
    """The value (or, after [*], the list of values) a path names."""
    name = path_match.group("file") or default
    if name is None:
        raise ExpressionError(f"'{path_match.group(0)}': several files are named: prefix the path with FILE.json:")
    if name not in files:
        raise ExpressionError(f"'{name}' is not among the files the source names ({', '.join(files)})")
    current, many = [files[name]], False
    head = path_match.group("head")
    steps = ([("key", head)] if head else []) + [
        ("key", m.group(1)) if m.group(1) else ("sel", m.group(2))
        for m in re.finditer(r"\.([A-Za-z_][\w-]*)|\[([^\]]*)\]", path_match.group("rest"))]
    for kind, arg in steps:
        nxt = []
        for value in current:
            if kind == "key":
                nxt.append(_member(value, arg))
            else:
                got, fan = _select(value, arg)
                if fan:
                    nxt.extend(got)
                    many = True
                else:
                    nxt.append(got)
        current = nxt
    return current if many else current[0]


def evaluate(expr, files, default):
    """The value of an expression: a number, or a tuple of two for a range."""
    values, out, i = [], [], 0
    while i < len(expr):
        c = expr[i]
        if c.isspace() or c in "+-*/(),":
            out.append(c)
            i += 1
            continue
        num = re.match(r"\d+(?:\.\d+)?(?:[eE][-+]?\d+)?", expr[i:])
        if num:
            out.append(num.group(0))
            i += len(num.group(0))
            continue
        m = _PATH.match(expr, i)
        if not m or not m.group(0):
            raise ExpressionError(f"cannot read '{expr[i:]}'")
        if expr[m.end():].lstrip().startswith("(") and not m.group("file") and not m.group("rest"):
            if m.group("head") not in FUNCTIONS:
                raise ExpressionError(f"no function '{m.group('head')}' ({', '.join(FUNCTIONS)})")
            out.append(m.group("head"))
        else:
            values.append(resolve(m, files, default))
            out.append(f"_v[{len(values) - 1}]")
        i = m.end()
    try:
        tree = ast.parse("".join(out), mode="eval")
    except SyntaxError as e:
        raise ExpressionError(f"not an expression: {e.msg}") from None
    return _eval(tree.body, values)


def _eval(node, values):
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "_v":
        return values[node.slice.value]
    if isinstance(node, ast.Tuple):
        return tuple(_eval(e, values) for e in node.elts)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _number(_eval(node.operand, values))
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
        a, b = _number(_eval(node.left, values)), _number(_eval(node.right, values))
        if isinstance(node.op, ast.Add):
            return a + b
        if isinstance(node.op, ast.Sub):
            return a - b
        if isinstance(node.op, ast.Mult):
            return a * b
        if b == 0:
            raise ExpressionError("division by zero")
        return a / b
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FUNCTIONS:
        name, args = node.func.id, [_eval(a, values) for a in node.args]
        if name == "round":
            return round(_number(args[0]), *(int(_number(a)) for a in args[1:]))
        if len(args) == 1 and isinstance(args[0], list):
            args = args[0]
        if name == "len":
            return len(args)
        args = [_number(a) for a in args]
        if name == "abs":
            return abs(*args)
        if not args:
            raise ExpressionError(f"{name}() of nothing")
        return FUNCTIONS[name](args)
    raise ExpressionError(f"'{ast.unparse(node)}' is not allowed in an expression")


def _number(v):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ExpressionError(f"{'a list of ' + str(len(v)) + ' values' if isinstance(v, list) else repr(v)} "
                              "where a number belongs (min, max, median, mean, sum or len make one of a list)")
    return float(v)


def agrees(figure, value):
    """Whether `value` (a number, or a pair for a range) prints as `figure`."""
    printed = parse_figure(figure)
    got = list(value) if isinstance(value, tuple) else [value]
    if len(got) != len(printed):
        return False
    for (p, decimals), v in zip(printed, got):
        v = _number(v)
        if not math.isfinite(v) or abs(v - p) > 0.5 * 10 ** -decimals + 1e-9 * max(1.0, abs(p)):
            return False
    return True


def shown(value):
    if isinstance(value, tuple):
        return " .. ".join(shown(v) for v in value)
    return f"{value:.6g}" if isinstance(value, float) else str(value)


class Source:
    """One `<!-- source: ... -->` comment: the files and kinds it names, its
    figure expressions, and the figures it lists as settings or history."""

    def __init__(self, text):
        lines = [ln.strip() for ln in text.strip().split("\n")]
        self.names = [n.strip() for n in lines[0].split(",") if n.strip()]
        self.files = [n for n in self.names if n not in KINDS]
        self.kinds = {n for n in self.names if n in KINDS}
        self.mappings = {}   # normal(figure) -> (figure, expression)
        self.listed = {}     # normal(figure) -> kind
        self.problems = []
        for line in lines[1:]:
            if not line:
                continue
            kind, colon, rest = line.partition(":")
            if colon and kind.strip() in KINDS and "=" not in kind:
                figures = FIGURE.findall(rest)
                if not figures:
                    self.problems.append(f"'{line}': no figure listed")
                for f in figures:
                    self.listed[normal(f)] = kind.strip()
                continue
            left, eq, right = line.partition("=")
            figures = FIGURE.findall(left)
            if not eq or len(figures) != 1 or normal(figures[0]) != normal(left):
                self.problems.append(f"'{line}': a line is 'FIGURE = EXPRESSION', 'setting: FIGURES' or "
                                     "'history: FIGURES'")
                continue
            self.mappings[normal(figures[0])] = (figures[0], right.strip())


def table_figures(block):
    """Numbers in a hand-written table's columns whose header names a unit, as figures ('34.86 ms')."""
    out = []
    for i in range(len(block) - 1):
        if not (block[i].startswith("|") and re.match(r"^\|[\s:|-]+\|$", block[i + 1].strip())):
            continue
        header = [c.strip() for c in block[i].strip().strip("|").split("|")]
        units = []
        for cell in header:
            m = _HEADER_UNIT.search(re.sub(r"`[^`]*`", "", cell))
            units.append(m.group(1) if m else None)
        for row in block[i + 2:]:
            if not row.startswith("|"):
                break
            for unit, cell in zip(units, (c.strip() for c in row.strip().strip("|").split("|"))):
                m = _CELL_NUMBER.match(cell)
                if unit and m:
                    out.append(m.group(1) + ("" if unit in ("x", "%") else " ") + unit)
    return out


def block_figures(block):
    text = "\n".join(block)
    prose = re.sub(r"<!--.*?-->|`[^`]*`|\]\([^)]*\)", "", text, flags=re.S)
    return FIGURE.findall(prose) + table_figures(block)


def load_results(name, cache):
    if name not in cache:
        path = os.path.join(RESULTS, name)
        try:
            with open(path) as f:
                cache[name] = json.load(f)
        except FileNotFoundError:
            cache[name] = FileNotFoundError(f"no file bench/results/{name}")
        except json.JSONDecodeError as e:
            cache[name] = e
    return cache[name]


def check_block(where, block, user_page, cache):
    """The problems of one block's figures against its source."""
    text = "\n".join(block)
    figures = block_figures(block)
    sources = [Source(s) for s in SOURCE.findall(text)]
    problems = []
    if not sources:
        if figures:
            problems.append(f"{where}: {', '.join(dict.fromkeys(' '.join(f.split()) for f in figures))} without a source: add "
                            "<!-- source: FILE.json with a line 'FIGURE = PATH' per figure -->, or setting")
        return problems
    if len(sources) > 1:
        return [f"{where}: one <!-- source: --> per paragraph, list or table (this one has {len(sources)})"]
    src = sources[0]
    problems += [f"{where}: source: {p}" for p in src.problems]
    files = {}
    for name in src.files:
        data = load_results(name, cache)
        if isinstance(data, Exception):
            problems.append(f"{where}: source '{name}' is neither a file in bench/results/ nor one of "
                            f"{', '.join(KINDS)} ({data})")
        else:
            files[name] = data
    if user_page and ("history" in src.kinds or "history" in src.listed.values()):
        problems.append(f"{where}: 'history' figures belong on maintainers' pages (docs/dev/): on a user page a "
                        "measured figure comes from a file in bench/results/, checked by value")
    if not src.files:
        if src.mappings:
            problems.append(f"{where}: figure expressions, but no results file named in the source")
        return problems
    seen = set()
    default = src.files[0] if len(src.files) == 1 else None
    for figure in dict.fromkeys(" ".join(f.split()) for f in figures):
        key = normal(figure)
        seen.add(key)
        if key in src.listed:
            continue
        if key not in src.mappings:
            problems.append(f"{where}: {figure}: give it a line '{figure} = PATH' in the source comment (the "
                            "results field it comes from), or list it on a 'setting:' line")
            continue
        expr = src.mappings[key][1]
        if len(files) != len(src.files):
            continue
        try:
            value = evaluate(expr, files, default)
        except ExpressionError as e:
            problems.append(f"{where}: {figure} = {expr}: {e}")
            continue
        if not agrees(figure, value):
            problems.append(f"{where}: {figure} is not what {src.files[0] if default else 'its files'} says: "
                            f"{expr} = {shown(value)}")
    for key, (figure, _) in src.mappings.items():
        if key not in seen:
            problems.append(f"{where}: the source gives '{figure}', which the text no longer prints")
    for key in src.listed:
        if key not in seen:
            problems.append(f"{where}: the source lists '{key}', which the text no longer prints")
    return problems
