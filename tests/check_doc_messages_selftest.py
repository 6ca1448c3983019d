#!/usr/bin/env python3
"""Shows that check_doc_messages.py fails where it should: on a throwaway tree, quotes of messages the
sources print (values as capitals, numbers, 'quoted' words and paths; layers joined with `...`; formats
split over lines, with %% and a PRId64-style macro) must pass, and each stale quote (in a symptom table and
on a `> ` line, also one indented under a list item) must be reported, while code spans elsewhere (other tables, prose, fenced blocks) are not
messages. Usage: check_doc_messages_selftest.py PATH_TO_check_doc_messages.py"""
import os
import subprocess
import sys
import tempfile

SOURCE = r'''
/* "a comment with a string that is no message" */
static int f(void) {
    error_set(1, "cannot host the store: %s (or --master_port 0 to pick a free port)", m);
    error_set(1, "address %s:%d is already in use (another job or program listens there)", a, p);
    error_set(1, "checkpoint step %" PRId64 " not saved: %s", s, m);
    error_set(1, "%s: token %u at index %lld is >= vocab_size %lld "
                 "(the file was made for another tokenizer)", p, t, i, v);
    log_warn("loss scale %.1f%% of the start; char '%c' is fine", x, 'q');
    return 0;
}
'''

GOOD = '''# Page
| symptom | cause |
|---|---|
| `cannot host the store: ...address ADDR:PORT is already in use (another job or program listens there)` | x |
| `checkpoint step 20 not saved: ...` | x |
| `.../data/train.bin: token 50256 at index N is >= vocab_size 256 (the file was made for another tokenizer)` | x |
| described in words, no code | x |

> `loss scale 50.0% of the start; char 'q' is fine`

| flag | meaning |
|---|---|
| `--not-a-message` | a flag |

Prose with `a code span that is no message`.

```
port 29500 on 0.0.0.0 is already in use
```
'''

STALE_TABLE = '''| symptom | cause |
|---|---|
| `fsdp-launch: port 29500 on 0.0.0.0 is already in use` | stale |
'''

STALE_QUOTE = '''> `join timeout: node ranks 2, 3 (host ...) never joined`
'''

# a quote line indented under a list item is a quote line too
STALE_LIST_QUOTE = '''- an item:

  > `the store refused nothing at all`
'''


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
        write(root, 'common/x.c', SOURCE)
        write(root, 'docs/good.md', GOOD)
        rc, out = run(checker, root)
        if rc != 0 or '4 quoted messages, 0' not in out:
            print(f'FAIL: the good page was refused or miscounted (rc {rc}):\n{out}')
            failures += 1
        write(root, 'docs/stale.md', STALE_TABLE + '\n' + STALE_QUOTE + '\n' + STALE_LIST_QUOTE)
        rc, out = run(checker, root)
        for needle in ('docs/stale.md:3: no program prints `fsdp-launch: port 29500',
                       'docs/stale.md:5: no program prints `join timeout',
                       'docs/stale.md:9: no program prints `the store refused nothing'):
            if rc != 1 or needle not in out:
                print(f'FAIL: expected "{needle}" and exit 1, got rc {rc}:\n{out}')
                failures += 1
    print('check_doc_messages_selftest: ' + ('ok' if not failures else f'{failures} failure(s)'))
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main())
