#!/usr/bin/python3
"""Test data for engine/format/torch_pickle_test.cc. Run with Debian's /usr/bin/python3 (torch).

  torch_pickle_testdata.py write DIR     torch.save checkpoints DIR/NAME.pt, their data.pkl as
                                         DIR/NAME.pkl, and what torch.load finds in each as
                                         DIR/NAME.txt (lines below); one NAME per line on stdout
  torch_pickle_testdata.py describe PT   the lines for one torch.save file
  torch_pickle_testdata.py evil DIR      pickles that must not be run: DIR/*.pkl

Lines, in pickle order:
  S <key> <dtype> <numel> <location>                   each storage, where its key first appears
  T <path> <key> <dtype> <offset> <shape> <stride>     each path to a tensor; shape and stride
                                                       are comma-separated ("-" when 0-d)
Fields are tab-separated. Paths join dict keys (str(k) for str and int, repr(k) for bool, None
and float) and list/tuple indices with '.', through dicts, lists and tuples only.

The reference is torch.load itself, with the storages' bytes left out: data.pkl is unpickled
by pickle.Unpickler with torch.load's persistent_load semantics (the first id with a key
defines the storage) and torch's own classes and _rebuild_* functions, each storage allocated
one element longer than its numel, so that every storage has its own data pointer (which tells
which storage a tensor views). The result is checked against torch.load of the file.
"""
import argparse
import collections
import io
import os
import pickle
import sys
import zipfile


class Holder:
    """An object that is not a dict, list or tuple: opaque to the parser."""

    def __init__(self, t):
        self.t = t


class Evil:
    def __reduce__(self):
        return (os.system, ("echo ckptfs-pickle-was-executed > /tmp/ckptfs_pwned",))


def data_pkl(path):
    with zipfile.ZipFile(path) as z:
        (name,) = [n for n in z.namelist() if n.endswith("/data.pkl") or n == "data.pkl"]
        return z.read(name)


class Reference(pickle.Unpickler):
    def __init__(self, data):

        super().__init__(io.BytesIO(data), encoding="utf-8")
        self.storages = {}  # key -> typed storage
        self.lines = []
        self.key_of = {}  # data_ptr -> key

    def persistent_load(self, pid):
        typename, storage_type, key, location, numel = pid
        assert typename == "storage"
        if key in self.storages:
            return self.storages[key]
        dtype = torch.uint8 if storage_type is torch.UntypedStorage else storage_type.dtype
        storage = torch.TypedStorage(numel + 1, dtype=dtype)
        self.storages[key] = storage
        self.key_of[storage.data_ptr()] = key
        self.lines.append(f"S\t{key}\t{str(dtype)[6:]}\t{numel}\t{location}")
        return storage


def key_text(k):
    if isinstance(k, bool) or k is None or isinstance(k, float):
        return repr(k)
    if isinstance(k, (str, int)):
        return str(k)
    if isinstance(k, bytes):
        return k.decode("utf-8", "replace")
    return "?"


def walk(obj, path, depth, out, on_path):
    if isinstance(obj, torch.Tensor):
        out.append((path, obj))
        return
    if type(obj) in (dict, collections.OrderedDict):
        items = [(key_text(k), v) for k, v in obj.items()]
    elif type(obj) in (list, tuple):
        items = [(str(i), v) for i, v in enumerate(obj)]
    else:
        return
    if id(obj) in on_path:
        return
    on_path.add(id(obj))
    for k, v in items:
        walk(v, k if depth == 0 else f"{path}.{k}", depth + 1, out, on_path)
    on_path.discard(id(obj))


def dims(xs):
    return ",".join(str(x) for x in xs) if len(xs) else "-"


def describe(path):
    ref = Reference(data_pkl(path))
    tensors = []
    walk(ref.load(), "", 0, tensors, set())
    lines = list(ref.lines)
    for p, t in tensors:
        key = ref.key_of[t.storage().data_ptr()]
        lines.append(f"T\t{p}\t{key}\t{str(t.dtype)[6:]}\t{t.storage_offset()}\t"
                     f"{dims(t.shape)}\t{dims(t.stride())}")
    # The same paths and layouts as torch.load gives.
    loaded = []
    walk(torch.load(path), "", 0, loaded, set())
    assert [p for p, _ in loaded] == [p for p, _ in tensors], path
    for (_, a), (_, b) in zip(loaded, tensors):
        assert (a.dtype, a.shape, a.stride(), a.storage_offset()) == (
            b.dtype, b.shape, b.stride(), b.storage_offset()), path
    return lines


