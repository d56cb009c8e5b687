#!/usr/bin/python3
"""Test data for engine/format/safetensors_test.cc (and fuzz seeds). Needs only the standard
library: the safetensors package is not in Debian, so a small writer here lays files out as
safetensors.torch.save_file does (tensors sorted by alignment, then name; the header padded
with spaces to a multiple of 8 bytes).

  safetensors_testdata.py write DIR    DIR/NAME.safetensors and DIR/NAME.txt (lines below);
                                       one NAME per line on stdout

Lines (tab-separated): "T name dtype shape begin end" for each tensor, by offset, with shape
comma-separated ("-" when 0-d) and begin/end absolute offsets in the file; "M key value" for
each metadata entry, by key.
"""
import json
import os
import struct
import sys

SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2,
         "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "C64": 8, "F64": 8, "I64": 8, "U64": 8}


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def save(path, tensors, metadata=None):
    """tensors: name -> (dtype, shape). Returns the description lines."""
    order = sorted(tensors, key=lambda k: (-SIZES[tensors[k][0]], k))
    header, offset = {}, 0
    for name in order:
        dtype, shape = tensors[name]
        n = numel(shape) * SIZES[dtype]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    if metadata is not None:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        f.write(bytes(i % 251 for i in range(offset)))
    start = 8 + len(text)
    lines = []
    for name in order:
        dtype, shape = tensors[name]
        begin, end = header[name]["data_offsets"]
        dims = ",".join(str(d) for d in shape) if shape else "-"
        lines.append(f"T\t{name}\t{dtype}\t{dims}\t{start + begin}\t{start + end}")
    for k in sorted(metadata or {}):
        lines.append(f"M\t{k}\t{metadata[k]}")
    return lines


def samples():
    return {
        "basic": ({"model.embed.weight": ("BF16", (16, 8)), "model.norm.weight": ("F32", (8,)),
                   "lm_head.weight": ("F16", (16, 8)), "step": ("I64", ()),
                   "mask": ("BOOL", (3, 5)), "empty": ("F32", (0, 4)), "ids": ("U8", (7,)),
                   "f8": ("F8_E4M3", (4,)), "c": ("C64", (2,)), "d": ("F64", (1, 1, 3))},
                  {"format": "pt", "note": "h\u00e9llo"}),
        "many": ({f"layers.{i}.w": ("F32" if i % 3 else "F16", (i % 7 + 1, 3)) for i in range(400)},
                 None),
        "none": ({}, None),
        "metadata_only": ({}, {"a": "1"}),
    }


def write(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    for name, (tensors, metadata) in samples().items():
        lines = save(os.path.join(out_dir, name + ".safetensors"), tensors, metadata)
        with open(os.path.join(out_dir, name + ".txt"), "w") as f:
            f.write("".join(line + "\n" for line in lines))
        print(name)


if __name__ == "__main__":
    {"write": write}[sys.argv[1]](sys.argv[2])
