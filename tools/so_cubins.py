#!/usr/bin/env python3
"""Writes the CUDA cubins embedded in a shared object (a peer's prebuilt extension) as files,
so that nvdisasm and tools/sass_hist.py can read them on a machine without cuobjdump.

    python3 tools/so_cubins.py ../shared/peers/prebuilt/flash_mla_dense_ext.so /tmp/fm
    # -> /tmp/fm_0.cubin, /tmp/fm_1.cubin, ... and the kernels each holds

Scans the file for 64-bit ELF headers whose machine is EM_CUDA (190) and cuts each image at
the end of its furthest section or header table. Images the fatbin stores compressed are not
found (they have no plain ELF header); the prebuilt FlashMLA extensions store theirs plainly.
"""
import re
import struct
import subprocess
import sys

EM_CUDA = 190
SHT_NOBITS = 8


def images(blob):
    """(offset, bytes) of every uncompressed CUDA ELF image in `blob`."""
    at = blob.find(b"\x7fELF")
    while at >= 0:
        if blob[at + 4] == 2 and struct.unpack_from("<H", blob, at + 0x12)[0] == EM_CUDA:
            phoff, shoff = struct.unpack_from("<QQ", blob, at + 0x20)
            phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", blob, at + 0x36)
            end = max(phoff + phentsize * phnum, shoff + shentsize * shnum)
            for k in range(shnum):
                hdr = at + shoff + k * shentsize
                kind = struct.unpack_from("<I", blob, hdr + 4)[0]
                offset, size = struct.unpack_from("<QQ", blob, hdr + 0x18)
                if kind != SHT_NOBITS:
                    end = max(end, offset + size)
            yield at, blob[at:at + end]
        at = blob.find(b"\x7fELF", at + 1)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    src, prefix = sys.argv[1], sys.argv[2]
    with open(src, "rb") as f:
        blob = f.read()
    for n, (at, image) in enumerate(images(blob)):
        path = f"{prefix}_{n}.cubin"
        with open(path, "wb") as f:
            f.write(image)
        names = sorted(set(re.findall(rb"\.text\.([A-Za-z0-9_]+)", image)))
        print(f"{path}: {len(image)} bytes from offset {at:#x}, {len(names)} kernels")
        for name in names:
            print(f"    {name.decode()[:120]}")


if __name__ == "__main__":
    main()
