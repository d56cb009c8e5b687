"""scripts/bench/snapshot.sh's body: see there."""
import os
import statistics
import sys
import time

import mounted  # tests/fs: mounts that are always undone
import torch

import ckptfs

RUNS = int(sys.argv[1]) if len(sys.argv) > 1 else 3


def make_state():
    torch.manual_seed(0)
    d, layers = 1024, 7  # ~1 GiB with Adam's two moments
    state = {"embed": torch.randn(8192, d)}
    for i in range(layers):
        for name, shape in (("qkv", (3 * d, d)), ("proj", (d, d)), ("fc1", (4 * d, d)),
                            ("fc2", (d, 4 * d))):
            state["l%d.%s" % (i, name)] = torch.randn(*shape) * 0.02
    for k in list(state):
        state["adam.%s.exp_avg" % k] = torch.randn_like(state[k]) * 1e-3
        state["adam.%s.exp_avg_sq" % k] = torch.rand_like(state[k]) * 1e-6
    return state


def fsync_path(path):
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)


def main():
    mounted.check_prerequisites()
    state = make_state()
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    native = mounted.root_dir() + "/native"
    os.makedirs(native)
    m = mounted.Mount("bench", ["--seal-after", "0"]).mount()
    res = {k: [] for k in ("staged", "wait", "native", "mount", "stored")}
    try:
        for run in range(RUNS):
            for t in state.values():
                t.mul_(1 + 1e-6)  # all new bytes, as between two training checkpoints
            before = int(dict(l.split() for l in os.getxattr(m.mnt, "user.ckptfs.stats")
                              .decode().splitlines())["pack_bytes"])
            t0 = time.perf_counter()
            h = ckptfs.snapshot(state, m.path("snap%d" % run), 0, 1)
            h.staged()
            res["staged"].append(time.perf_counter() - t0)
            h.wait()
            res["wait"].append(time.perf_counter() - t0)
            after = int(dict(l.split() for l in os.getxattr(m.mnt, "user.ckptfs.stats")
                             .decode().splitlines())["pack_bytes"])
            res["stored"].append(after - before)
            t0 = time.perf_counter()
            p = os.path.join(native, "ckpt%d.pt" % run)
            torch.save(state, p)
            fsync_path(p)
            res["native"].append(time.perf_counter() - t0)
            os.unlink(p)
            os.mkdir(m.path("save%d" % run))
            t0 = time.perf_counter()
            p = m.path("save%d" % run, "model.pt")
            torch.save(state, p)
            fsync_path(p)
            res["mount"].append(time.perf_counter() - t0)
        med = {k: statistics.median(v) for k, v in res.items()}
        gb = nbytes / 1e9
        print("| measurement (%.2f GB state dict, %d runs, medians) | time | vs torch.save+fsync native |"
              % (gb, RUNS))
        print("|---|---|---|")
        for key, label in (("staged", "ckptfs.snapshot: staged() (tensors reusable)"),
                           ("wait", "ckptfs.snapshot: wait() (durable, visible)"),
                           ("native", "torch.save + fsync, native disk"),
                           ("mount", "torch.save + fsync into the mount")):
            print("| %s | %.2f s (%.2f GB/s) | %.2fx |" % (label, med[key], gb / med[key],
                                                         med[key] / med["native"]))
        print("| bytes stored per snapshot | %.3f GB (%.3fx of the state) | |"
              % (med["stored"] / 1e9, med["stored"] / nbytes))
    finally:
        sys.modules["ckptfs.snapshot"].close_engines()
        m.close()


if __name__ == "__main__":
    main()
