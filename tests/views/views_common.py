"""Helpers shared by the tests of ckptfs's derived views (tests/views/test_*.py)."""
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "fs"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
import mounted  # noqa: E402,F401  (before torch: it starts the cleanup guard)

try:
    import numpy as np  # noqa: E402
    import torch  # noqa: E402
except ImportError:
    mounted.skip_all("needs python3-torch and numpy (run with Debian's /usr/bin/python3)")


def flatten(obj, prefix=""):
    """name -> tensor as the per-tensor view names them (dict keys and indices joined by '.')."""
    out = {}
    if isinstance(obj, torch.Tensor):
        out[prefix] = obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            out.update(flatten(v, "%s.%s" % (prefix, k) if prefix else str(k)))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out.update(flatten(v, "%s.%d" % (prefix, i) if prefix else str(i)))
    return out


def escape(name):
    if not name:
        return "tensor"
    return name.replace("%", "%25").replace("/", "%2F")


def npy_to_torch(arr, dtype_name):
    """A .npy array of the view as the torch tensor it stands for (bf16: raw '<u2' bits)."""
    arr = np.array(arr)  # copy out of the mmap
    if dtype_name == "bfloat16":
        return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(arr)


def bits_equal(a, b):
    if a.dtype != b.dtype or tuple(a.shape) != tuple(b.shape):
        return False
    if a.is_floating_point() and a.element_size() in (2, 4, 8):
        ty = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        return torch.equal(a.contiguous().view(ty), b.contiguous().view(ty))
    return torch.equal(a, b)


ST_NAMES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
            torch.float64: "F64", torch.int64: "I64", torch.int32: "I32", torch.uint8: "U8",
            torch.bool: "BOOL", torch.int8: "I8", torch.int16: "I16"}
ST_DTYPES = {v: k for k, v in ST_NAMES.items()}


def tensor_bytes(t):
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().tobytes()
    return t.numpy().tobytes()


def save_safetensors(tensors, path):
    """A minimal safetensors writer (the safetensors package is not installed here)."""
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        b = tensor_bytes(t)
        header[name] = {"dtype": ST_NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)


def load_safetensors(path):
    """name -> tensor, read strictly (the file must be exactly as long as its data)."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    base = 8 + n
    end = max([v["data_offsets"][1] for v in header.values()] + [0])
    assert base + end == len(raw), "safetensors file length %d != %d" % (len(raw), base + end)
    out = {}
    for name, v in header.items():
        dt = ST_DTYPES[v["dtype"]]
        b, e = v["data_offsets"]
        buf = bytearray(raw[base + b:base + e])
        if dt == torch.bfloat16:
            t = torch.frombuffer(buf, dtype=torch.int16).view(torch.bfloat16) if buf else \
                torch.empty(0, dtype=torch.bfloat16)
        else:
            t = torch.frombuffer(buf, dtype=dt) if buf else torch.empty(0, dtype=dt)
        out[name] = t.reshape(v["shape"])
    return out


def read_stats(mnt):
    """user.ckptfs.stats of the mount as a dict of ints."""
    out = {}
    for line in os.getxattr(mnt, "user.ckptfs.stats").decode().splitlines():
        k, _, v = line.partition(" ")
        out[k] = int(v)
    return out
