#!/usr/bin/python3
"""The daemon's CPU and memory per GB on the data path (scripts/bench/datapath.sh).

A quicker, narrower companion to fs.sh for measuring changes to the write and read paths:
two fp32 torch.save files (~1 GiB of tensors each; the second is the first scaled by
(1 + 1e-6), as between two training steps, so it is stored as deltas) are generated once on
native disk, then each run:

  write    a fresh store, dd bs=1M of version 1 into the mount, `ckptfs sync`; then version 2
           (deltas against version 1), sync. Daemon CPU seconds, minor page faults and peak RSS
           (VmHWM) per phase.
  read     a fresh daemon after drop_caches, dd bs=1M of version 2 to /dev/null (cold), then
           of version 1.

Prints medians over runs: daemon CPU-s per GB, page faults per MiB, peak RSS, MB/s.
Run as root with /usr/bin/python3.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

import torch

GB = 1e9
CLK = os.sysconf("SC_CLK_TCK")


def proc_stat(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK, int(fields[7])


def hwm(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def reset_hwm(pid):
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def make_files(d, gib):
    paths = [os.path.join(d, f"v{i}.pt") for i in (1, 2)]
    if all(os.path.exists(p) for p in paths):
        return paths
    gen = torch.Generator().manual_seed(0)
    n = int(gib * (1 << 30) / 4 / 64)
    state = {f"layer{i}.weight": torch.randn(n, generator=gen) * 0.02 for i in range(64)}
    torch.save(state, paths[0])
    with torch.no_grad():
        for t in state.values():
            t.mul_(1.000001)
    torch.save(state, paths[1])
    return paths


class Daemon:
    def __init__(self, args, store, mnt):
        self.args, self.store, self.mnt = args, store, mnt
        subprocess.run([args.bin, "mount", store, mnt, "--cache-size", args.cache_size,
                        "--inflight", args.inflight], check=True)
        self.pid = int(os.getxattr(mnt, "user.ckptfs.pid"))

    def measure(self, fn, nbytes):
        reset_hwm(self.pid)
        cpu0, flt0 = proc_stat(self.pid)
        t = time.monotonic()
        fn()
        el = time.monotonic() - t
        cpu1, flt1 = proc_stat(self.pid)
        return dict(cpu_gb=(cpu1 - cpu0) / (nbytes / GB), flt_mib=(flt1 - flt0) / (nbytes / 2**20),
                    rss=hwm(self.pid) / 2**20, mbs=nbytes / el / 1e6)

    def umount(self):
        subprocess.run([self.args.bin, "umount", self.mnt], check=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--bin", default="build/ckptfs")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--cache-size", default="256M")
    ap.add_argument("--inflight", default="256M")
    args = ap.parse_args()
    v1, v2 = make_files(args.dir, args.gib)
    size = os.path.getsize(v1)
    store, mnt = os.path.join(args.dir, "store"), os.path.join(args.dir, "mnt")
    os.makedirs(mnt, exist_ok=True)
    res = {}
    for run in range(args.runs):
        subprocess.run(["rm", "-rf", store], check=True)
        drop_caches()
        d = Daemon(args, store, mnt)
        try:
            for name, src in (("write v1 (new)", v1), ("write v2 (deltas)", v2)):
                os.mkdir(os.path.join(mnt, name.split()[1]))
                dst = os.path.join(mnt, name.split()[1], "model.pt")

                def write():
                    subprocess.run(["dd", f"if={src}", f"of={dst}", "bs=1M", "status=none"],
                                   check=True)
                    os.setxattr(mnt, "user.ckptfs.sync", b"1")
                res.setdefault(name, []).append(d.measure(write, size))
        finally:
            d.umount()
        for name, ver in (("cold read v2", "v2"), ("cold read v1", "v1")):
            drop_caches()
            d = Daemon(args, store, mnt)
            try:
                src = os.path.join(mnt, ver, "model.pt")
                res.setdefault(name, []).append(d.measure(
                    lambda: subprocess.run(["dd", f"if={src}", "of=/dev/null", "bs=1M",
                                            "status=none"], check=True), size))
            finally:
                d.umount()
        print(f"run {run + 1} done, load {os.getloadavg()[0]:.1f}", file=sys.stderr, flush=True)
    subprocess.run(["rm", "-rf", store], check=True)
    print(f"datapath: {size / GB:.2f} GB per file, cache {args.cache_size}, inflight "
          f"{args.inflight}, {args.runs} runs (medians [min .. max]), load "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(f"{'phase':20} {'CPU-s/GB':>18} {'faults/MiB':>10} {'peak RSS MiB':>13} {'MB/s':>6}")
    for name, rs in res.items():
        def m(k):
            return statistics.median(r[k] for r in rs)
        cpus = [r["cpu_gb"] for r in rs]
        print(f"{name:20} {m('cpu_gb'):6.2f} [{min(cpus):.2f} .. {max(cpus):.2f}] "
              f"{m('flt_mib'):10.1f} {m('rss'):13.0f} {m('mbs'):6.0f}")


if __name__ == "__main__":
    main()
