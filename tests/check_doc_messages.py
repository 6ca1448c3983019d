#!/usr/bin/env python3
"""Every message the user guide quotes must be one the programs can print.

The convention (docs/architecture.md, "Messages quoted in the docs"): in a page of docs/, a message a
program prints is quoted as an inline code span either on a line that starts with `> ` (a quote line,
indented or not, as under a list item; each code span on it is a message) or in the first column of a table whose first header is `symptom` (each
code span of that column is a message). In a quoted message `...` stands for any text, and a word in
capitals or a number (ADDR, PORT, N, DIR, 29500) stands for a value the program fills in; the rest must
appear as written. So do a 'single-quoted value' and a file name or path (a word with a dot or a slash,
config.ini, DIR/latest). Other code spans (flags, keys, file names) are not messages.

The check: each part of a quoted message between `...`s, as a pattern, must be found inside one format
string of the sources (adjacent C string literals joined, every printf conversion and every macro between
literals standing for any value); messages are built in layers, so write `...` where one layer's text ends
and the next one's begins. Usage: check_doc_messages.py SOURCE_ROOT. Exit 1 lists each message nobody prints, with its page
and line."""
import os
import re
import sys

CODE_DIRS = ["common", "comm", "kernels", "rendezvous", "launcher", "worker", "gpu", "examples"]
ANY = "\x01"  # a printf conversion (or a macro) inside a source format string

CONVERSION = re.compile(r"%[-+ #0']*(\*|\d+)?(\.(\*|\d+))?(hh|h|ll|l|L|z|j|t)?[diouxXeEfFgGaAcsp]")


def c_unescape(body):
    out, i = [], 0
    simple = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "0": "\0", "a": "\a", "b": "\b",
              "f": "\f", "v": "\v", "?": "?"}
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body):
            n = body[i + 1]
            if n == "x":
                m = re.match(r"[0-9a-fA-F]+", body[i + 2:])
                out.append(chr(int(m.group(0), 16)) if m else "x")
                i += 2 + (len(m.group(0)) if m else 0)
                continue
            if n in "01234567" and n != "0" or (n == "0" and i + 2 < len(body) and body[i + 2] in "01234567"):
                m = re.match(r"[0-7]{1,3}", body[i + 1:])
                out.append(chr(int(m.group(0), 8)))
                i += 1 + len(m.group(0))
                continue
            out.append(simple.get(n, n))
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


def formats_of(text):
    """Joined string-literal groups of one C source: "a" "b" -> "ab"; "x" MACRO "y" -> "x\x01y"."""
    groups, cur = [], None
    i, n = 0, len(text)
    pending_ident = False
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
            continue
        if c == "'":
            j = i + 1
            while j < n and text[j] != "'":
                j += 2 if text[j] == "\\" else 1
            i = j + 1
            if cur is not None:
                groups.append(cur)
                cur = None
            continue
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            lit = c_unescape(text[i + 1:j])
            lit = CONVERSION.sub(ANY, lit.replace("%%", "\x02")).replace("\x02", "%")
            if cur is None:
                cur = lit
            else:
                cur += (ANY if pending_ident else "") + lit
            pending_ident = False
            i = j + 1
            continue
        if c.isspace():
            i += 1
            continue
        m = re.match(r"[A-Za-z_][A-Za-z0-9_]*", text[i:])
        if m and cur is not None and not pending_ident:
            # "%" PRId64 "..." or "dir/" CKPT_LATEST: a macro between two literals stands for a value.
            k = i + len(m.group(0))
            while k < n and text[k].isspace():
                k += 1
            if k < n and text[k] == '"':
                pending_ident = True
                i = k
                continue
        if cur is not None:
            groups.append(cur)
            cur = None
        pending_ident = False
        i += len(m.group(0)) if m else 1
    if cur is not None:
        groups.append(cur)
    return groups


def source_formats(root):
    out = []
    for d in CODE_DIRS:
        for base, _, files in os.walk(os.path.join(root, d)):
            for f in files:
                if f.endswith((".c", ".h", ".cu")):
                    with open(os.path.join(base, f), encoding="utf-8", errors="replace") as fh:
                        out.extend(formats_of(fh.read()))
    return out


# `...`; 'a quoted value'; a file name or path (a word with a dot or a slash); a word in capitals; a number.
PLACEHOLDER = re.compile(r"\.\.\.|'[^'\s]*'|(?<![\w.])/?[\w-]*[A-Za-z_][\w-]*(?:[./][\w-]+)+/?|\b[A-Z][A-Z0-9_]*\b|"
                         r"\b\d+(?:\.\d+)?\b")


def patterns_of(quote):
    """A quoted message -> one regex per part between `...`s: messages are built in layers (a caller's
    format wraps its callee's message), so each part must be found in one format, not the whole quote."""
    return [pattern_of(p.strip()) for p in quote.split("...") if p.strip(" :;,.")]


def pattern_of(quote):
    """A part of a quoted message -> regex over source formats (placeholders -> wildcards)."""
    parts, pos = [], 0
    for m in PLACEHOLDER.finditer(quote):
        parts.append(re.escape(quote[pos:m.start()]))
        tok = m.group(0)
        parts.append(".*?" if tok == "..." else "'[^']*'" if tok.startswith("'") else r"\S+?")
        pos = m.end()
    parts.append(re.escape(quote[pos:]))
    rx = "".join(parts)
    rx = re.sub(r"(\\ )+", r"\\s+", rx)  # a space may be any run of spaces (wrapped C literals)
    return re.compile(rx, re.S)


CODE_SPAN = re.compile(r"`([^`]+)`")


def quoted_messages(path):
    """(line number, message) of every marked quote of one page."""
    out = []
    in_fence = False
    table_symptom = False
    with open(path, encoding="utf-8") as fh:
        for no, line in enumerate(fh, 1):
            s = line.rstrip("\n")
            if s.lstrip().startswith("```"):
                in_fence = not in_fence
                continue
            if in_fence:
                continue
            if s.lstrip(" ").startswith("> "):
                out.extend((no, m) for m in CODE_SPAN.findall(s))
                continue
            if s.startswith("|"):
                cells = re.split(r"(?<!\\)\|", s)[1:-1]
                if not cells:
                    continue
                first = cells[0].strip()
                if re.fullmatch(r"-+:?|:?-+:?", first):
                    continue
                if first.lower() == "symptom":
                    table_symptom = True
                    continue
                if table_symptom:
                    out.extend((no, m.replace("\\|", "|")) for m in CODE_SPAN.findall(cells[0]))
                continue
            table_symptom = False
    return out


def check(root, docs_dir=None):
    formats = source_formats(root)
    docs_dir = docs_dir or os.path.join(root, "docs")
    bad, checked = [], 0
    for f in sorted(os.listdir(docs_dir)):
        if not f.endswith(".md"):
            continue
        for no, msg in quoted_messages(os.path.join(docs_dir, f)):
            checked += 1
            for rx in patterns_of(msg):
                if not any(rx.search(fmt) for fmt in formats):
                    bad.append(f"docs/{f}:{no}: no program prints `{msg}` (no format holds /{rx.pattern}/)")
                    break
    return checked, bad


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    checked, bad = check(sys.argv[1])
    for b in bad:
        print(b)
    print(f"check_doc_messages: {checked} quoted messages, {len(bad)} that no source prints")
    return 1 if bad or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
