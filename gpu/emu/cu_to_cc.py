#!/usr/bin/env python3
"""Rewrites one kernels/cuda/*.cu source for the CUDA host emulator (gpu/emu/emu_kernel.h), keeping its lines:
- `kernel<<<grid, block[, smem[, stream]]>>>(args)` becomes `emu_kernel_launch(kernel, "kernel", grid, block,
  smem, stream)(args)`;
- `extern __shared__ T name[];` becomes `T *name = (T *)emu_dynamic_smem();` (the block's dynamic shared memory);
- any other `__shared__` becomes EMU_SHARED (one copy per OS thread; a block's CUDA threads are its fibers).
The sources stay nvcc sources, one copy; this runs at build time (usage: cu_to_cc.py IN.cu OUT.cc)."""
import re
import sys


def kernel_start(src, end):
    """Start of the kernel expression that ends just before `end` (identifiers, ::, balanced <...>)."""
    i = end
    while i > 0 and src[i - 1].isspace():
        i -= 1
    while i > 0:
        c = src[i - 1]
        if c.isalnum() or c == '_' or c == ':':
            i -= 1
        elif c == '>':
            depth = 0
            while i > 0:
                c = src[i - 1]
                if c == '>':
                    depth += 1
                elif c == '<':
                    depth -= 1
                i -= 1
                if depth == 0:
                    break
        else:
            break
    return i


def balanced(src, i, open_c, close_c):
    """Index just past the bracket that closes the one at src[i]."""
    depth = 0
    while i < len(src):
        if src[i] == open_c:
            depth += 1
        elif src[i] == close_c:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise SystemExit('cu_to_cc: unbalanced %s' % open_c)


def rewrite(src):
    out = []
    pos = 0
    while True:
        k = src.find('<<<', pos)
        if k < 0:
            out.append(src[pos:])
            break
        start = kernel_start(src, k)
        name = src[start:k].strip()
        if not name:
            raise SystemExit('cu_to_cc: a launch without a kernel name at offset %d' % k)
        e = src.find('>>>', k)
        config = src[k + 3:e]
        p = e + 3
        while src[p].isspace():
            p += 1
        if src[p] != '(':
            raise SystemExit('cu_to_cc: launch of %s without arguments' % name)
        q = balanced(src, p, '(', ')')
        out.append(src[pos:start])
        out.append('emu_kernel_launch(%s, "%s", %s)%s' % (name, ' '.join(name.split()), config, src[p:q]))
        pos = q
    s = ''.join(out)
    s = re.sub(r'extern\s+__shared__\s+([\w:]+(?:\s*\*)?)\s+(\w+)\s*\[\s*\]\s*;',
               r'\1 *\2 = (\1 *)emu_dynamic_smem();', s)
    s = re.sub(r'\b__shared__\b', 'EMU_SHARED', s)
    return s


def main():
    src_path, out_path = sys.argv[1], sys.argv[2]
    with open(src_path) as f:
        src = f.read()
    with open(out_path, 'w') as f:
        f.write('#line 1 "%s"\n' % src_path)
        f.write(rewrite(src))


if __name__ == '__main__':
    main()
