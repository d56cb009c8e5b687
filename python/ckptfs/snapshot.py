"""ckptfs.snapshot: sharded, asynchronous snapshots of a state dict straight from tensor memory
(host or CUDA) through libckptfs_snapshot.so (engine/snapshot/ckptfs_snapshot.h), ctypes only.

    h = ckptfs.snapshot(state_dict, "/mnt/ckpt/global_step100", rank=r, world_size=w,
                        shard_info={"layer.weight": (global_shape, offsets)})
    h.staged()      # returns once the tensors may be modified again
    h.committed()   # this rank's part is durable
    h.wait()        # every rank committed: the version is visible in the mount
    h.stats()       # the engine's counters (blocks_unchanged, bytes_copied, ...)

The library is found through $CKPTFS_SNAPSHOT_LIB, next to this package (pip install of a source
tree with a build), in the build directories of the source tree, where `cmake --install` or the
.deb put it (ckptfs/_installed.py, written by packaging/install_python.cmake), or by the
dynamic linker's search. One engine per (mount, rank, world_size) lives for the process,
so that the next snapshot knows the previous one's blocks (unchanged blocks are not copied).
Nested dicts are flattened with "." ("optimizer.state.0.exp_avg"). Values that are not tensors
(ints, floats, param_groups) are not saved yet.
"""
import ctypes
import glob
import json
import os
import threading

import numpy as np


class SnapshotError(RuntimeError):
    pass


class _Tensor(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_char_p), ("ndim", ctypes.c_int32),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("data", ctypes.c_void_p),
                ("device", ctypes.c_int32), ("nbytes", ctypes.c_uint64),
                ("global_shape", ctypes.POINTER(ctypes.c_int64)),
                ("offsets", ctypes.POINTER(ctypes.c_int64))]


class _Options(ctypes.Structure):
    _fields_ = [("block_bytes", ctypes.c_uint64), ("ring_bytes", ctypes.c_uint64),
                ("max_copy_bytes", ctypes.c_uint64), ("workers", ctypes.c_int32),
                ("codec", ctypes.c_char_p), ("backend", ctypes.c_int32),
                ("max_delta_chain", ctypes.c_uint32)]


class _Stats(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in (
        "tensors", "blocks", "blocks_unchanged", "bytes", "bytes_copied", "records_written",
        "record_bytes", "chunks_deduped")] + [
        (n, ctypes.c_double) for n in ("stage_seconds", "persist_seconds", "total_seconds")] + [
        (n, ctypes.c_uint64) for n in ("records_delta", "delta_bases_unreadable")]


_lib = None
_lib_lock = threading.Lock()


def _find_library():
    env = os.environ.get("CKPTFS_SNAPSHOT_LIB")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [os.path.join(here, "libckptfs_snapshot.so")]
    root = os.path.dirname(os.path.dirname(here))
    candidates += sorted(glob.glob(os.path.join(root, "build*", "libckptfs_snapshot.so")))
    try:
        from . import _installed
        candidates.append(_installed.SNAPSHOT_LIBRARY)
    except ImportError:
        pass
    for c in candidates:
        if os.path.exists(c):
            return c
    return "libckptfs_snapshot.so"  # the dynamic linker's search path (ld.so.conf, ldconfig)


def library():
    global _lib
    with _lib_lock:
        if _lib is None:
            path = _find_library()
            try:
                lib = ctypes.CDLL(path)
            except OSError as e:
                raise SnapshotError(
                    f"cannot load {path} ({e}): install ckptfs (packaging/README.md) or set "
                    "CKPTFS_SNAPSHOT_LIB") from None
            err = (ctypes.c_char_p, ctypes.c_size_t)
            lib.ckptfs_engine_open.restype = ctypes.c_void_p
            lib.ckptfs_engine_open.argtypes = (ctypes.c_char_p, ctypes.c_int32, ctypes.c_int32,
                                               ctypes.POINTER(_Options)) + err
            lib.ckptfs_engine_close.argtypes = (ctypes.c_void_p,)
            lib.ckptfs_engine_backend.restype = ctypes.c_char_p
            lib.ckptfs_engine_backend.argtypes = (ctypes.c_void_p,)
            lib.ckptfs_snapshot_start_with_metadata.restype = ctypes.c_void_p
            lib.ckptfs_snapshot_start_with_metadata.argtypes = (
                ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(_Tensor), ctypes.c_size_t,
                ctypes.c_char_p) + err
            for fn in ("wait_staged", "wait_committed", "wait"):
                f = getattr(lib, "ckptfs_snapshot_" + fn)
                f.restype = ctypes.c_int
                f.argtypes = (ctypes.c_void_p,) + err
            lib.ckptfs_snapshot_get_stats.argtypes = (ctypes.c_void_p, ctypes.POINTER(_Stats))
            lib.ckptfs_snapshot_free.argtypes = (ctypes.c_void_p,)
            lib.ckptfs_fingerprint.argtypes = (ctypes.c_void_p, ctypes.c_uint64,
                                               ctypes.POINTER(ctypes.c_uint64))
            lib.ckptfs_cuda_built.restype = ctypes.c_int32
            _lib = lib
        return _lib