def samples():
    """name -> (object, pickle protocol)."""
    torch.manual_seed(0)
    out = {}
    mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))
    out["state_dict"] = (mlp.state_dict(), 2)

    opt = torch.optim.Adam(mlp.parameters(), lr=1e-3)
    for _ in range(2):
        loss = mlp(torch.randn(5, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    out["adam"] = ({"model": mlp.state_dict(), "optimizer": opt.state_dict(), "step": 2}, 2)

    nested = {
        "a": {"b": [torch.ones(2), {"c": torch.zeros(3)}], 3: torch.arange(4), "x": 1},
        "s": "text", "l": [1, 2, [3, (4, torch.full((2,), 7.0))]], "f": 1.5, "n": None,
        "big": 2**70, "neg": -5, "bytes": b"\x00\xff", True: torch.ones(1), None: torch.ones(1),
        2.5: torch.ones(1), -1: torch.ones(1), "": {"": torch.ones(1)},
        "unicode \u00e9\u4e2d": torch.ones(1),
    }
    out["nested"] = (nested, 2)
    for proto in (1, 3, 4, 5):
        out[f"nested_protocol{proto}"] = (nested, proto)

    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(10, 6)
            self.head = torch.nn.Linear(6, 10, bias=False)
            self.head.weight = self.emb.weight

    out["tied"] = (Tied().state_dict(), 2)

    base = torch.randn(8, 10)
    views = {
        "base": base, "row": base[3], "col": base[:, 2], "t": base.t(),
        "slice": base[2:5, 1:7:2], "flat": base.view(-1)[5:17], "elem": base[7, 9],
        "expand": torch.ones(3, 1).expand(3, 4), "empty_view": base[8:],
    }
    out["views"] = (views, 2)

    dtypes = {str(dt)[6:]: torch.ones(3, 2).to(dt) for dt in (
        torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
        torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128)}
    dtypes.update({"scalar": torch.tensor(5), "scalar_bf16": torch.tensor(1.5, dtype=torch.bfloat16),
                   "empty": torch.zeros(0), "empty3": torch.zeros(3, 0, 2, dtype=torch.float16)})
    out["dtypes"] = (dtypes, 2)

    model = mlp.state_dict()
    deepspeed = {
        "module": model, "optimizer": opt.state_dict(), "lr_scheduler": {"last_epoch": 5},
        "global_steps": 5, "global_samples": 40, "skipped_steps": 0, "ds_version": "0.9.2",
        "buffer_names": [], "dtype": torch.float16,
        "param_shapes": [collections.OrderedDict((k, v.shape) for k, v in model.items())],
        "args": argparse.Namespace(lr=0.1, name="x"), "holder": Holder(torch.ones(5)),
        "mp_world_size": 1,
    }
    out["deepspeed"] = (deepspeed, 2)

    shared = torch.randn(4)
    with_attr = torch.ones(2)
    with_attr.note = "has python state"
    out["objects"] = ({
        "a": shared, "b": shared, "list": [shared, shared], "param": torch.nn.Parameter(torch.ones(3)),
        "params": list(mlp.parameters()), "with_attr": with_attr, "tuple": (torch.ones(1),),
    }, 2)
    out["many"] = ({f"layer{i}.weight": torch.full((2,), float(i)) for i in range(300)}, 2)
    out["root_tensor"] = (torch.arange(6).view(2, 3), 2)
    out["root_list"] = ([torch.ones(1), 5, [torch.zeros(2)]], 2)
    cycle = [torch.ones(1)]
    cycle.append(cycle)
    cyclic = {"list": cycle, "after": torch.zeros(1)}
    cyclic["self"] = cyclic
    out["cycle"] = (cyclic, 2)
    return out


def write(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    for name, (obj, proto) in samples().items():
        pt = os.path.join(out_dir, name + ".pt")
        torch.save(obj, pt, pickle_protocol=proto)
        with open(os.path.join(out_dir, name + ".pkl"), "wb") as f:
            f.write(data_pkl(pt))
        with open(os.path.join(out_dir, name + ".txt"), "w") as f:
            f.write("".join(line + "\n" for line in describe(pt)))
        print(name)


def evil(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    for proto in (2, 4):
        with open(os.path.join(out_dir, f"os_system_{proto}.pkl"), "wb") as f:
            pickle.dump({"w": Evil(), "ok": [1, 2]}, f, protocol=proto)


torch = None  # imported by main() unless the command is `evil`, which needs no torch


def main():
    global torch
    cmd, arg = sys.argv[1], sys.argv[2]
    if cmd == "evil":
        return evil(arg)
    import torch
    if cmd == "describe":
        print("\n".join(describe(arg)))
    else:
        {"write": write}[cmd](arg)


if __name__ == "__main__":
    main()
