"""The imports between the modules of a Rust crate's src/, read from the source text (no
compiler): the half of scripts/check-layers that parses. See that script for what it checks.

An import is any path that names a module of the crate: `use` trees (groups, renames, globs),
inline `crate::`, `$crate::`, `super::` and `self::` paths (spaces, comments and `r#` allowed
between the parts), a declared child's name, a string in an attribute that is such a path
(`#[serde(with = "crate::x")]`), and a call of a macro that another file defines. Comments,
strings and `#[cfg(test)]` items are not read (test code may use anything). What the check
cannot follow is a problem of its own: `include!`, `extern crate self`, a path built from a
macro argument (`crate::$m::X`), a file of src/ that no `mod` declares."""

import bisect
import os
import re
from collections import defaultdict

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
SEP = r"\s*::\s*"
ITEM_KEYWORDS = r"(?:mod|fn|impl|struct|enum|trait|use|type|const|static|union|macro_rules!)"
QUALIFIERS = r'(?:(?:pub(?:\s*\([^)]*\))?|unsafe|async|const|default|extern(?:\s*"[^"]*")?)\s+)*'
PATH_STRING = re.compile(r"(?:crate|self|super)(?:::" + IDENT + r")+")
FACADES = {"lib.rs", "backend.rs"}


def blank(s):
    return re.sub(r"[^\n]", " ", s)


