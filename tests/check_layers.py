#!/usr/bin/env python3
"""Checks the tree against the layering rules of docs/architecture.md.

1. Includes: every `#include "dir/file.h"` of a source outside tests/ must name its own folder or one that
   the rules table in docs/architecture.md ("| folder | may include |") allows for the source's folder.
2. Include cycles: modules (a .c and its .h, named by path without extension) must not include each other
   in a circle.
3. Call cycles (with a build directory): on the built objects, no two sources may use each other's global
   symbols, directly or round a longer circle.
4. Family branches: outside worker/model/ no source names a model family's enum value (WORKER_MODEL_*) or
   compares a model_family with a family's name: what a family adds is the model's to say (its keys and their
   checks, model_describe, model_summary_fields: the registry), so adding a family touches worker/model only.

Usage: check_layers.py SOURCE_ROOT [BUILD_DIR]. Prints `check_layers: ok ...` or one line per violation,
and exits 1 on any violation.
"""
import json
import os
import re
import subprocess
import sys

SRC_EXT = ('.c', '.h', '.cu', '.cuh')
SKIP_TOP = {'tests', 'build', 'docs', '.git', '.ci'}
INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def read_rules(root):
    """The rules table of docs/architecture.md: folder -> set of folders it may include."""
    rules = {}
    in_table = False
    with open(os.path.join(root, 'docs', 'architecture.md'), encoding='utf-8') as f:
        for line in f:
            cells = [c.strip() for c in line.strip().strip('|').split('|')]
            if line.startswith('| folder') and len(cells) >= 2 and cells[1].startswith('may include'):
                in_table = True
                continue
            if not in_table:
                continue
            if not line.startswith('|'):
                break
            if set(cells[0]) <= set('-: '):
                continue
            folder = cells[0].strip('`').rstrip('/')
            allowed = set()
            for item in re.findall(r'`([^`]+)`', cells[1]):
                allowed.add(item.rstrip('/'))
            rules[folder] = allowed
    if not rules:
        sys.exit('check_layers: docs/architecture.md has no "| folder | may include |" table')
    return rules


def sources(root):
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        top = rel.split(os.sep)[0]
        if top in SKIP_TOP or top.startswith('build'):
            dirnames[:] = []
            continue
        for name in filenames:
            if name.endswith(SRC_EXT):
                yield os.path.normpath(os.path.join(rel, name))


def folder_of(path, rules):
    """The deepest folder of the rules table that holds path."""
    parts = os.path.dirname(path).split(os.sep)
    for n in range(len(parts), 0, -1):
        cand = '/'.join(parts[:n])
        if cand in rules:
            return cand
    return None


def module_of(path):
    """A .c with its .h; an `x_internal.h` belongs to module x (the backends' view of x)."""
    base = os.path.splitext(path)[0]
    return base[:-len('_internal')] if base.endswith('_internal') else base


def find_cycles(graph):
    """Strongly connected components of more than one node (Tarjan, iterative)."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = [0]
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, it = work[-1]
            advanced = False
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    n = stack.pop()
                    on_stack.discard(n)
                    comp.append(n)
                    if n == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def check_includes(root, rules, errors):
    graph = {}
    files = sorted(sources(root))
    for path in files:
        folder = folder_of(path, rules)
        if folder is None:
            errors.append(f'{path}: folder not in the rules table of docs/architecture.md')
            continue
        with open(os.path.join(root, path), encoding='utf-8', errors='replace') as f:
            text = f.read()
        for inc in INCLUDE_RE.findall(text):
            if '/' not in inc:
                target = os.path.normpath(os.path.join(os.path.dirname(path), inc))
            else:
                target = os.path.normpath(inc)
            if not os.path.exists(os.path.join(root, target)):
                continue  # generated or system-like header; nothing to check
            tfolder = folder_of(target, rules)
            if tfolder != folder and tfolder not in rules[folder]:
                errors.append(f'{path}: includes "{inc}" ({tfolder}/), which {folder}/ may not include')
            if module_of(target) != module_of(path):
                graph.setdefault(module_of(path), set()).add(module_of(target))
    for comp in find_cycles(graph):
        errors.append('include cycle between modules: ' + ' <-> '.join(comp))
    return len(files)


def nm_symbols(obj):
    out = subprocess.run(['nm', '-P', obj], capture_output=True, text=True, check=True).stdout
    defined, used = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        name, kind = parts[0], parts[1]
        if kind == 'U':
            used.add(name)
        elif kind in 'TDBRVWGS' and kind.isupper():
            defined.add(name)
    return defined, used


def check_calls(root, build, errors):
    with open(os.path.join(build, 'compile_commands.json'), encoding='utf-8') as f:
        commands = json.load(f)
    objs = {}
    for c in commands:
        src = os.path.normpath(os.path.relpath(os.path.join(c['directory'], c['file']), root))
        top = src.split(os.sep)[0]
        if top in SKIP_TOP or top.startswith('build') or top == 'examples' or src.startswith('..'):
            continue
        obj = os.path.join(c['directory'], c['output'])
        if os.path.exists(obj):
            objs.setdefault(src, []).append(obj)
    defined_by, uses = {}, {}
    for src, paths in objs.items():
        for obj in paths:
            d, u = nm_symbols(obj)
            for s in d:
                defined_by.setdefault(s, set()).add(src)
            uses.setdefault(src, set()).update(u)
    graph = {}
    for src, used in uses.items():
        for s in used:
            for other in defined_by.get(s, ()):
                if other != src:
                    graph.setdefault(src, set()).add(other)
    for comp in find_cycles(graph):
        # name one symbol per edge inside the circle so the report says where to cut
        edges = []
        for a in comp:
            for b in comp:
                if b in graph.get(a, ()):
                    sym = sorted(s for s in uses[a] if b in defined_by.get(s, ()))[0]
                    edges.append(f'{a} -> {b} ({sym})')
        errors.append('call cycle between sources: ' + '; '.join(edges))
    return len(objs)


FAMILY_HOME = ('worker/model/',)
# a family's enum value, or a model_family compared with a literal name (comparing two configs' families,
# as a checkpoint's against the run's, is no branch)
FAMILY_BRANCH_RE = re.compile(r'\bWORKER_MODEL_[A-Z0-9_]+\b|strn?cmp\s*\([^;]*model_family[^;]*"[^"]*"|'
                              r'strn?cmp\s*\(\s*"[^"]*"[^;]*model_family')


def check_family_branches(root, errors):
    for path in sorted(sources(root)):
        rel = path.replace(os.sep, '/')
        if rel.startswith(FAMILY_HOME):
            continue
        with open(os.path.join(root, path), encoding='utf-8', errors='replace') as f:
            for n, line in enumerate(f, 1):
                m = FAMILY_BRANCH_RE.search(line)
                if m:
                    errors.append(f'{rel}:{n}: branches on a model family ({m.group(0).strip()}); '
                                  'let the family say it (worker/model registry)')


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    root = sys.argv[1]
    rules = read_rules(root)
    errors = []
    nfiles = check_includes(root, rules, errors)
    check_family_branches(root, errors)
    nobjs = check_calls(root, sys.argv[2], errors) if len(sys.argv) == 3 else 0
    for e in errors:
        print('check_layers: ' + e)
    if errors:
        print(f'check_layers: {len(errors)} violation(s)')
        return 1
    print(f'check_layers: ok, {nfiles} sources, {len(rules)} folders, {nobjs} objects')
    return 0


if __name__ == '__main__':
    sys.exit(main())
