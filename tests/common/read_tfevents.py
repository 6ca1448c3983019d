#!/usr/bin/python3
"""Independent reader of a TensorBoard event file for test_tfevents: checks every record's framing and
masked CRC32C (computed here, bit by bit, not by the C library under test), decodes the Event protobuf and
prints one line per item: `version WALL STRING`, `session STEP START` (a SessionLog) or `scalar STEP TAG VALUE`
(VALUE as float32 repr).
Exits 1 with a message on any malformed byte. Standard library only."""
import struct
import sys


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def varint(buf, i):
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, i


def fields(buf):
    i = 0
    while i < len(buf):
        key, i = varint(buf, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            v, i = varint(buf, i)
        elif wire == 1:
            v, i = buf[i:i + 8], i + 8
        elif wire == 5:
            v, i = buf[i:i + 4], i + 4
        elif wire == 2:
            n, i = varint(buf, i)
            v, i = buf[i:i + n], i + n
        else:
            sys.exit(f"bad wire type {wire}")
        if i > len(buf):
            sys.exit("field runs past the end of its message")
        yield num, v


def main(path):
    data = open(path, "rb").read()
    pos = 0
    while pos < len(data):
        if pos + 12 > len(data):
            sys.exit(f"truncated header at {pos}")
        head = data[pos:pos + 8]
        (length,) = struct.unpack("<Q", head)
        (hcrc,) = struct.unpack("<I", data[pos + 8:pos + 12])
        if hcrc != masked(head):
            sys.exit(f"bad length crc at {pos}")
        body = data[pos + 12:pos + 12 + length]
        (dcrc,) = struct.unpack("<I", data[pos + 12 + length:pos + 16 + length])
        if len(body) != length or dcrc != masked(body):
            sys.exit(f"bad data crc at {pos}")
        pos += 16 + length
        wall, step = None, 0
        for num, v in fields(body):
            if num == 1:
                (wall,) = struct.unpack("<d", v)
            elif num == 2:
                step = v
            elif num == 3:
                print(f"version {wall!r} {v.decode()}")
            elif num == 7:
                status = dict(fields(v)).get(1, 0)
                print(f"session {step} {['UNSPECIFIED', 'START', 'STOP', 'CHECKPOINT'][status]}")
            elif num == 5:
                for snum, sv in fields(v):
                    if snum != 1:
                        continue
                    tag, val = None, None
                    for vnum, vv in fields(sv):
                        if vnum == 1:
                            tag = vv.decode()
                        elif vnum == 2:
                            (val,) = struct.unpack("<f", vv)
                    print(f"scalar {step} {tag} {val!r}")
        if wall is None:
            sys.exit("event without wall_time")


if __name__ == "__main__":
    main(sys.argv[1])