def _errbuf():
    return ctypes.create_string_buffer(2048)


def fingerprint(data):
    """The block fingerprint (engine/snapshot/fingerprint.h) of bytes or a numpy array, as
    (lo, hi)."""
    buf = np.frombuffer(bytes(data), dtype=np.uint8) if not isinstance(data, np.ndarray) \
        else np.ascontiguousarray(data).view(np.uint8).reshape(-1)
    out = (ctypes.c_uint64 * 2)()
    library().ckptfs_fingerprint(buf.ctypes.data if buf.size else None, buf.size, out)
    return out[0], out[1]


# ---- Locating the daemon --------------------------------------------------------------------

def _mount_of(path):
    """(mount point, store) of the ckptfs mount that holds `path`, from /proc/self/mountinfo."""
    path = os.path.realpath(path)
    best = None
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields = right.split(" ")
            if fields[0] != "fuse.ckptfs":
                continue
            point = left.split(" ")[4].replace("\\040", " ")
            if (path == point or path.startswith(point.rstrip("/") + "/")) and \
                    (best is None or len(point) > len(best[0])):
                store = fields[1][len("ckptfs:"):] if fields[1].startswith("ckptfs:") else None
                best = (point, store)
    if best is None:
        raise SnapshotError("%s is not inside a ckptfs mount" % path)
    return best


def _control_socket(mountpoint, store):
    try:
        return os.getxattr(mountpoint, "user.ckptfs.control").decode()
    except OSError:
        if store:
            return os.path.join(store, "control.sock")
        raise SnapshotError("the mount at %s names no control socket" % mountpoint)


# ---- Engines ----------------------------------------------------------------------------------

class _Engine:
    def __init__(self, target, rank, world_size, options):
        lib = library()
        opts = _Options(options.get("block_bytes", 0), options.get("ring_bytes", 0),
                        options.get("max_copy_bytes", 0), options.get("workers", 0),
                        options["codec"].encode() if options.get("codec") else None,
                        {"auto": 0, "cpu": 1, "cuda": 2}[options.get("backend", "auto")],
                        options.get("max_delta_chain", 0))
        err = _errbuf()
        self.handle = lib.ckptfs_engine_open(target.encode(), rank, world_size,
                                             ctypes.byref(opts), err, len(err))
        if not self.handle:
            raise SnapshotError(err.value.decode(errors="replace"))
        self.backend = lib.ckptfs_engine_backend(self.handle).decode()

    def close(self):
        if self.handle:
            library().ckptfs_engine_close(self.handle)
            self.handle = None


_engines = {}
_engines_lock = threading.Lock()


def _engine(target, rank, world_size, options):
    key = (target, rank, world_size, tuple(sorted(options.items())))
    with _engines_lock:
        e = _engines.get(key)
        if e is None:
            e = _engines[key] = _Engine(target, rank, world_size, options)
        return e


def close_engines():
    """Closes every engine of this process (each waits for its snapshot in flight)."""
    with _engines_lock:
        for e in _engines.values():
            e.close()
        _engines.clear()


# ---- Tensors ----------------------------------------------------------------------------------

_TORCH_DTYPES = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16",
                 "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8",
                 "bool": "BOOL"}
_NP_DTYPES = {np.dtype(np.float64): "F64", np.dtype(np.float32): "F32",
              np.dtype(np.float16): "F16", np.dtype(np.int64): "I64", np.dtype(np.int32): "I32",
              np.dtype(np.int16): "I16", np.dtype(np.int8): "I8", np.dtype(np.uint8): "U8",
              np.dtype(np.bool_): "BOOL"}


def _is_tensor(obj):
    return isinstance(obj, np.ndarray) or (type(obj).__module__.startswith("torch")
                                           and hasattr(obj, "data_ptr"))


