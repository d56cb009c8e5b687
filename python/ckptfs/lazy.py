"""Lazy, selective loads of a checkpoint file from a ckptfs mount through its per-tensor views.

    sd = ckptfs.lazy_load("/mnt/ckpt/v100/model.pt", filter=lambda n: "layers.11." not in n,
                          dtype="bf16")
    len(sd), list(sd), "head.weight" in sd, sd.info("head.weight")   # nothing read yet
    w = sd["head.weight"]                           # this tensor, memory-mapped (mmap=True)
    rows = sd.get_slice("embed.weight")[1000:2000]  # reads only those rows' chunks

The contract (the semantics of safetensors' safe_open): lazy_load reads only
FILE@tensors/index.json (of VERSION@bf16/, @fp16/ or @fp32/ when dtype is given) and returns a
read-only Mapping whose keys are the tensor names (flattened key paths such as
"module.layers.3.q.weight", in index.json order) that `filter` selects. len, iteration, `in`,
info() and nbytes() read nothing. The mapping holds no tensor it has returned: each access
makes a new value, and a value the caller drops is freed.

A value is, by the `mmap` option:
- mmap=True (default): a copy-on-write private mapping of the tensor's .npy file. Nothing is
  read until the pages are touched; the pages live in the mount's page cache, where the
  kernel can reclaim them; writes to the value are private (they never reach the file). The
  mapping holds no open file descriptor (with torch; numpy's memmap, used without torch, keeps
  one per value). Touching a mapped value after its mount is gone raises SIGBUS.
- mmap=False: an in-memory copy, read with read(2) into a new buffer.

Values are torch.Tensors when torch is importable, else numpy arrays (bfloat16 then comes as
its raw bits, a uint16 array; info(name)["dtype"] says "bfloat16"). A dtype this torch lacks
(uint16/32/64 in torch < 2.3) comes as a numpy array; float8 types as their raw bits (uint8)
unless torch has them. Tied tensors appear under each of their names, as independent values.

get_slice(name)[rows] reads only the bytes of the rows asked for: the handle is opened with
O_DIRECT, for which the daemon prefetches nothing beyond the ranges read (docs/views.md).
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
# index.json dtypes numpy has no type for: the .npy holds their raw bits (docs/views.md).
_RAW_BITS = {"bfloat16": np.uint16, "float8_e4m3fn": np.uint8, "float8_e5m2": np.uint8}
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
    if parts == ["."] or os.path.isdir(path):
        raise ValueError("%s is not a file inside a version directory of the ckptfs mount %s "
                         "(expected MNT/VERSION/.../FILE, or MNT/FILE)" % (path, root))
    if precision is not None:
        if len(parts) == 1:  # a file at the mount root (a file version): FILE@bf16@tensors
            return os.path.join(root, parts[0]) + "@" + precision + VIEW_SUFFIX
        version = parts[0]
        for p in ("@bf16", "@fp16", "@fp32"):  # already a precision view: use the version
            if version.endswith(p):
                version = version[:-len(p)]
        parts[0] = version + "@" + precision
    return os.path.join(root, *parts) + VIEW_SUFFIX


def _raw_dtype(entry):
    """The numpy dtype of the .npy's data (raw bits for bfloat16 and float8)."""
    name = entry["dtype"]
    return np.dtype(_RAW_BITS.get(name, name))


def _read_exactly(fd, buf, offset):
    """Fills the writable byte buffer `buf` from `offset` of `fd` (read(2) may return less)."""
    view = memoryview(buf)
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n == 0:
            raise OSError(errno.EIO, "per-tensor view ended %d bytes early" % (len(view) - done))
        done += n


def _as_value(arr, dtype_name):
    """A numpy array of raw .npy data as the value lazy_load returns (see the module doc)."""
    torch = _import_torch()
    if torch is None:
        return arr
    if dtype_name in _RAW_BITS:
        bits = torch.from_numpy(arr.view(np.int16) if arr.dtype == np.uint16 else arr)
        real = getattr(torch, dtype_name, None)
        return bits.view(real) if isinstance(real, torch.dtype) else bits
    try:
        return torch.from_numpy(arr)
    except TypeError:  # a dtype this torch does not have (uint16/32/64 before torch 2.3)
        return arr


