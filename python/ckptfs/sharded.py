"""Sharded versions: how a state dict is partitioned across ranks, and loading it back for any
world size (docs/snapshot.md, "Resharding").

A version written by ckptfs.snapshot holds rank_R.safetensors per rank and manifest.json:
{"world_size": W, "ranks": [{"rank", "file", "tensors": {name: {"dtype", "shape",
"global_shape", "offsets"}}}, ...]}. A tensor's shards are boxes of its global shape; a
tensor not partitioned has one full box (and may be repeated by several ranks).
"""
import json
import os
import struct

import numpy as np

_NP = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64,
       "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_,
       "BF16": np.uint16}  # bf16 travels as its bits; converted with torch when present


def split_bounds(n, world_size, rank):
    """[start, stop) of part `rank` when n items are split into world_size parts
    (np.array_split: the first n % world_size parts get one more)."""
    base, extra = divmod(n, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def split_state_dict(state_dict, rank, world_size, dim=0):
    """This rank's shard of every tensor (split along `dim`; 0-d tensors and tensors with
    fewer dims are replicated) and the shard_info ckptfs.snapshot wants."""
    local, info = {}, {}
    for name, t in state_dict.items():
        shape = tuple(t.shape)
        if len(shape) <= dim:
            local[name] = t
            continue
        start, stop = split_bounds(shape[dim], world_size, rank)
        index = [slice(None)] * len(shape)
        index[dim] = slice(start, stop)
        local[name] = t[tuple(index)]
        offsets = [0] * len(shape)
        offsets[dim] = start
        info[name] = (list(shape), offsets)
    return local, info


def read_safetensors(path):
    """{name: (dtype, shape, bytes offset in file, nbytes)} and the metadata of a
    safetensors file (stdlib only)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    meta = header.pop("__metadata__", {})
    entries = {}
    for name, e in header.items():
        begin, end = e["data_offsets"]
        entries[name] = (e["dtype"], tuple(e["shape"]), 8 + n + begin, end - begin)
    return entries, meta


def _read_array(path, entry):
    dtype, shape, offset, nbytes = entry
    with open(path, "rb") as f:
        f.seek(offset)
        raw = f.read(nbytes)
    return np.frombuffer(raw, dtype=_NP[dtype]).reshape(shape)


def _to_output(array, dtype):
    try:
        import torch
    except ImportError:
        return array
    a = np.array(array, order="C")  # a copy; ascontiguousarray would make a 0-d array 1-d
    if dtype == "BF16":  # torch (1.13) takes no uint16 array: its bits as int16
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def load_sharded(version_dir, rank, world_size, dim=0):
    """This rank's part of every tensor of the version, for `world_size` ranks (which may
    differ from the world size that saved it): each partitioned tensor is split along `dim`
    of its global shape (as split_state_dict does) and reassembled from the saved shards;
    tensors that were not partitioned come whole. Returns {name: tensor} (torch tensors
    when torch is importable, else numpy arrays), plus the state dict's non-tensor values
    (step counters, param_groups) by key path, as the rank that now has this rank's number
    saved them (rank 0's when it is beyond the saving world)."""
    with open(os.path.join(version_dir, "manifest.json")) as f:
        manifest = json.load(f)
    files = {}
    layout = {}  # name -> (dtype, global_shape, [(file, entry name, offsets, shape)])
    for part in manifest["ranks"]:
        path = os.path.join(version_dir, part["file"])
        for name, t in part["tensors"].items():
            dtype, gshape = t["dtype"], tuple(t["global_shape"])
            layout.setdefault(name, (dtype, gshape, []))[2].append(
                (path, tuple(t["offsets"]), tuple(t["shape"])))
    out = {}
    for name, (dtype, gshape, shards) in layout.items():
        partitioned = any(tuple(s[2]) != gshape for s in shards)
        if not partitioned or len(gshape) <= dim:
            path = shards[0][0]
            entries = files.setdefault(path, read_safetensors(path)[0])
            out[name] = _to_output(_read_array(path, entries[name]), dtype)
            continue
        start, stop = split_bounds(gshape[dim], world_size, rank)
        lo = [0] * len(gshape)
        hi = list(gshape)
        lo[dim], hi[dim] = start, stop
        result = np.empty([h - l for l, h in zip(lo, hi)], dtype=_NP[dtype])
        covered = 0
        for path, offs, shape in shards:
            a = [max(l, o) for l, o in zip(lo, offs)]
            b = [min(h, o + s) for h, o, s in zip(hi, offs, shape)]
            if any(x >= y for x, y in zip(a, b)):
                continue
            entries = files.setdefault(path, read_safetensors(path)[0])
            src = _read_array(path, entries[name])
            src_idx = tuple(slice(x - o, y - o) for x, y, o in zip(a, b, offs))
            dst_idx = tuple(slice(x - l, y - l) for x, y, l in zip(a, b, lo))
            result[dst_idx] = src[src_idx]
            covered += int(np.prod([y - x for x, y in zip(a, b)]))
        if covered != result.size:
            raise ValueError("%s: the saved shards cover %d of %d elements of this part"
                             % (name, covered, result.size))
        out[name] = _to_output(result, dtype)
    parts = sorted(manifest["ranks"], key=lambda p: p["rank"])
    source = next((p for p in parts if p["rank"] == rank), parts[0] if parts else None)
    if source is not None:
        _, meta = read_safetensors(os.path.join(version_dir, source["file"]))
        if "ckptfs.extra" in meta:
            out.update(json.loads(meta["ckptfs.extra"]))
    return out
