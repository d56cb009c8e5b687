#!/usr/bin/python3
"""The filesystem benchmark behind scripts/bench/fs.sh (see README.md, docs/fs.md).

Builds one real torch training state in memory (a transformer and its Adam state after one
training step on CPU, ~1.08 GiB saved) and measures, in the same run and on the same disk,
ckptfs mounts against a native directory:

  save     torch.save + flush + os.fsync (durable) and torch.save alone, mount vs native. Every
           run first scales every float tensor in place by (1 + 1e-6), so each save is new
           bytes (as between two training checkpoints) and dedup cannot help; the "unchanged"
           rows save the same state again (what dedup buys).
  cp       cp of the saved file out to native disk: cold (drop_caches, and a freshly mounted
           daemon so its chunk cache is empty) and warm (a second cp right after), vs cp of the
           native copy (cold after drop_caches, and warm).
  stats    `ckptfs stats` after umount: logical vs stored bytes.
  rss      the daemon's peak RSS (VmHWM, reset through /proc/PID/clear_refs before each phase)
           and the peak of its anonymous RSS (sampled every 20 ms), vs --cache-size + --inflight.
  tuning   the same durable save into a second mount whose daemon runs with
           CKPTFS_WRITEBACK_CACHE=1 (kernel writeback cache on; fs/fuse_ops.cc OnInit), and cold
           cp with the mount's read_ahead_kb at the daemon's 4096 vs the kernel's 128.
  diag.    a third mount whose daemon runs with GLIBC_TUNABLES (malloc keeps freed memory:
           what recycling chunk buffers would save), a cold cp from a fresh daemon with
           --cache-size 32M, and a warm dd into /dev/null (the same read(2) calls on both
           sides, unlike cp, which copies native files in the kernel with copy_file_range).

Ratios are medians of per-run ratios (each run measures every variant back to back, in an
order rotated from run to run). Progress and per-run numbers go to stderr, the table to stdout.
Run as root with Debian's /usr/bin/python3 (it sees python3-torch). fs.sh is the entry point.
"""
import argparse
import contextlib
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import threading
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_checkpoints import Model, train_step  # noqa: E402
from storage_bench import cpu_name  # noqa: E402

T0 = time.monotonic()
CLK = os.sysconf("SC_CLK_TCK")
GIB = 1 << 30
# Diagnostic daemon: glibc keeps freed memory instead of returning it to the kernel (no
# mmap per large buffer, no trimming), so recycled chunk buffers are not faulted in again.
MALLOC_TUNABLES = "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967296"


