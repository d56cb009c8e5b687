"""Lazy, selective loads of a checkpoint file from a ckptfs mount through its per-tensor views.

    sd = ckptfs.lazy_load("/mnt/ckpt/v100/model.pt", filter=lambda n: "layers.11." not in n,
                          dtype="bf16")
    len(sd), list(sd), "head.weight" in sd, sd.info("head.weight")   # nothing read yet
    w = sd["head.weight"]                                             # reads this tensor only

The contract: lazy_load reads only FILE@tensors/index.json (of VERSION@bf16/, @fp16/ or @fp32/
when dtype is given) and returns a read-only Mapping whose keys are the tensor names (flattened
key paths such as "module.layers.3.q.weight", in index.json order) that `filter` selects. A
tensor is read from its .npy file on first access and kept; len, iteration, `in`, info() and
nbytes() read nothing. Values are torch.Tensors when torch is importable, else numpy arrays
(bfloat16 then comes as its raw bits, a uint16 array; info(name)["dtype"] says "bfloat16").
Tied tensors appear under each of their names, as independent copies.
"""
import collections.abc
import errno
import fnmatch
import json
import os

import numpy as np

VIEW_SUFFIX = "@tensors"
_PRECISIONS = {"bf16": "bf16", "bfloat16": "bf16",
               "fp16": "fp16", "float16": "fp16", "half": "fp16",
               "fp32": "fp32", "float32": "fp32", "float": "fp32"}
_NO_TORCH = object()
_torch = None


def _import_torch():
    """torch, or None when it is not installed (imported on the first tensor load)."""
    global _torch
    if _torch is None:
        try:
            import torch
            _torch = torch
        except ImportError:
            _torch = _NO_TORCH
    return None if _torch is _NO_TORCH else _torch


def _precision(dtype):
    """"bf16" | "fp16" | "fp32" for a dtype given as a string, a torch or a numpy dtype."""
    if dtype is None:
        return None
    if isinstance(dtype, str):
        key = dtype.lower()
    elif type(dtype).__module__ == "torch":  # torch.bfloat16 -> "torch.bfloat16"
        key = str(dtype).split(".")[-1]
    else:
        try:
            key = np.dtype(dtype).name
        except TypeError:
            key = str(dtype)
    if key not in _PRECISIONS:
        raise ValueError("dtype %r is not one of the precision views: use torch.bfloat16, "
                         "torch.float16, torch.float32 or one of %s"
                         % (dtype, ", ".join(repr(k) for k in _PRECISIONS)))
    return _PRECISIONS[key]


def _selector(filter):
    """filter as a predicate: None (everything), a callable, or names / fnmatch patterns."""
    if filter is None:
        return lambda name: True
    if callable(filter):
        return filter
    patterns = [filter] if isinstance(filter, str) else list(filter)
    exact = set(patterns)
    return lambda name: name in exact or any(fnmatch.fnmatchcase(name, p) for p in patterns)


def _mount_root(path):
    """The ckptfs mount point above `path` (the nearest mount point among its parents)."""
    parent = os.path.dirname(path)
    while not os.path.ismount(parent):
        parent = os.path.dirname(parent)
    try:
        os.getxattr(parent, "user.ckptfs.pid")
    except OSError:
        raise ValueError("%s is not inside a ckptfs mount (the file system mounted at %s is "
                         "not ckptfs): lazy_load reads the per-tensor views of a mounted "
                         "ckptfs; mount the store with `ckptfs mount STORE MNT`, or use "
                         "torch.load for other files" % (path, parent)) from None
    return parent


def view_dir(path, dtype=None):
    """The FILE@tensors directory lazy_load reads for `path` (and `dtype`, see lazy_load)."""
    precision = _precision(dtype)
    path = os.path.realpath(path)
    if path.endswith(VIEW_SUFFIX):
        path = path[:-len(VIEW_SUFFIX)]
    root = _mount_root(path)
    parts = os.path.relpath(path, root).split(os.sep)
    if len(parts) < 2:
        raise ValueError("%s is not a file inside a version directory of the ckptfs mount %s "
                         "(expected MNT/VERSION/.../FILE)" % (path, root))
    if precision is not None:
        version = parts[0]
        for p in ("@bf16", "@fp16", "@fp32"):  # already a precision view: use the version
            if version.endswith(p):
                version = version[:-len(p)]
        parts[0] = version + "@" + precision
    return os.path.join(root, *parts) + VIEW_SUFFIX


