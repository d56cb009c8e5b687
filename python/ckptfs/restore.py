"""Restoring a checkpoint file into tensors that already exist, one tensor at a time.

    result = ckptfs.load_into(model, "/mnt/ckpt/global_step2000/model.pt", prefix="module.")
    result.missing_keys, result.unexpected_keys            # as model.load_state_dict reports

model.load_state_dict(torch.load(path)) needs two models' memory: the loaded state dict and
the model. load_into needs the model and one tensor: it walks the file's tensors in file
order (ckptfs.lazy_load, memory-mapped: the source's pages sit in the mount's page cache,
reclaimable) and copies each into its destination with Tensor.copy_, which converts dtype
and device like load_state_dict does. copy_ without non_blocking returns once the copy is
done (for a CUDA destination it synchronizes with the stream after copying from the mapping),
so the source is released before the next tensor is mapped: at most one tensor is in flight.
"""
import collections
import collections.abc

from .lazy import _import_torch, lazy_load

IncompatibleKeys = collections.namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])


def _destinations(torch, target):
    """name -> tensor to copy into, and the name to report in errors."""
    if isinstance(target, torch.nn.Module):
        # state_dict() shares the parameters' and buffers' storage (detached): copying into
        # it under no_grad writes the module's own tensors.
        return target.state_dict(), type(target).__name__
    if isinstance(target, collections.abc.Mapping):
        return target, "state_dict"
    raise TypeError("load_into copies into a torch.nn.Module or a dict of tensors, not %s"
                    % type(target).__name__)


def load_into(target, path, strict=True, prefix="", dtype=None):
    """Copies the tensors of checkpoint file `path` (see ckptfs.lazy_load) into the tensors of
    `target`, a torch.nn.Module (its state_dict(): parameters and persistent buffers) or a
    dict of tensors, tensor by tensor; returns IncompatibleKeys(missing_keys, unexpected_keys).

    prefix: only the file's tensors whose names start with it are considered, without it
    ("module." for DeepSpeed's model states, "model." for Lightning's state_dict, ...).
    dtype: read through the precision view (see lazy_load); each value is converted to its
    destination's dtype anyway, as load_state_dict does.
    strict: as load_state_dict: missing or unexpected keys raise RuntimeError. A shape that
    differs always does. Every check runs before the first copy (from index.json alone), so an
    error leaves `target` untouched; an error while reading (EIO) leaves the tensors copied so
    far. Module load hooks (_load_from_state_dict) are not called: each destination is copied
    into as it is.
    """
    torch = _import_torch()
    if torch is None:
        raise ImportError("ckptfs.load_into copies into torch tensors: it needs torch")
    dest, what = _destinations(torch, target)
    sd = lazy_load(path, filter=(lambda n: n.startswith(prefix)) if prefix else None,
                   dtype=dtype, mmap=True)
    source = {name[len(prefix):]: name for name in sd}
    missing = [k for k in dest if k not in source]
    unexpected = [k for k in source if k not in dest]
    errors = []
    if strict:
        if missing:
            errors.append("Missing key(s) in state_dict: %s."
                          % ", ".join('"%s"' % k for k in missing))
        if unexpected:
            errors.append("Unexpected key(s) in state_dict: %s."
                          % ", ".join('"%s"' % k for k in unexpected))
    for key, name in source.items():
        if key not in dest:
            continue
        if not isinstance(dest[key], torch.Tensor):
            errors.append("%s is a %s in %s, not a tensor" % (key, type(dest[key]).__name__,
                                                              what))
            continue
        shape = list(sd.info(name)["shape"])
        if list(dest[key].shape) != shape:
            errors.append("size mismatch for %s: copying a param with shape %s from "
                          "checkpoint, the shape in current model is %s."
                          % (key, torch.Size(shape), dest[key].shape))
    if errors:
        raise RuntimeError("Error(s) in loading state_dict for %s:\n\t%s"
                           % (what, "\n\t".join(errors)))
    with torch.no_grad():
        for key, name in source.items():  # file order: the mount reads ahead sequentially
            if key in dest:
                value = sd[name]
                dest[key].copy_(value)
                del value  # unmapped before the next tensor is mapped
    return IncompatibleKeys(missing, unexpected)