def log(msg):
    print(f"[{time.monotonic() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the daemon, seen from /proc

def proc_status(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmHWM", "VmRSS", "RssAnon", "RssFile", "RssShmem"):
                out[k] = int(v.split()[0]) * 1024
    return out


def proc_cpu(pid):
    return proc_stat(pid)[0]


def proc_stat(pid):
    """(CPU seconds, minor page faults) of a process, all its threads."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK, int(fields[7])  # utime + stime, minflt


def proc_io(pid):
    out = {}
    with open(f"/proc/{pid}/io") as f:
        for line in f:
            k, _, v = line.partition(":")
            out[k] = int(v)
    return out


class Monitor:
    """Samples a daemon's RSS and open staging files every 20 ms."""

    def __init__(self, pid):
        self.pid = pid
        self.reset()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def reset(self):
        with open(f"/proc/{self.pid}/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
        self.peak_anon = 0
        self.staging_seen = False

    def _run(self):
        while not self._stop.wait(0.02):
            try:
                st = proc_status(self.pid)
                self.peak_anon = max(self.peak_anon, st.get("RssAnon", 0))
                if not self.staging_seen:
                    for fd in os.listdir(f"/proc/{self.pid}/fd"):
                        with contextlib.suppress(OSError):
                            if "/staging/" in os.readlink(f"/proc/{self.pid}/fd/{fd}"):
                                self.staging_seen = True
            except OSError:
                return

    def hwm(self):
        return proc_status(self.pid)["VmHWM"]

    def stop(self):
        self._stop.set()
        self._thread.join()


class Mount:
    def __init__(self, args, name, env=None):
        self.args = args
        self.name = name
        self.store = os.path.join(args.dir, "store_" + name)
        self.mnt = os.path.join(args.dir, "mnt_" + name)
        self.env = env or {}
        self.pid = None
        self.monitor = None
        self.versions = 0
        os.makedirs(self.mnt, exist_ok=True)

    def mount(self, cache_size=None):
        env = dict(os.environ, **self.env)
        subprocess.run([self.args.bin, "mount", self.store, self.mnt, "--create", "--cache-size",
                        cache_size or self.args.cache_size, "--inflight", self.args.inflight],
                       check=True, env=env)
        self.pid = int(os.getxattr(self.mnt, "user.ckptfs.pid"))
        self.monitor = Monitor(self.pid)
        st = os.stat(self.mnt)
        self.bdi = f"/sys/class/bdi/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/read_ahead_kb"

    def umount(self):
        if self.pid is None:
            return 0.0
        t = time.monotonic()
        subprocess.run([self.args.bin, "umount", self.mnt], check=True)
        self.monitor.stop()
        self.pid = None
        return time.monotonic() - t

    def sync(self):
        t = time.monotonic()
        os.setxattr(self.mnt, "user.ckptfs.sync", b"1")
        return time.monotonic() - t

    def new_path(self):
        self.versions += 1
        d = os.path.join(self.mnt, f"step{self.versions:03d}")
        os.mkdir(d)
        return os.path.join(d, "model.pt")

    def latest_path(self):
        return os.path.join(self.mnt, f"step{self.versions:03d}", "model.pt")

    def readahead(self):
        with open(self.bdi) as f:
            return int(f.read())

    def set_readahead(self, kb):
        # The daemon raises it to 4096 from a thread once it serves requests: wait for that
        # first, so that it cannot overwrite ours.
        for _ in range(200):
            if self.readahead() == 4096:
                break
            time.sleep(0.01)
        with open(self.bdi, "w") as f:
            f.write(f"{kb}\n")
        assert self.readahead() == kb, (self.bdi, self.readahead())

    def stats(self):
        out = subprocess.run([self.args.bin, "stats", self.store], check=True,
                             capture_output=True, text=True).stdout
        res = {}
        for line in out.splitlines():
            k, v = line.rsplit(None, 1)
            res[k.strip()] = float(v)
        return res


# ---------------------------------------------------------------- the training state

def build_state(args):
    torch.manual_seed(0)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    gen = torch.Generator().manual_seed(0)
    model = Model(args.vocab, args.hidden, args.layers)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    train_step(model, opt, args.vocab, gen)  # fills Adam's moments
    for p in model.parameters():
        p.grad = None
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 1}
    tensors = [t for t in model.state_dict().values() if t.is_floating_point()]
    for s in opt.state.values():
        tensors += [t for t in s.values() if torch.is_tensor(t) and t.is_floating_point()
                    and t.numel() > 1]
    return state, tensors


@torch.no_grad()
def perturb(state, tensors):
    for t in tensors:
        t.mul_(1.000001)
    state["step"] += 1


# ---------------------------------------------------------------- timed operations

def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def save(state, path, fsync, pid=None):
    """Returns total s, of which write s and fsync s, daemon CPU s and page faults, own CPU s."""
    cpu0, flt0 = proc_stat(pid) if pid else (0.0, 0)
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.monotonic()
    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        t1 = time.monotonic()
        if fsync:
            os.fsync(f.fileno())
        t2 = time.monotonic()
    t3 = time.monotonic()
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    own = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
    cpu1, flt1 = proc_stat(pid) if pid else (0.0, 0)
    return dict(total=t3 - t0, write=t1 - t0, fsync=t2 - t1, dcpu=cpu1 - cpu0, dflt=flt1 - flt0,
                pycpu=own)


def cp(src, dst, pid=None, argv=None):
    cpu0, flt0 = proc_stat(pid) if pid else (0.0, 0)
    t = time.monotonic()
    subprocess.run(argv or ["cp", src, dst], check=True)
    el = time.monotonic() - t
    cpu1, flt1 = proc_stat(pid) if pid else (0.0, 0)
    return dict(total=el, dcpu=cpu1 - cpu0, dflt=flt1 - flt0)


def dd_null(src, pid=None):
    """Diagnostic: read the file with plain read(2) calls of 1 MiB into /dev/null."""
    return cp(src, None, pid, ["dd", f"if={src}", "of=/dev/null", "bs=1M", "status=none"])


def settle(*paths):
    for p in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p)
    os.sync()


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def rng(xs):
    return f"{min(xs):.2f} .. {max(xs):.2f}" if xs else ""


# ---------------------------------------------------------------- the benchmark

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True, help="scratch dir on the disk to measure")
    ap.add_argument("--bin", default="build/ckptfs")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=7)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--cache-size", default="256M")
    ap.add_argument("--inflight", default="256M")
    ap.add_argument("--no-tuning", action="store_true", help="skip writeback/readahead rows")
    ap.add_argument("--spool-compare", action="store_true",
                    help="only the spool comparison: the default mount (no spool) and one with "
                         "CKPTFS_SPOOL=1 (writes land in a spool, ingested behind the writer)")
    ap.add_argument("--json", help="also write the raw numbers here")
    args = ap.parse_args()
    # SIGTERM (fs.sh killed, a timeout) unwinds through the finally blocks that unmount.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    budget = parse_size(args.cache_size) + parse_size(args.inflight)

    native = os.path.join(args.dir, "native")
    out = os.path.join(args.dir, "out")
    os.makedirs(native, exist_ok=True)
    os.makedirs(out, exist_ok=True)
    off = Mount(args, "off")
    wb = Mount(args, "wb", {"CKPTFS_WRITEBACK_CACHE": "1"})
    mt = Mount(args, "mt", {"GLIBC_TUNABLES": MALLOC_TUNABLES})
    spool = Mount(args, "spool", {"CKPTFS_SPOOL": "1"})
    if args.spool_compare:
        mounts = [off, spool]
    elif args.no_tuning:
        mounts = [off]
    else:
        mounts = [off, spool, wb, mt]
    R = {}  # raw results

    def add(key, value):
        R.setdefault(key, []).append(value)

    try:
        log(f"{os.cpu_count()} CPUs ({cpu_name()}), load {os.getloadavg()[0]:.2f}; building the "
            f"state (hidden {args.hidden}, {args.layers} layers, one Adam step on CPU)")
        state, tensors = build_state(args)
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        log(f"state: {len(tensors)} tensors, {nbytes / GIB:.2f} GiB")
        for m in mounts:
            m.mount()
        log(f"mounted {', '.join(m.mnt for m in mounts)}")

        # Warm-up: one untimed save each (first-touch of the page cache and of the daemons'
        # buffers), then reset the peak-RSS counters.
        npath = os.path.join(native, "model.pt")
        save(state, npath, True)
        size = os.path.getsize(npath)
        settle(npath)
        for m in mounts:
            save(state, m.new_path(), True, m.pid)
            m.sync()
        os.sync()
        for m in mounts:
            m.monitor.reset()
        log(f"checkpoint file: {size / GIB:.3f} GiB ({size} bytes); warm-up saves done")

        # 1 + 2 + tuning: durable and non-durable saves of changed state.
        targets = [("native", None)] + [(m, m) for m in mounts]
        for fsync in (True, False):
            kind = "durable" if fsync else "nosync"
            for run in range(args.runs):
                perturb(state, tensors)
                order = targets[run % len(targets):] + targets[:run % len(targets)]
                row = {}
                for name, m in order:
                    if not fsync and m is not None and m not in (off, spool):
                        continue
                    if m is None:
                        r = save(state, npath, fsync)
                        settle(npath)
                        row["native"] = r
                    else:
                        io0 = proc_io(m.pid)
                        cpu0 = proc_cpu(m.pid)
                        r = save(state, m.new_path(), fsync, m.pid)
                        r["commit"] = m.sync()  # untimed: lets the async commit finish
                        # The daemon's CPU for this save includes what it did after close
                        # (ingest behind the writer, the commit).
                        r["dcpu"] = proc_cpu(m.pid) - cpu0
                        io1 = proc_io(m.pid)
                        r["wbytes"] = io1["write_bytes"] - io0["write_bytes"]
                        os.sync()
                        row[m.name] = r
                for k, r in row.items():
                    add(f"save_{kind}_{k}", r)
                log(f"save {kind} run {run + 1} (load {os.getloadavg()[0]:.1f}): " + ", ".join(
                    f"{k} {r['total']:.2f} s (write {r['write']:.2f}, fsync {r['fsync']:.2f}"
                    + (f", commit after {r['commit']:.2f}" if 'commit' in r else "")
                    + (f", daemon {r['dcpu']:.2f} CPU-s, wrote {r['wbytes'] / GIB:.2f} GiB"
                       if 'wbytes' in r else "")
                    + f", torch {r['pycpu']:.2f} CPU-s)" for k, r in row.items()))
        for m in mounts:
            add(f"rss_save_{m.name}",
                dict(hwm=m.monitor.hwm(), anon=m.monitor.peak_anon,
                     staging=m.monitor.staging_seen))

        # The unchanged state saved again (durable): everything dedups.
        for run in range(args.runs):
            r_off = save(state, off.new_path(), True, off.pid)
            os.sync()
            r_nat = save(state, npath, True)
            if run < args.runs - 1:
                settle(npath)
            add("save_dedup_off", r_off)
            add("save_dedup_native", r_nat)
            log(f"save unchanged run {run + 1}: off {r_off['total']:.2f} s "
                f"(daemon {r_off['dcpu']:.2f} CPU-s), native {r_nat['total']:.2f} s")
        add("rss_save_all_off", dict(hwm=off.monitor.hwm(), anon=off.monitor.peak_anon,
                                     staging=off.monitor.staging_seen))
        if wb.pid:
            R["wb_staging"] = wb.monitor.staging_seen

        # 4: stats.
        for m in mounts:
            R[f"umount_{m.name}"] = m.umount()
            R[f"stats_{m.name}"] = m.stats()
            R[f"catalog_{m.name}"] = os.stat(
                os.path.join(m.store, "catalog", "data.mdb")).st_blocks * 512
        log(f"stats off: {R['stats_off']}")

        # 3 + tuning: cold and warm cp. The file read back is the last save of the unchanged
        # state: the same bytes as the native file.
        src = off.latest_path()
        dst = os.path.join(out, "model.pt")
        variants = ["native", "ra4096"] + (
            [] if args.no_tuning or args.spool_compare else ["ra128", "cache32"])
        checked = False
        for run in range(args.runs):
            order = variants[run % len(variants):] + variants[:run % len(variants)]
            row = {}
            for v in order:
                if v == "native":
                    drop_caches()
                    cold = cp(npath, dst)
                    settle(dst)
                    warm = cp(npath, dst)
                    settle(dst)
                    row[v] = dict(cold=cold, warm=warm, ddwarm=dd_null(npath))
                    continue
                off.mount("32M" if v == "cache32" else None)
                if v == "ra128":
                    off.set_readahead(128)
                else:
                    for _ in range(200):
                        if off.readahead() == 4096:
                            break
                        time.sleep(0.01)
                ra = off.readahead()
                drop_caches()
                off.monitor.reset()
                cold = cp(src, dst, off.pid)
                cold["hwm"] = off.monitor.hwm()
                cold["anon"] = off.monitor.peak_anon
                cold["ra"] = ra
                if not checked:
                    subprocess.run(["cmp", dst, npath], check=True)
                    checked = True
                settle(dst)
                warm = cp(src, dst, off.pid)
                settle(dst)
                ddwarm = dd_null(src, off.pid)
                off.umount()
                row[v] = dict(cold=cold, warm=warm, ddwarm=ddwarm)
            for k, r in row.items():
                add(f"cp_{k}", r)
            log(f"cp run {run + 1} (load {os.getloadavg()[0]:.1f}): " + ", ".join(
                f"{k} cold {r['cold']['total']:.2f} s warm {r['warm']['total']:.2f} s "
                f"(dd to /dev/null {r['ddwarm']['total']:.2f} s)"
                + (f" (daemon {r['cold']['dcpu']:.2f} CPU-s cold, peak RSS "
                   f"{r['cold']['hwm'] / 2**20:.0f} MiB, {r['cold']['dflt']} page faults, "
                   f"read_ahead_kb {r['cold']['ra']})"
                   if 'hwm' in r['cold'] else "") for k, r in row.items()))
    finally:
        for m in mounts:
            try:
                m.umount()
            except Exception as e:  # noqa: BLE001
                log(f"umount {m.mnt} failed: {e}")
        for p in (os.path.join(out, "model.pt"),):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(p)

    R["size"] = size
    R["budget"] = budget
    if args.json:
        with open(args.json, "w") as f:
            json.dump(R, f, indent=1)
    print_table(R, args)
    log("done")