class LazyStateDict(collections.abc.Mapping):
    """name -> tensor, each read from its .npy file in `view_dir` on first access."""

    def __init__(self, view_dir, index, select):
        self.view_dir = view_dir
        self.format = index.get("format")
        self._all = {t["name"]: t for t in index["tensors"]}
        self._entries = {n: t for n, t in self._all.items() if select(n)}
        self._loaded = {}

    def __getitem__(self, name):
        if name not in self._loaded:
            if name not in self._entries:
                why = " (left out by the filter)" if name in self._all else ""
                raise KeyError("%r%s" % (name, why))
            self._loaded[name] = self._load(self._entries[name])
        return self._loaded[name]

    def __contains__(self, name):
        return name in self._entries

    def __iter__(self):
        return iter(self._entries)

    def __len__(self):
        return len(self._entries)

    def __repr__(self):
        return "<ckptfs.lazy_load of %s: %d tensors, %d loaded>" % (
            self.view_dir, len(self), len(self._loaded))

    def info(self, name):
        """index.json's entry for `name`: {"name", "file", "dtype", "shape", "bytes", ...}."""
        return dict(self._entries[name])

    def nbytes(self, name=None):
        """The bytes of tensor `name` (of all the selected tensors when name is None)."""
        if name is None:
            return sum(t["bytes"] for t in self._entries.values())
        return self._entries[name]["bytes"]

    def loaded(self):
        """The names read so far."""
        return list(self._loaded)

    def load_all(self):
        """A plain dict of every selected tensor (reads those not read yet)."""
        return {name: self[name] for name in self}

    def _load(self, entry):
        file = os.path.join(self.view_dir, entry["file"])
        # A zero-byte array cannot be mapped; it is only a header anyway.
        arr = np.array(np.load(file, mmap_mode="r" if entry["bytes"] else None))
        torch = _import_torch()
        if torch is None:
            return arr
        if entry["dtype"] == "bfloat16":
            return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(arr)


def lazy_load(path, filter=None, dtype=None):
    """The tensors of checkpoint file `path` (a torch .pt or .safetensors file in a ckptfs
    mount, MNT/VERSION/.../FILE) as a read-only Mapping that reads each tensor on first access.

    filter: None (all), a callable(name) -> bool, or an iterable of names and fnmatch
    patterns (e.g. ["module.layers.1?.*", "head.weight"]); only the names it selects appear.
    dtype: None (as stored), or torch.bfloat16 / torch.float16 / torch.float32 or "bf16",
    "fp16", "fp32" (also "bfloat16", "float16", "half", "float32", "float"): floating
    tensors come converted, through MNT/VERSION@bf16/.../FILE@tensors/; others unchanged.

    Raises ValueError when path is not in a ckptfs mount (or dtype is not one of those), and
    FileNotFoundError when the file does not exist or ckptfs has no views of it.
    """
    vdir = view_dir(path, dtype)
    try:
        with open(os.path.join(vdir, "index.json")) as f:
            index = json.load(f)
    except FileNotFoundError:
        source = os.path.realpath(path)
        if source.endswith(VIEW_SUFFIX):
            source = source[:-len(VIEW_SUFFIX)]
        if not os.path.exists(source):
            raise FileNotFoundError(errno.ENOENT, "no such checkpoint file", source) from None
        raise FileNotFoundError(
            errno.ENOENT, "ckptfs has no per-tensor view of this file (%s does not exist): "
            "views exist only for torch .pt and .safetensors checkpoints ckptfs can parse; "
            "read it with torch.load instead" % vdir, source) from None
    return LazyStateDict(vdir, index, _selector(filter))
