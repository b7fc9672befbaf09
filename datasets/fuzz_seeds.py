#!/usr/bin/env python3
"""Writes the seed corpora of the datasets fuzzers (docs/fuzzing.md) into datasets/fuzz_corpus/.

One folder per target: idx (IDX headers and files), tar_members (ustar, pax and GNU shards made
by Python's tarfile) and prepare_spec (spec texts). Usage: datasets/fuzz_seeds.py [OUT_DIR]
"""
import io
import os
import struct
import sys
import tarfile


def idx(dims, data=True):
    header = bytes([0, 0, 8, len(dims)]) + b"".join(struct.pack(">I", d) for d in dims)
    n = 1
    for d in dims:
        n *= d
    return header + (bytes(i % 251 for i in range(n)) if data else b"")


def shard(fmt, members, cut=None, pax=None):
    """A tar of (name, bytes or None for a folder), ending at its two zero blocks, not padded to
    tarfile's 10 KiB records. `pax`: records of each member's pax header."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt,
                      pax_headers={"comment": "seed"} if fmt == tarfile.PAX_FORMAT else None) as t:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            if pax:
                info.pax_headers = dict(pax)
            if data is None:
                info.type = tarfile.DIRTYPE
                t.addfile(info)
            else:
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
        end = t.offset
    out = buf.getvalue()[:end] + bytes(1024)
    return out[:cut] if cut else out


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "fuzz_corpus")
    long_dir = "d" * 120
    seeds = {
        "idx": {
            "images-3x2x2": idx([3, 2, 2]),
            "labels-4": idx([4]),
            "images-rgb-2x2x2x3": idx([2, 2, 2, 3]),
            "rows-2x5": idx([2, 5]),
            "no-records-0x28x28": idx([0, 28, 28]),
            "wrapping-issue-21": idx([1 << 24, 1 << 20, 1 << 20], data=False),
        },
        "tar_members": {
            "ustar": shard(tarfile.USTAR_FORMAT,
                           [("train", None), ("train/k0.jpg", b"\xff\xd8jpeg"), ("train/k0.cls", b"3\n")]),
            "ustar-prefix": shard(tarfile.USTAR_FORMAT, [(long_dir + "/k1.png", b"png")]),
            "pax": shard(tarfile.PAX_FORMAT, [("p" * 150 + ".jpg", b"pax"), ("k2.cls", b"7")]),
            "pax-size": shard(tarfile.PAX_FORMAT, [("k4.png", b"size")], pax={"size": "4"}),
            "gnu-longname": shard(tarfile.GNU_FORMAT, [("g" * 130 + ".jpg", b"gnu")]),
            "truncated": shard(tarfile.USTAR_FORMAT, [("k3.jpg", bytes(700))], cut=1024),
        },
        "prepare_spec": {
            "imagenet": b"resize=256,crop=256",
            "idx-default": b"raw,channels=1",
            "raw": b"raw",
            "gray-crop": b"crop=28,channels=1",
            "resize-only": b"resize=32",
            "any-order": b"channels=3,crop=224,resize=256",
        },
    }
    for target, files in seeds.items():
        os.makedirs(os.path.join(root, target), exist_ok=True)
        for name, data in files.items():
            with open(os.path.join(root, target, name), "wb") as f:
                f.write(data)


if __name__ == "__main__":
    main()
