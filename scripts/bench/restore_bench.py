#!/usr/bin/python3
"""The restore benchmark behind scripts/bench/restore.sh (see README.md, docs/fs.md).

Recovery reads the newest checkpoint back: this measures how fast, against the same files on a
native directory of the same disk, in the same run. Input: one trajectory of
scripts/gen_trajectory.py (default fp32: a small GPT and its Adam state in DeepSpeed's layout,
>= 8 versions), written version after version into one ckptfs mount with default options
(lz4, deltas on: each version is delta-encoded against the previous one) with `cp -r` and
`ckptfs sync`, as storage_bench.py does, and copied once to the native directory.

Per run (variants in an order rotated from run to run; each measures the mount and the native
copy back to back, alternating which goes first):

  load newest   drop_caches and a freshly mounted daemon (empty chunk cache), then torch.load
                (map_location cpu) of every file of the newest version, one after the other;
                time mount / native (target <= 1.0x).
  cp newest     cold: drop_caches + fresh daemon, `cp -r` of the newest version to native disk;
                warm: the same cp again right after. Speed mount / native (>= 0.9x, >= 0.95x).
  load oldest   as "load newest", for the first version (the far end of whatever chain the
                store keeps); speed mount / native (>= 0.5x).
  cp oldest     as cold "cp newest", for the first version.

For every mount phase: the daemon's CPU seconds (utime + stime, all threads) per GB read, and
its peak RSS (VmHWM reset before the phase) against --cache-size + --inflight + 64 MiB.
Ratios are medians of per-run ratios. Progress to stderr, the table to stdout.
Run as root with Debian's /usr/bin/python3 (it sees python3-torch); restore.sh is the entry.
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fs_bench import Mount, drop_caches, log, med, parse_size, proc_stat, rng  # noqa: E402
from storage_bench import cpu_name, trajectories, tree_bytes, version_files  # noqa: E402

MIB = 1 << 20


def timed_mount(m, fn):
    """Runs fn against a fresh daemon after drop_caches; returns time, daemon CPU, peak RSS."""
    m.umount()
    drop_caches()
    m.mount()
    return timed_on(m, fn)


def timed_on(m, fn):
    m.monitor.reset()
    cpu0, flt0 = proc_stat(m.pid)
    t = time.monotonic()
    fn()
    el = time.monotonic() - t
    cpu1, flt1 = proc_stat(m.pid)
    return dict(total=el, dcpu=cpu1 - cpu0, dflt=flt1 - flt0, hwm=m.monitor.hwm(),
                peak_anon=m.monitor.peak_anon)


def timed_native(fn):
    drop_caches()
    t = time.monotonic()
    fn()
    return dict(total=time.monotonic() - t)


def load_all(files):
    for f in files:
        obj = torch.load(f, map_location="cpu")
        del obj


def cp_tree(src, out):
    shutil.rmtree(out, ignore_errors=True)
    subprocess.run(["cp", "-r", src, out], check=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True, help="trajectories (gen_trajectory.py --out)")
    ap.add_argument("--trajectory", default="fp32")
    ap.add_argument("--dir", required=True, help="scratch directory (store, native copy)")
    ap.add_argument("--bin", default="build/ckptfs")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cache-size", default="256M")
    ap.add_argument("--inflight", default="256M")
    ap.add_argument("--json", help="also write every measurement there")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    found = {name: (tdir, vs) for name, tdir, vs in trajectories(args.data)}
    if args.trajectory not in found:
        raise SystemExit(f"restore_bench: no trajectory {args.trajectory} in {args.data}")
    tdir, versions = found[args.trajectory]
    if len(versions) < 8:
        log(f"warning: only {len(versions)} versions (the target is about >= 8)")
    budget = parse_size(args.cache_size) + parse_size(args.inflight) + 64 * MIB
    os.makedirs(args.dir, exist_ok=True)
    native = os.path.join(args.dir, "native")
    out = os.path.join(args.dir, "out")
    os.makedirs(native, exist_ok=True)
    for v in versions:
        subprocess.run(["cp", "-r", os.path.join(tdir, v), native + "/"], check=True)
    os.sync()
    newest, oldest = versions[-1], versions[0]
    sizes = {v: tree_bytes(os.path.join(native, v)) for v in (newest, oldest)}
    log(f"{os.cpu_count()} CPUs ({cpu_name()}), load {os.getloadavg()[0]:.2f}; {args.trajectory}: "
        f"{len(versions)} versions, newest {newest} {sizes[newest] / 1e6:.1f} MB, "
        f"oldest {oldest} {sizes[oldest] / 1e6:.1f} MB")

    m = Mount(args, "restore")
    R = {}
    stats = {}
    try:
        m.mount()
        t = time.monotonic()
        for v in versions:
            subprocess.run(["cp", "-r", os.path.join(tdir, v), m.mnt + "/"], check=True)
            with open(os.path.join(m.mnt, "latest"), "w") as f:
                f.write(v)
            os.setxattr(m.mnt, "user.ckptfs.sync", b"1")
        log(f"wrote {len(versions)} versions into the mount in {time.monotonic() - t:.1f} s")
        m.umount()
        stats = m.stats()
        log("store: " + ", ".join(f"{k} {v:g}" for k, v in stats.items()))

        def files(root, v):
            return version_files(os.path.join(root, v))

        def pair(key, mount_fn, native_fn, r):
            first_mount = r % 2 == 0
            for side in ("mount", "native") if first_mount else ("native", "mount"):
                res = timed_mount(m, mount_fn) if side == "mount" else timed_native(native_fn)
                R.setdefault(f"{key}_{side}", []).append(res)

        def load_newest(r):
            pair("load_new", lambda: load_all(files(m.mnt, newest)),
                 lambda: load_all(files(native, newest)), r)

        def cp_newest(r):
            # cold then warm on each side, warm right after cold (this VM reclaims idle page
            # cache after about a minute).
            for side in ("mount", "native") if r % 2 == 0 else ("native", "mount"):
                if side == "mount":
                    R.setdefault("cp_new_mount", []).append(
                        timed_mount(m, lambda: cp_tree(os.path.join(m.mnt, newest), out)))
                    R.setdefault("cpw_new_mount", []).append(
                        timed_on(m, lambda: cp_tree(os.path.join(m.mnt, newest), out)))
                else:
                    src = os.path.join(native, newest)
                    R.setdefault("cp_new_native", []).append(
                        timed_native(lambda: cp_tree(src, out)))
                    t0 = time.monotonic()
                    cp_tree(src, out)
                    R.setdefault("cpw_new_native", []).append(
                        dict(total=time.monotonic() - t0))

        def load_oldest(r):
            pair("load_old", lambda: load_all(files(m.mnt, oldest)),
                 lambda: load_all(files(native, oldest)), r)

        def cp_oldest(r):
            pair("cp_old", lambda: cp_tree(os.path.join(m.mnt, oldest), out),
                 lambda: cp_tree(os.path.join(native, oldest), out), r)

        variants = [load_newest, cp_newest, load_oldest, cp_oldest]
        for r in range(args.runs):
            k = r % len(variants)
            for fn in variants[k:] + variants[:k]:
                os.sync()
                fn(r)
            log(f"run {r + 1}/{args.runs} (load {os.getloadavg()[0]:.2f}): " + ", ".join(
                f"{key} {R[key][-1]['total']:.2f} s" for key in sorted(R)))
    finally:
        m.umount()
        shutil.rmtree(out, ignore_errors=True)

    print_table(R, args, versions, sizes, stats, budget)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(args=vars(args), versions=versions, sizes=sizes, stats=stats,
                           results=R), f, indent=1)


def print_table(R, args, versions, sizes, stats, budget):
    print(f"\nrestore bench: trajectory {args.trajectory} from {args.data}, {len(versions)} "
          f"versions; default mount options (--cache-size {args.cache_size} --inflight "
          f"{args.inflight}, lz4, deltas on); {args.runs} runs, medians; ratios are medians of "
          f"per-run ratios; load at the end {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs "
          f"({cpu_name()}); "
          f"longest delta chain in the store {stats.get('longest chain', float('nan')):g}, "
          f"delta chunks {stats.get('delta chunks', float('nan')):g}")
    print()
    print("| measurement | ckptfs | native | ratio [range] | target | daemon CPU-s/GB | "
          "daemon peak RSS |")
    print("|---|---|---|---|---|---|---|")

    def row(label, key_m, key_n, nbytes, speed, target):
        ms = [x["total"] for x in R[key_m]]
        ns = [x["total"] for x in R[key_n]]
        ratios = [(n / m if speed else m / n) for m, n in zip(ms, ns)]
        cpu = [x["dcpu"] / (nbytes / 1e9) for x in R[key_m]]
        hwm = [x["hwm"] for x in R[key_m]]
        ok = (med(ratios) >= target) if speed else (med(ratios) <= target)
        print(f"| {label} | {med(ms):.2f} s ({nbytes / 1e9 / med(ms):.2f} GB/s) | "
              f"{med(ns):.2f} s ({nbytes / 1e9 / med(ns):.2f} GB/s) | **{med(ratios):.2f}x** "
              f"{rng(ratios)} | {'>=' if speed else '<='} {target}x: "
              f"{'met' if ok else '**missed**'} | {med(cpu):.2f} | "
              f"{max(hwm) / MIB:.0f} MiB (budget {budget / MIB:.0f}) |")

    new, old = sizes[versions[-1]], sizes[versions[0]]
    row(f"torch.load newest ({versions[-1]}), cold: time", "load_new_mount", "load_new_native",
        new, False, 1.0)
    row("cp -r newest, cold: speed", "cp_new_mount", "cp_new_native", new, True, 0.9)
    row("cp -r newest, warm: speed", "cpw_new_mount", "cpw_new_native", new, True, 0.95)
    row(f"torch.load oldest ({versions[0]}), cold: speed", "load_old_mount", "load_old_native",
        old, True, 0.5)
    row("cp -r oldest, cold: speed", "cp_old_mount", "cp_old_native", old, True, 0.5)


if __name__ == "__main__":
    main()