def _has_tensor(obj):
    if _is_tensor(obj):
        return True
    if isinstance(obj, dict):
        return any(_has_tensor(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return any(_has_tensor(v) for v in obj)
    return False


def _flatten(obj, prefix, tensors, extra):
    """Tensors by key path ("optimizer.state.0.exp_avg": dict keys and list indices joined by
    '.'); every subtree without a tensor (step counters, param_groups) goes whole into extra."""
    name = prefix[:-1]
    if _is_tensor(obj):
        tensors[name] = obj
    elif isinstance(obj, dict) and _has_tensor(obj):
        for k, v in obj.items():
            _flatten(v, "%s%s." % (prefix, k), tensors, extra)
    elif isinstance(obj, (list, tuple)) and _has_tensor(obj):
        for i, v in enumerate(obj):
            _flatten(v, "%s%d." % (prefix, i), tensors, extra)
    else:
        extra[name] = obj


def _extra_json(extra):
    """The non-tensor leaves as JSON (kept in each rank file's __metadata__["ckptfs.extra"]).
    Only JSON's types (and tuples, saved as lists) are accepted: nothing is pickled."""
    try:
        return json.dumps(extra, allow_nan=True)
    except (TypeError, ValueError) as e:
        raise SnapshotError("the state dict's non-tensor values must be numbers, strings, "
                            "bools, None, lists or dicts of them (%s); convert the others "
                            "first" % e) from None


def _describe(name, t, info, keep):
    if isinstance(t, np.ndarray):
        a = np.ascontiguousarray(t)
        dtype = _NP_DTYPES.get(a.dtype)
        if dtype is None:
            raise SnapshotError("%s: dtype %s is not supported" % (name, a.dtype))
        ptr, device, nbytes, shape = a.ctypes.data, -1, a.nbytes, a.shape
        keep.append(a)
    else:
        a = t.detach()
        if not a.is_contiguous():
            a = a.contiguous()
        dtype = _TORCH_DTYPES.get(str(a.dtype).replace("torch.", ""))
        if dtype is None:
            raise SnapshotError("%s: dtype %s is not supported" % (name, a.dtype))
        device = -1 if a.device.type == "cpu" else (a.device.index or 0)
        if a.device.type not in ("cpu", "cuda"):
            raise SnapshotError("%s: tensors on %s are not supported" % (name, a.device))
        ptr, nbytes, shape = a.data_ptr(), a.numel() * a.element_size(), tuple(a.shape)
        keep.append(a)
    nd = len(shape)
    shape_arr = (ctypes.c_int64 * max(nd, 1))(*shape)
    keep.append(shape_arr)
    gs = off = None
    if info is not None:
        global_shape, offsets = info
        if len(global_shape) != nd or len(offsets) != nd:
            raise SnapshotError("%s: shard_info must give global shape and offsets of %d dims"
                                % (name, nd))
        gs = (ctypes.c_int64 * max(nd, 1))(*global_shape)
        off = (ctypes.c_int64 * max(nd, 1))(*offsets)
        keep += [gs, off]
    cname = name.encode()
    keep.append(cname)
    return _Tensor(cname, dtype.encode(), nd, shape_arr, ptr or None, device, nbytes, gs, off)


class Snapshot:
    """The handle ckptfs.snapshot returns."""

    def __init__(self, engine, handle, keep):
        self._engine = engine
        self._handle = handle
        self._keep = keep  # tensor memory must stay alive until staged

    def _call(self, fn):
        err = _errbuf()
        if getattr(library(), fn)(self._handle, err, len(err)) != 0:
            raise SnapshotError(err.value.decode(errors="replace"))

    def staged(self):
        """Returns once the tensors may be modified again."""
        self._call("ckptfs_snapshot_wait_staged")
        self._keep = None
        return self

    def committed(self):
        self._call("ckptfs_snapshot_wait_committed")
        return self

    def wait(self):
        """Returns once the version is durable and visible (all ranks committed)."""
        self._call("ckptfs_snapshot_wait")
        self._keep = None
        return self

    def stats(self):
        s = _Stats()
        library().ckptfs_snapshot_get_stats(self._handle, ctypes.byref(s))
        return {name: getattr(s, name) for name, _ in _Stats._fields_}

    @property
    def backend(self):
        return self._engine.backend

    def __del__(self):
        if getattr(self, "_handle", None) and library is not None:
            library().ckptfs_snapshot_free(self._handle)
            self._handle = None


def snapshot(state_dict, path, rank=0, world_size=1, shard_info=None, **options):
    """Starts a snapshot of this rank's `state_dict` into version `path` (a top-level
    directory of a ckptfs mount) and returns a Snapshot handle at once. shard_info maps a
    tensor name to (global_shape, offsets) for partitioned tensors. options: block_bytes,
    ring_bytes, max_copy_bytes, workers, codec, backend ("auto", "cpu", "cuda"),
    max_delta_chain (1: store no deltas), and target
    ("unix:SOCKET" or "dir:PATH", instead of finding the mount's daemon)."""
    target = options.pop("target", None)
    if target is None:
        mountpoint, store = _mount_of(os.path.dirname(os.path.abspath(path)) or "/")
        rel = os.path.relpath(os.path.abspath(path), mountpoint)
        if rel.startswith("..") or "/" in rel or rel == ".":
            raise SnapshotError("%s must be a top-level directory of the mount %s"
                                % (path, mountpoint))
        target = "unix:" + _control_socket(mountpoint, store)
        version = rel
    else:
        version = os.path.basename(os.path.normpath(path))
    tensors, extra = {}, {}
    _flatten(state_dict, "", tensors, extra)
    shard_info = shard_info or {}
    keep = []
    descs = [_describe(n, t, shard_info.get(n), keep) for n, t in tensors.items()]
    if any(d.device >= 0 for d in descs):
        import torch
        torch.cuda.synchronize()  # the engine's stream must see the finished tensors
    metadata = json.dumps({"ckptfs.extra": _extra_json(extra)}) if extra else None
    engine = _engine(target, rank, world_size, options)
    arr = (_Tensor * max(len(descs), 1))(*descs)
    err = _errbuf()
    handle = library().ckptfs_snapshot_start_with_metadata(
        engine.handle, version.encode(), arr, len(descs),
        metadata.encode() if metadata else None, err, len(err))
    if not handle:
        raise SnapshotError(err.value.decode(errors="replace"))
    return Snapshot(engine, handle, keep)