class TensorSlice:
    """One tensor of a lazy_load, read a range of rows at a time: slice[a:b], slice[i],
    slice[a:b, c:d], ... (safetensors' get_slice). A leading int or slice bounds the rows read
    (a step reads the rows from its first to its last); anything else (an Ellipsis, None, a
    list) reads the whole tensor. The result is a new contiguous value (never a mapping)."""

    def __init__(self, file, entry):
        self.file = file
        self._entry = entry

    def get_shape(self):
        return list(self._entry["shape"])

    def get_dtype(self):
        """The dtype's name in index.json ("float32", "bfloat16", ...)."""
        return self._entry["dtype"]

    def __len__(self):
        shape = self._entry["shape"]
        if not shape:
            raise TypeError("len() of a 0-d tensor")
        return shape[0]

    def _rows(self, first):
        """[lo, hi) of the rows the leading index `first` needs, and `first` relative to lo;
        None when it does not bound the rows."""
        n = self._entry["shape"][0]
        if isinstance(first, (int, np.integer)) and not isinstance(first, bool):
            i = int(first) + (n if first < 0 else 0)
            if not 0 <= i < n:
                raise IndexError("index %d is out of bounds for dimension 0 with size %d"
                                 % (first, n))
            return i, i + 1, 0
        if isinstance(first, slice):
            rows = range(*first.indices(n))
            if not rows:
                return 0, 0, slice(0, 0)
            lo, hi = min(rows), max(rows) + 1
            stop = rows.stop - lo
            return lo, hi, slice(rows.start - lo, stop if stop >= 0 else None, rows.step)
        return None

    def __getitem__(self, index):
        entry = self._entry
        shape = entry["shape"]
        index = index if isinstance(index, tuple) else (index,)
        bounded = self._rows(index[0]) if shape and index else None
        if bounded is None:
            lo, hi, rest = 0, shape[0] if shape else 1, index
        else:
            lo, hi, first = bounded
            rest = (first,) + index[1:]
        rows = hi - lo
        dtype = _raw_dtype(entry)
        block = np.empty([rows] + shape[1:] if shape else [], dtype=dtype)
        if block.nbytes:
            row_bytes = entry["bytes"] // shape[0] if shape else entry["bytes"]
            try:
                fd = os.open(self.file, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
            except OSError as e:  # no O_DIRECT: correct, but the daemon may read ahead
                if e.errno != errno.EINVAL:
                    raise
                fd = os.open(self.file, os.O_RDONLY)
            try:
                _read_exactly(fd, block.reshape(-1).view(np.uint8),
                              entry["header_bytes"] + lo * row_bytes)
            finally:
                os.close(fd)
        out = np.asarray(block[rest])  # an int per dimension gives a numpy scalar
        if not out.flags.c_contiguous:
            out = out.copy()
        return _as_value(out, entry["dtype"])

    def __repr__(self):
        return "<ckptfs slice of %s: %s %s>" % (self.file, self.get_dtype(), self.get_shape())


class LazyStateDict(collections.abc.Mapping):
    """name -> tensor, each read from its .npy file in `view_dir` at each access; holds none of
    the values it returns (see the module doc)."""

    def __init__(self, view_dir, index, select, mmap=True):
        self.view_dir = view_dir
        self.format = index.get("format")
        self.mmap = bool(mmap)
        self._all = {t["name"]: t for t in index["tensors"]}
        self._entries = {n: t for n, t in self._all.items() if select(n)}
        self._read = {}  # names accessed so far (names only: no tensor is kept)

    def _entry(self, name):
        if name not in self._entries:
            why = " (left out by the filter)" if name in self._all else ""
            raise KeyError("%r%s" % (name, why))
        return self._entries[name]

    def __getitem__(self, name):
        entry = self._entry(name)
        value = self._load(entry)
        self._read[name] = None
        return value

    def get_tensor(self, name):
        """self[name] (safetensors' safe_open spelling)."""
        return self[name]

    def get_slice(self, name):
        """A TensorSlice of tensor `name`: get_slice(name)[a:b] reads rows a..b-1 only."""
        return TensorSlice(os.path.join(self.view_dir, self._entry(name)["file"]),
                           self._entry(name))

    def __contains__(self, name):
        return name in self._entries

    def __iter__(self):
        return iter(self._entries)

    def __len__(self):
        return len(self._entries)

    def __enter__(self):  # `with ckptfs.lazy_load(...) as f:` as with safe_open
        return self

    def __exit__(self, *exc):
        return False

    def __repr__(self):
        return "<ckptfs.lazy_load of %s: %d tensors, %d read, %s>" % (
            self.view_dir, len(self), len(self._read), "mmap" if self.mmap else "copies")

    def info(self, name):
        """index.json's entry for `name`: {"name", "file", "dtype", "shape", "bytes", ...}."""
        return dict(self._entries[name])

    def nbytes(self, name=None):
        """The bytes of tensor `name` (of all the selected tensors when name is None)."""
        if name is None:
            return sum(t["bytes"] for t in self._entries.values())
        return self._entries[name]["bytes"]

    def loaded(self):
        """The names accessed so far (the mapping keeps the names, not the values)."""
        return list(self._read)

    def load_all(self):
        """A plain dict of every selected tensor (all of them at once: the caller holds them)."""
        return {name: self[name] for name in self}

    def _load(self, entry):
        file = os.path.join(self.view_dir, entry["file"])
        dtype = _raw_dtype(entry)
        shape = tuple(entry["shape"])
        start, nbytes = entry["header_bytes"], entry["bytes"]
        if nbytes == 0:  # a zero-byte array cannot be mapped (nor needs reading)
            return _as_value(np.empty(shape, dtype=dtype), entry["dtype"])
        if self.mmap:
            torch = _import_torch()
            if torch is None or not hasattr(torch, "UntypedStorage"):  # torch < 1.13
                arr = np.memmap(file, dtype=dtype, mode="c", offset=start, shape=shape)
            else:
                # torch maps the file MAP_PRIVATE and closes it: no descriptor per value.
                storage = torch.UntypedStorage.from_file(file, False, start + nbytes)
                whole = torch.empty(0, dtype=torch.uint8).set_(storage).numpy()
                arr = whole[start:start + nbytes].view(dtype).reshape(shape)
            return _as_value(arr, entry["dtype"])
        arr = np.empty(shape, dtype=dtype)
        fd = os.open(file, os.O_RDONLY)
        try:
            _read_exactly(fd, arr.reshape(-1).view(np.uint8), start)
        finally:
            os.close(fd)
        return _as_value(arr, entry["dtype"])


def lazy_load(path, filter=None, dtype=None, mmap=True):
    """The tensors of checkpoint file `path` (a torch .pt or .safetensors file in a ckptfs
    mount, MNT/VERSION/.../FILE) as a read-only Mapping that reads a tensor at each access
    and keeps none (safetensors' safe_open semantics; see the module doc).

    filter: None (all), a callable(name) -> bool, or an iterable of names and fnmatch
    patterns (e.g. ["module.layers.1?.*", "head.weight"]); only the names it selects appear.
    dtype: None (as stored), or torch.bfloat16 / torch.float16 / torch.float32 or "bf16",
    "fp16", "fp32" (also "bfloat16", "float16", "half", "float32", "float"): floating
    tensors come converted, through MNT/VERSION@bf16/.../FILE@tensors/ (a file at the mount
    root: MNT/FILE@bf16@tensors/); others unchanged.
    mmap: True (default): values are copy-on-write mappings of the per-tensor files (pages in
    the mount's page cache, reclaimable); False: in-memory copies.

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
    return LazyStateDict(vdir, index, _selector(filter), mmap=mmap)
