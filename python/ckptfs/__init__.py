"""ckptfs: Python helpers for a ckptfs checkpoint mount.

    h = ckptfs.snapshot(state_dict, "/mnt/ckpt/global_step100", rank=r, world_size=w)
    h.staged()   # tensors may be modified again
    h.wait()     # durable, visible in the mount
    part = ckptfs.load_sharded("/mnt/ckpt/global_step100", rank=r, world_size=new_w)
    sd = ckptfs.lazy_load("/mnt/ckpt/v1/model.pt", filter=["module.*"], dtype="bf16")
    sd["module.head.weight"]   # read from the mount at access (mapped); sd keeps no tensor
    sd.get_slice("module.embed.weight")[0:1000]   # reads only those rows
    ckptfs.load_into(model, "/mnt/ckpt/v1/model.pt", prefix="module.")   # one tensor at a time
"""
from .lazy import lazy_load  # noqa: F401
from .restore import IncompatibleKeys, load_into  # noqa: F401
from .sharded import load_sharded, read_safetensors, split_state_dict  # noqa: F401
from .snapshot import SnapshotError, fingerprint, snapshot  # noqa: F401


def _version():
    # A source checkout (PYTHONPATH=python) reads the tree's VERSION; an installed package (pip,
    # the .deb) its metadata. Both come from the one VERSION file, as `ckptfs --version` does.
    import os
    here = os.path.dirname(os.path.abspath(__file__))
    tree_version = os.path.join(here, "..", "VERSION")
    if os.path.exists(os.path.join(here, "..", "pyproject.toml")) and os.path.exists(tree_version):
        with open(tree_version) as f:
            return f.read().strip()
    from importlib.metadata import version
    return version("ckptfs")


__version__ = _version()
