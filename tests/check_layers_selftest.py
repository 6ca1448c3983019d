#!/usr/bin/env python3
"""Shows that check_layers.py fails where it should: on a throwaway tree with an upward include, an
include across sibling folders and an include cycle, it must report each and exit 1; on the same tree
without them it must pass. Usage: check_layers_selftest.py PATH_TO_check_layers.py"""
import os
import subprocess
import sys
import tempfile

RULES = """# x
| folder | may include | owns |
|---|---|---|
| `low/` | | |
| `high/a/` | `low/` | |
| `high/b/` | `low/` | |
| `worker/config/` | `low/` | |
"""


def write(root, path, text):
    full = os.path.join(root, path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, 'w', encoding='utf-8') as f:
        f.write(text)


def run(checker, root):
    p = subprocess.run([sys.executable, checker, root], capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def main():
    checker = sys.argv[1]
    failures = 0
    with tempfile.TemporaryDirectory() as root:
        write(root, 'docs/architecture.md', RULES)
        write(root, 'low/base.h', '#pragma once\n')
        write(root, 'high/a/x.h', '#include "low/base.h"\n')
        write(root, 'high/a/x.c', '#include "high/a/x.h"\n#include "high/a/y.h"\n')
        write(root, 'high/a/y.h', '#pragma once\n')
        write(root, 'high/b/z.c', '#include "low/base.h"\n')
        rc, out = run(checker, root)
        if rc != 0:
            print('FAIL: a clean tree was refused:\n' + out)
            failures += 1
        # family branches, also in worker/config (the registry in worker/model says what a family reads)
        write(root, 'worker/config/c.c', 'int r(int fam) { return fam == WORKER_MODEL_QWEN2; }\n')
        write(root, 'high/b/v.c', 'int f(int fam) { return fam == WORKER_MODEL_LLAMA; }\n'
                                  'int g(const char *a, const char *b) { return strcmp(a, b); }\n'
                                  'int h(struct c *c) { return !strcmp(c->model_family, "llama"); }\n')
        write(root, 'low/base.c', '#include "high/a/x.h"\n')          # upward
        write(root, 'high/b/w.c', '#include "high/a/x.h"\n')          # across siblings
        write(root, 'high/a/y.c', '#include "high/a/x.h"\n')          # x <-> y
        rc, out = run(checker, root)
        for want in ('low/base.c: includes "high/a/x.h"', 'high/b/w.c: includes "high/a/x.h"',
                     'include cycle between modules: high/a/x <-> high/a/y',
                     'high/b/v.c:1: branches on a model family (WORKER_MODEL_LLAMA)',
                     'high/b/v.c:3: branches on a model family',
                     'worker/config/c.c:1: branches on a model family (WORKER_MODEL_QWEN2)'):
            if want not in out:
                print(f'FAIL: not reported: {want}\n' + out)
                failures += 1
        if rc != 1:
            print(f'FAIL: exit {rc}, expected 1')
            failures += 1
    print(f'{1 - min(failures, 1)} passed, {min(failures, 1)} failed')
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main())