def strip(text):
    """The text with comments, strings and char literals blanked (lengths kept), and the strings
    that are whole crate paths ((offset, path) pairs: attributes such as serde's `with`)."""
    out, paths, i, n = [], [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
            continue
        if text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(blank(text[i:j]))
            i = j
            continue
        raw = re.compile(r'(?<![\w])[bc]?r(#*)"').match(text, i) if c in "bcr" else None
        if raw:
            end = text.find('"' + raw.group(1), raw.end())
            j = n if end < 0 else end + 1 + len(raw.group(1))
            out.append(blank(text[i:j]))
            i = j
            continue
        if c == '"' or (c in "bc" and text.startswith('"', i + 1) and not re.match(r"\w", text[i - 1 : i] or " ")):
            start = i + 1 if c == '"' else i + 2
            j = start
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            if PATH_STRING.fullmatch(text[start:j]):
                paths.append((i, text[start:j]))
            out.append(blank(text[i : j + 1]))
            i = j + 1
            continue
        ch = re.compile(r"b?'(\\.|[^\\'])'|b?'\\u\{[0-9a-fA-F]+\}'|b?'\\x[0-9a-fA-F]{2}'").match(text, i)
        if c in "'b" and ch and (i == 0 or not re.match(r"\w", text[i - 1])):
            out.append(" " * len(ch.group(0)))
            i += len(ch.group(0))
            continue
        out.append(c)
        i += 1
    code = "".join(out)
    # `r#ident` is `ident`.
    return re.sub(r"(?<![\w#])r#(?=[A-Za-z_])", "  ", code), paths


def item_end(text, at):
    """The end of the item whose keyword is at `at`: its `;` or its block, at depth 0."""
    depth, i = 0, at
    while i < len(text):
        ch = text[i]
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == ";" and depth <= 0:
            return i + 1
        elif ch == "{" and depth <= 0:
            return block_end(text, i)
        i += 1
    return i


def block_end(text, at):
    """The offset just past the block whose `{` is the first at or after `at`."""
    depth, i = 0, text.index("{", at)
    while i < len(text):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
        if depth == 0:
            break
    return i


def only_with_test(expr):
    """Whether a `cfg(...)` predicate holds only under test: `test`, or `all(...)` with `test`
    among its arguments."""
    expr = expr.strip()
    if expr == "test":
        return True
    m = re.fullmatch(r"all\s*\((.*)\)", expr, re.S)
    if not m:
        return False
    args, depth, cur = [], 0, ""
    for ch in m.group(1):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            args.append(cur)
            cur = ""
        else:
            cur += ch
    args.append(cur)
    return any(only_with_test(a) for a in args)


def without_tests(text):
    """The text with its test-only items blanked (an attribute `#[cfg(test)]` or
    `#[cfg(all(test, ...))]` on an item: a module, a function, an impl, ...). On anything but an
    item (a field, a parameter, a match arm) nothing is blanked."""
    for m in reversed(list(re.finditer(r"#\[\s*cfg\s*\(", text))):
        depth, j = 0, m.end() - 1
        while j < len(text):
            depth += {"(": 1, ")": -1}.get(text[j], 0)
            if depth == 0:
                break
            j += 1
        if not only_with_test(text[m.end() : j]):
            continue
        rest = re.compile(r"\s*\]\s*(?:#\[[^\]]*\]\s*)*" + QUALIFIERS + ITEM_KEYWORDS).match(text, j + 1)
        if not rest:
            continue
        end = item_end(text, rest.end())
        text = text[: m.start()] + blank(text[m.start() : end]) + text[end:]
    return text


def depth_zero(text):
    """A function telling whether an offset of `text` is outside every brace block."""
    marks, depth = [], 0
    for i, ch in enumerate(text):
        if ch in "{}":
            depth += 1 if ch == "{" else -1
            marks.append((i, depth))
    keys = [i for i, _ in marks]

    def at(offset):
        k = bisect.bisect_right(keys, offset) - 1
        return k < 0 or marks[k][1] == 0

    return at


class Module:
    """One file of src/: its module path, text (comments, strings and test items blanked),
    children, the names it defines and imports, and the paths it names."""

    def __init__(self, src, path, file, test=False):
        self.path, self.file, self.test = path, file, test
        self.raw = open(os.path.join(src, file), encoding="utf-8").read()
        code, self.path_strings = strip(self.raw)
        self.code = code  # test items kept: for finding `mod` declarations
        self.text = without_tests(code)
        self.inline = [
            (m.start(), block_end(self.text, m.start()))
            for m in re.finditer(r"\bmod\s+\$?" + IDENT + r"\s*\{", self.text)
        ]
        top = depth_zero(self.text)
        self.defined = {
            a or b for a, b, at in ((m.group(1), m.group(2), m.start()) for m in re.finditer(
                r"(?<!')\b(?:fn|struct|enum|trait|type|const|static|union|mod)\s+(" + IDENT + r")|macro_rules!\s*(" + IDENT + r")",
                self.text)) if top(at)
        }
        self.macros = set(re.findall(r"macro_rules!\s*(" + IDENT + r")", self.text))
        self.children = {}  # name -> module path, declared with `mod name;`
        self.imports = defaultdict(list)  # name -> absolute paths it imports (`use`, any visibility)
        self.globs = []  # absolute module paths imported with `*`
        self.uses = []  # (absolute path, line) of every path it names
        self.problems = []

    @property
    def is_dir_root(self):
        return self.file.endswith("mod.rs") or self.file == "lib.rs"

    def line(self, offset):
        return self.raw.count("\n", 0, offset) + 1


def declared_children(mod):
    """`mod name;` declarations of `mod`: (name, candidate files, test-only)."""
    base = os.path.dirname(mod.file) if mod.is_dir_root else mod.file[: -len(".rs")]
    here = os.path.dirname(mod.file)
    decl = re.compile(r"((?:#\[[^\]]*\]\s*)*)" + QUALIFIERS + r"mod\s+(" + IDENT + r")\s*;")
    for m in decl.finditer(mod.code):
        name = m.group(2)
        attrs = mod.raw[m.start(1) : m.end(1)]
        paths = re.findall(r'\bpath\s*=\s*"([^"]+)"', attrs)
        if paths:
            cands = ([os.path.normpath(os.path.join(base if mod.is_dir_root else here, p)) for p in paths], True)
        else:
            cands = ([os.path.join(base, name + ".rs"), os.path.join(base, name, "mod.rs")], False)
        test = mod.text[m.start(2) : m.end(2)].strip() == ""
        yield name, cands, test


def parse(src):
    """Every module of the crate under `src`, by module path; and the files of src/ no module
    declares."""
    mods, seen = {}, set()

    def visit(path, file, test):
        if file in seen:
            mods[path[:-1]].problems.append(f"src/{file} is declared as a module twice (the second time as {'::'.join(path)})")
            return
        mod = Module(src, path, file, test)
        mods[path] = mod
        seen.add(file)
        for name, (cands, chosen), child_test in declared_children(mod):
            found = [c for c in cands if os.path.exists(os.path.join(src, c))]
            if not found:
                mod.problems.append(f"src/{file} declares `mod {name};` and no file for it was found")
                continue
            mod.children[name] = path + (name,)
            # `#[path]` (or several, under `cfg_attr`): every file named; else the first found.
            for i, c in enumerate(found if chosen else found[:1]):
                visit(path + ((name,) if i == 0 else (f"{name}#{i}",)), c, test or child_test)

    visit((), "lib.rs", False)
    files = {
        os.path.relpath(os.path.join(d, f), src)
        for d, _, fs in os.walk(src)
        for f in fs
        if f.endswith(".rs")
    }
    collect(mods)
    return mods, sorted(files - seen)


def use_trees(text):
    """Every `use` declaration's expanded paths: (segments, alias, glob, offset)."""
    for m in re.finditer(r"\buse\s+([^;]*);", text):
        tokens = re.findall(r"::|[{},*]|\$?" + IDENT, m.group(1))
        pos = 0

        def tree(prefix):
            nonlocal pos
            out, segs = [], list(prefix)
            while pos < len(tokens):
                t = tokens[pos]
                if t == "::":
                    pos += 1
                elif t == "{":
                    pos += 1
                    while pos < len(tokens) and tokens[pos] != "}":
                        out += tree(segs)
                        if pos < len(tokens) and tokens[pos] == ",":
                            pos += 1
                    pos += 1
                    return out
                elif t == "*":
                    pos += 1
                    out.append((segs, None, True))
                    return out
                elif t in (",", "}"):
                    break
                elif t == "as":
                    alias = tokens[pos + 1] if pos + 1 < len(tokens) else None
                    pos += 2
                    out.append((segs, alias, False))
                    return out
                else:
                    segs = segs + [t]
                    pos += 1
            if segs != list(prefix):
                out.append((segs, None, False))
            return out

        for segs, alias, glob in tree([]):
            yield segs, alias, glob, m.start()


def absolute(mod, segs, at=0):
    """`segs` (written at offset `at` of `mod`) as a path from the crate root, or None where it
    names nothing of the crate."""
    segs = ["crate" if s == "$crate" else s for s in segs]
    if not segs:
        return None
    # Inside inline modules `self` is the innermost and each `super` leaves one of them first.
    depth = sum(1 for a, b in mod.inline if a <= at < b)
    if depth and segs[0] in ("self", "super"):
        if segs[0] == "self":
            segs = segs[1:]
            if not segs or segs[0] != "super":
                return tuple(mod.path)
        while depth and segs and segs[0] == "super":
            segs, depth = segs[1:], depth - 1
        if depth or not segs:
            return tuple(mod.path)
        if segs[0] not in ("self", "super", "crate"):
            return tuple(mod.path) + tuple(segs) if segs[0] in mod.children else tuple(mod.path)
    if segs[0] == "crate":
        return tuple(segs[1:])
    here = list(mod.path)
    if segs[0] in ("self", "super"):
        while segs and segs[0] in ("self", "super"):
            if segs[0] == "super":
                if not here:
                    return None
                here.pop()
            segs = segs[1:]
        return tuple(here + segs)
    if segs[0] in mod.children:
        return tuple(here + segs)
    return None


def collect(mods):
    """Fills every module's imports, globs and uses."""
    macro_files = defaultdict(set)
    for mod in mods.values():
        for name in mod.macros:
            macro_files[name].add(mod.path)
    for mod in mods.values():
        if mod.test:
            continue
        text = mod.text
        for bad, why in (
            (r"\binclude\s*!", "`include!` (the check cannot read what it includes)"),
            (r"\bextern\s+crate\s+self\b", "`extern crate self` (a second name for the crate the check does not follow)"),
            (r"(?<![\w:])\$?(?:crate|self|super)" + SEP + r"\$", "a path built from a macro argument (the check cannot follow it)"),
        ):
            for m in re.finditer(bad, text):
                mod.problems.append(f"src/{mod.file}:{mod.line(m.start())}: {why}")
        for segs, alias, glob, at in use_trees(text):
            path = absolute(mod, segs, at)
            if path is None:
                continue
            mod.uses.append((path, mod.line(at)))
            if glob:
                mod.globs.append(path)
            elif path:
                mod.imports[alias or path[-1]].append(path)
        # `type Alias = path;` names what it stands for, as a `use` would.
        alias = r"\btype\s+(" + IDENT + r")\s*(?:<[^=;]*>)?\s*=\s*(\$?" + IDENT + r"(?:" + SEP + IDENT + r")*)"
        for m in re.finditer(alias, text):
            path = absolute(mod, re.split(SEP, m.group(2)), m.start())
            if path:
                mod.imports[m.group(1)].append(path)
                mod.defined.discard(m.group(1))
                mod.uses.append((path, mod.line(m.start())))
        for at, s in mod.path_strings:
            path = absolute(mod, s.split("::"), at)
            if path is not None:
                mod.uses.append((path, mod.line(at)))
        body = re.sub(r"\buse\s+[^;]*;", lambda m: blank(m.group(0)), text)
        body = re.sub(r"\bpub\s*\(\s*in\b[^)]*\)", lambda m: blank(m.group(0)), body)
        inline = r"(?<![\w:])(\$crate|crate|super|self)((?:" + SEP + IDENT + r")+)"
        for m in re.finditer(inline, body):
            segs = [m.group(1)] + re.split(SEP, m.group(2).strip())[1:]
            path = absolute(mod, segs, m.start())
            if path is not None:
                mod.uses.append((path, mod.line(m.start())))
        for m in re.finditer(r"(?<![\w:.$])(" + IDENT + r")" + SEP + "(" + IDENT + r")", body):
            if m.group(1) in mod.children:
                mod.uses.append((mod.path + (m.group(1), m.group(2)), mod.line(m.start())))
        # A bare macro call: its name is in scope by text order (`#[macro_use]`, a macro above
        # the `mod`); the file that defines it, where exactly one other file does.
        for m in re.finditer(r"(?<![\w:$])(" + IDENT + r")\s*!\s*[\(\[\{]", body):
            owners = macro_files.get(m.group(1), set()) - {mod.path}
            if len(owners) == 1 and m.group(1) not in mod.macros:
                mod.uses.append((next(iter(owners)) + (m.group(1),), mod.line(m.start())))
    # `use M::*`: the names of M (its items, imports and children) this module then uses bare.
    for mod in mods.values():
        words = None
        for g in mod.globs:
            target = mods.get(g)
            if target is None:
                continue
            words = words or set(re.findall(IDENT, mod.text))
            names = (target.defined | set(target.imports) | set(target.children)) & words
            mod.uses += [(g + (n,), 0) for n in sorted(names - mod.defined)]


def resolve(mods, path, seen=None):
    """The modules that define what `path` names, following what a module imports or
    re-exports (any module but the facades: the root and `backend.rs`, through which an import
    counts as one of the facade)."""
    seen = seen or set()
    if path in seen:
        return []
    seen.add(path)
    for k in range(len(path), -1, -1):
        if path[:k] in mods:
            mod, rest = mods[path[:k]], path[k:]
            break
    else:
        return []
    if not rest or rest[0] in mod.defined:
        return [mod.path]
    if mod.file in FACADES:
        # A macro exported at the root (`#[macro_export]`) is the defining file's.
        owners = [m.path for m in mods.values() if rest[0] in m.macros and not m.test]
        if mod.path == () and len(owners) == 1 and rest[0] not in mod.imports:
            return owners
        return [mod.path]
    found = []
    for target in mod.imports.get(rest[0], []):
        found += resolve(mods, target + rest[1:], seen) if target[:1] != ("std",) else []
    for g in mod.globs:
        found += [t for t in resolve(mods, g + rest, seen) if t != g]
    return sorted(set(found)) or [mod.path]
