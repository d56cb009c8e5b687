#!/usr/bin/python3
"""Test data for engine/format/torch_zip_test.cc. Run with Debian's /usr/bin/python3 (torch).

  torch_zip_testdata.py entries FILE       one line per entry: name data_offset size header_offset
  torch_zip_testdata.py zips DIR [BIG]     stored archives written by python's zipfile, one per
                                           layout: DIR/{sized,zip64,escaped,described,described64}.zip
                                           (entries of 0, 5, 10 K and BIG (100000) bytes)
  torch_zip_testdata.py pair V1 V2         torch.save of a 20-tensor state_dict (V1), and the same
                                           with tensors 3, 11 and 17 changed (V2); give both the
                                           same file name (torch names the archive after it)

The data offset of an entry is its local header's offset plus the header's length (30 bytes,
name and extra field, as they are in the local header, not in the central directory).
"""
import io
import struct
import sys
import zipfile


def entries(path):
    with open(path, "rb") as f, zipfile.ZipFile(path) as z:
        for info in z.infolist():
            f.seek(info.header_offset)
            fixed = f.read(30)
            name_len, extra_len = struct.unpack("<HH", fixed[26:30])
            data_offset = info.header_offset + 30 + name_len + extra_len
            print(info.filename, data_offset, info.compress_size, info.header_offset)


class Unseekable(io.RawIOBase):
    """Makes zipfile write data descriptors (bit 3), as it does when streaming."""

    def __init__(self, f):
        self.f = f

    def writable(self):
        return True

    def seekable(self):
        return False

    def write(self, b):
        return self.f.write(b)


def zips(out_dir, big="100000"):
    payloads = [b"", b"hello", bytes(range(256)) * 40 + b"PK\x07\x08tail", b"x" * int(big)]
    for layout in ["sized", "zip64", "escaped", "described", "described64"]:
        path = f"{out_dir}/{layout}.zip"
        with open(path, "wb") as raw:
            out = Unseekable(raw) if layout.startswith("described") else raw
            with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
                for i, data in enumerate(payloads):
                    force = layout in ("zip64", "escaped", "described64")
                    with z.open(f"archive/data/{i}", "w", force_zip64=force) as w:
                        w.write(data)
        if layout == "escaped":
            # Sizes 0xFFFFFFFF in the local headers: the real ones are in the ZIP64 field.
            with open(path, "r+b") as f, zipfile.ZipFile(path) as z:
                for info in z.infolist():
                    f.seek(info.header_offset + 18)
                    f.write(struct.pack("<II", 0xFFFFFFFF, 0xFFFFFFFF))


def pair(v1, v2):
    import os

    import torch

    for path in (v1, v2):
        os.makedirs(os.path.dirname(path), exist_ok=True)

    torch.manual_seed(0)
    state = {f"layer{i}.weight": torch.randn(256, 1000 + 37 * i) for i in range(20)}
    torch.save(state, v1)
    for i in (3, 11, 17):
        state[f"layer{i}.weight"] = state[f"layer{i}.weight"] + 1.0
    torch.save(state, v2)


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    {"entries": entries, "zips": zips, "pair": pair}[cmd](*args)


if __name__ == "__main__":
    main()
