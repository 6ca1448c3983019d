#!/usr/bin/env python3
"""What GPU code an ELF file (the GPU module, a .cu object) carries: the entries of its .nv_fatbin section,
as `kind arch count` lines (kind sm = machine code, ptx = PTX the driver compiles for newer GPUs).

  fatbin_arches.py FILE                      print the entries
  fatbin_arches.py FILE --sm 80,90 --ptx 90  also exit 1, naming what is missing, unless FILE has machine
                                             code for each --sm and PTX for each --ptx
  fatbin_arches.py FILE --runs-on 100        exit 1 unless a GPU of compute capability 10.0 can run FILE's
                                             kernels (machine code of the same major version at most as new,
                                             or PTX at most as new to compile)

The format, read from files nvcc 13 wrote: the section holds fatbin blobs, each a 16-byte header (u32 magic
0xBA55ED50, u16 version, u16 header size, u64 size of the entries) and then entries, each with a header
(u16 kind: 1 PTX, 2 ELF; u16 version; u32 header size; u64 data size; ... u32 arch at offset 28) followed by
its data. cuobjdump says the same where it is installed; this needs only Python.
"""
import argparse
import collections
import struct
import sys


def section(path, name):
    data = open(path, "rb").read()
    if data[:4] != b"\x7fELF" or data[4] != 2:
        sys.exit(f"{path}: not a 64-bit ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    def sh(i):
        return struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
    strtab = sh(shstrndx)
    for i in range(shnum):
        s = sh(i)
        start = strtab[4] + s[0]
        sname = data[start:data.index(b"\0", start)].decode()
        if sname == name:
            return data[s[4]:s[4] + s[5]]
    return b""


def entries(blob):
    out = collections.Counter()
    off = 0
    while off + 16 <= len(blob):
        magic, _ver, hsize, fsize = struct.unpack_from("<IHHQ", blob, off)
        if magic != 0xBA55ED50:
            off += 8  # blobs are 8-byte aligned; skip padding
            continue
        e, end = off + hsize, off + hsize + fsize
        while e + 32 <= end:
            kind, _v, ehs, size = struct.unpack_from("<HHIQ", blob, e)
            arch, = struct.unpack_from("<I", blob, e + 28)
            out[("ptx" if kind == 1 else "sm" if kind == 2 else f"kind{kind}", arch)] += 1
            e += ehs + size
        off = end
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("file")
    ap.add_argument("--sm", default="", help="compute capabilities that need machine code, e.g. 80,90")
    ap.add_argument("--ptx", default="", help="compute capabilities that need PTX, e.g. 90")
    ap.add_argument("--runs-on", type=int, default=0, help="a GPU's compute capability, e.g. 90 or 100")
    a = ap.parse_args()
    found = entries(section(a.file, ".nv_fatbin"))
    for (kind, arch), n in sorted(found.items()):
        print(f"{kind} {arch} {n}")
    if not found:
        print(f"{a.file}: no .nv_fatbin section (no GPU code)", file=sys.stderr)
        return 1
    missing = [f"sm_{x}" for x in a.sm.split(",") if x and ("sm", int(x)) not in found]
    missing += [f"compute_{x} (PTX)" for x in a.ptx.split(",") if x and ("ptx", int(x)) not in found]
    if a.runs_on:
        cc = a.runs_on
        ok = any(k == "sm" and arch // 10 == cc // 10 and arch <= cc for k, arch in found) or \
             any(k == "ptx" and arch <= cc for k, arch in found)
        if not ok:
            missing.append(f"code a compute capability {cc // 10}.{cc % 10} GPU can run")
    if missing:
        print(f"{a.file}: lacks {', '.join(missing)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