def parse_size(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1].upper(), 1)
    return int(s[:-1] if s[-1].isalpha() else s) * mult


def print_table(R, args):
    size = R["size"]
    gb = size / 1e9

    def sub(r, field):
        return r[field]["total"] if isinstance(r[field], dict) else r[field]

    def row(label, key_m, key_n, field="total", speed=False, note=""):
        ms = [sub(r, field) for r in R[key_m]]
        ns = [sub(r, field) for r in R[key_n]]
        ratios = [(n / m if speed else m / n) for m, n in zip(ms, ns)]
        print(f"| {label} | {med(ms):.2f} s ({gb / med(ms):.2f} GB/s) | {rng(ms)} | "
              f"{med(ns):.2f} s ({gb / med(ns):.2f} GB/s) | **{med(ratios):.2f}x** | "
              f"{rng(ratios)} | {note} |")
        return med(ratios)

    def phase(key, field, inner=None):
        return med([(r[inner][field] if inner else r[field]) for r in R[key]])

    def daemon(key, inner=None):
        return (f"daemon {phase(key, 'dcpu', inner) / gb:.2f} CPU-s/GB, "
                f"{phase(key, 'dflt', inner) * 4096 / size:.2f} page faults/4 KiB")

    print(f"\nckptfs filesystem benchmark: {size / GIB:.2f} GiB torch checkpoint "
          f"(model + Adam), {args.runs} runs, medians; ratios are medians of per-run ratios")
    print(f"mount options: --cache-size {args.cache_size} --inflight {args.inflight}, default codec (auto); "
          f"native: a directory on the same filesystem\n")
    print("| measurement | ckptfs | range | native | ratio | ratio range | note |")
    print("|---|---|---|---|---|---|---|")
    row("torch.save + fsync, durable (time mount/native; target <= 1.0x)",
        "save_durable_off", "save_durable_native",
        note=f"mount: write {phase('save_durable_off', 'write'):.2f} s + fsync "
             f"{phase('save_durable_off', 'fsync'):.2f} s, torch process "
             f"{phase('save_durable_off', 'pycpu'):.2f} CPU-s, {daemon('save_durable_off')}; "
             f"native: write {phase('save_durable_native', 'write'):.2f} s + fsync "
             f"{phase('save_durable_native', 'fsync'):.2f} s, torch process "
             f"{phase('save_durable_native', 'pycpu'):.2f} CPU-s")
    row("torch.save, no fsync (time mount/native)", "save_nosync_off", "save_nosync_native",
        note=f"the async commit after close took {phase('save_nosync_off', 'commit'):.2f} s "
             f"more; torch process {phase('save_nosync_off', 'pycpu'):.2f} CPU-s (native "
             f"{phase('save_nosync_native', 'pycpu'):.2f}); {daemon('save_nosync_off')}")
    row("torch.save + fsync of the unchanged state again (every chunk dedups)",
        "save_dedup_off", "save_dedup_native", note=daemon("save_dedup_off"))
    cold = row("cp out, cold: drop_caches + fresh daemon (speed mount/native; target >= 0.7x)",
               "cp_ra4096", "cp_native", field="cold", speed=True,
               note=daemon("cp_ra4096", "cold"))
    row("cp out, warm: second cp right after (speed mount/native; target >= 0.95x)",
        "cp_ra4096", "cp_native", field="warm", speed=True,
        note=f"{daemon('cp_ra4096', 'warm')}: served from the page cache (keep_cache); native "
             "cp copies in the kernel (copy_file_range), from the mount cp falls back to "
             "read/write")
    row("diagnostic: warm read(2) of 1 MiB into /dev/null (dd), speed mount/native",
        "cp_ra4096", "cp_native", field="ddwarm", speed=True,
        note="the same syscalls on both sides: the FUSE page-cache read itself")
    if "save_durable_spool" in R:
        row("tuning: durable save, spool ON (CKPTFS_SPOOL=1: writes land in a spool file, "
            "ingested behind the writer) (time mount/native)", "save_durable_spool",
            "save_durable_native",
            note=f"vs the first row (no spool); write {phase('save_durable_spool', 'write'):.2f}"
                 f" s + fsync {phase('save_durable_spool', 'fsync'):.2f} s; "
                 f"{daemon('save_durable_spool')}; the daemon wrote "
                 f"{phase('save_durable_spool', 'wbytes') / size:.2f}x the file to disk (no spool: "
                 f"{phase('save_durable_off', 'wbytes') / size:.2f}x)")
        row("tuning: no-fsync save, spool ON (time mount/native)", "save_nosync_spool",
            "save_nosync_native", note=f"{daemon('save_nosync_spool')}")
    if "save_durable_wb" in R:
        row("tuning: durable save with the writeback cache ON (time mount/native)",
            "save_durable_wb", "save_durable_native",
            note=f"vs the row above (OFF); write {phase('save_durable_wb', 'write'):.2f} s + "
                 f"fsync {phase('save_durable_wb', 'fsync'):.2f} s; the daemon wrote "
                 f"{phase('save_durable_wb', 'wbytes') / size:.2f}x the file to disk (OFF: "
                 f"{phase('save_durable_off', 'wbytes') / size:.2f}x); staging file (patch "
                 f"path) {'USED' if R.get('wb_staging') else 'not seen'}; "
                 f"{daemon('save_durable_wb')}")
    if "save_durable_mt" in R:
        row("diagnostic: durable save, daemon with GLIBC_TUNABLES mmap_threshold=32M, "
            "trim_threshold=4G (time mount/native)", "save_durable_mt", "save_durable_native",
            note=f"write {phase('save_durable_mt', 'write'):.2f} s + fsync "
                 f"{phase('save_durable_mt', 'fsync'):.2f} s; {daemon('save_durable_mt')} "
                 f"(default: {daemon('save_durable_off')})")
    if "cp_ra128" in R:
        row("tuning: cp out, cold, mount read_ahead_kb 128 instead of 4096 (speed mount/native)",
            "cp_ra128", "cp_native", field="cold", speed=True,
            note=f"vs {cold:.2f}x at 4096; {daemon('cp_ra128', 'cold')}")
    if "cp_cache32" in R:
        row("diagnostic: cp out, cold, fresh daemon with --cache-size 32M (speed mount/native)",
            "cp_cache32", "cp_native", field="cold", speed=True,
            note=f"vs {cold:.2f}x with 256M; {daemon('cp_cache32', 'cold')}")
    print()
    print("| store | contents | logical (raw) bytes | pack (stored) bytes | stored/raw | "
          "catalog |")
    print("|---|---|---|---|---|---|")
    for k in ("stats_off", "stats_wb", "stats_mt"):
        if k in R:
            s = R[k]
            print(f"| {k[6:]} | {s['contents']:.0f} | {s['logical bytes'] / 1e9:.2f} GB | "
                  f"{s['pack bytes'] / 1e9:.2f} GB | {s['stored/logical']:.4f} | "
                  f"{R['catalog_' + k[6:]] / 1e6:.1f} MB |")
    st = R["stats_off"]
    changed = st["contents"] - args.runs
    print(f"\noff: {changed:.0f} saves of changed state + {args.runs} of the unchanged state; "
          f"stored per changed save {st['pack bytes'] / changed / size:.4f} of the file "
          f"(default codec on fp32, deltas), per unchanged save ~0")
    budget = R["budget"]
    print("\n| daemon peak RSS | VmHWM | peak RssAnon (20 ms samples) | cache + inflight |")
    print("|---|---|---|---|")
    for label, rs in (("saves of changed state (durable + no fsync)", R["rss_save_off"]),
                      ("all saves, including the unchanged state", R["rss_save_all_off"]),
                      ("durable saves, writeback cache ON", R.get("rss_save_wb")),
                      ("durable saves, GLIBC_TUNABLES daemon", R.get("rss_save_mt"))):
        if not rs:
            continue
        r = rs[0]
        print(f"| {label} | {r['hwm'] / 2**20:.0f} MiB | {r['anon'] / 2**20:.0f} MiB | "
              f"{budget / 2**20:.0f} MiB |")
    for key, label in (("cp_ra4096", "cold cp, fresh daemon"), ("cp_ra128", "cold cp, ra 128"),
                       ("cp_cache32", "cold cp, --cache-size 32M")):
        if key in R:
            hw = [r["cold"]["hwm"] for r in R[key]]
            an = [r["cold"]["anon"] for r in R[key]]
            bud = budget - parse_size(args.cache_size) + (32 << 20) if key == "cp_cache32" else budget
            print(f"| {label} (max of {len(hw)}) | {max(hw) / 2**20:.0f} MiB | "
                  f"{max(an) / 2**20:.0f} MiB | {bud / 2**20:.0f} MiB |")
    print(f"\numount (sync + unmount + daemon exit) after the saves: {R['umount_off']:.2f} s")
    # The must-show figures in one place (issue 13).
    slack = 64 << 20
    cpu_w = med([r["dcpu"] for r in R["save_durable_off"] + R["save_nosync_off"]]) / gb
    cpu_r = phase("cp_ra4096", "dcpu", "cold") / gb
    print("\n| must-show (default options) | measured | target |")
    print("|---|---|---|")
    print(f"| daemon CPU per GB written (saves of changed state, incl. ingest + commit after "
          f"close) | {cpu_w:.2f} CPU-s/GB | <= 1.5 |")
    print(f"| daemon CPU per GB read (cold cp, fresh daemon) | {cpu_r:.2f} CPU-s/GB | <= 1.0 |")
    for label, key in (("saves of changed state", "rss_save_off"),
                       ("all saves", "rss_save_all_off")):
        if R.get(key):
            r = R[key][0]
            print(f"| peak RSS, {label} | {r['hwm'] / 2**20:.0f} MiB | <= "
                  f"{(budget + slack) / 2**20:.0f} MiB (cache + inflight + 64 MiB) |")
    hw = [r["cold"]["hwm"] for r in R["cp_ra4096"]]
    print(f"| peak RSS, cold cp (max of {len(hw)}) | {max(hw) / 2**20:.0f} MiB | <= "
          f"{(budget + slack) / 2**20:.0f} MiB |")


if __name__ == "__main__":
    main()
