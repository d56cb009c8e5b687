#!/usr/bin/python3
"""The lazy-load benchmark behind scripts/bench/views.sh (docs/views.md).

One ~1 GiB torch state dict (a GPT-like transformer: 24 layers of q/k/v/o, fc1/fc2, biases and
layer norms at d=896, a 32000-token embedding; fp32, random normal data) is torch.save'd into a
ckptfs mount (MNT/v1/model.pt) and copied to a native directory on the same disk. Then, --runs
times, each in a fresh /usr/bin/python3 process (torch, numpy and ckptfs imported before the
clock starts), under cold conditions (a freshly mounted daemon, so its chunk cache is empty, then
sync + drop_caches, so neither the FUSE page cache nor the packs are in the page cache):

  lazy     ckptfs.lazy_load(MNT/v1/model.pt, mmap=False) + the first access of one mid-sized
           tensor (--tensor, default layers.12.attn.q.weight, 3.2 MB), read into memory as
           torch.load gives it (the default, mapped, would read nothing until the pages are
           touched, and the clock would stop before the read): the time to first tensor, the
           daemon's pack_read_bytes delta (user.ckptfs.stats) split into lazy_load (index.json)
           and the access (the .npy), and the process's peak RSS (VmHWM).
  load     torch.load of the whole file from the mount, then that tensor: the same numbers.
  native   torch.load of the native copy (the peer): time and peak RSS; disk bytes read from
           /proc/self/io.
  steps    diagnostic, lazy path taken apart: lookup of FILE@tensors (the daemon parses the
           stored file's data.pkl and builds the view), open + read of index.json, json.loads,
           np.load(mmap_mode='r') of the .npy (open, header, mmap), the copy out of the mapping
           (its page faults read the data); time and pack bytes of each.

The variants of one run go in an order rotated from run to run; medians are reported, ratios
are medians of per-run ratios. Progress to stderr, the table to stdout. Run as root.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

T0 = time.monotonic()
GIB = 1 << 30
MIB = 1 << 20
HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.join(HERE, "..", "..", "python")


def log(msg):
    print(f"[{time.monotonic() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def rng(xs, fmt="{:.1f}"):
    return (fmt.format(min(xs)) + " .. " + fmt.format(max(xs))) if xs else ""


def stats(mnt):
    """user.ckptfs.stats of a mount as {key: int}."""
    out = {}
    for line in os.getxattr(mnt, "user.ckptfs.stats").decode().splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                out[parts[0]] = int(parts[1])
            except ValueError:
                pass
    return out


def vm(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def io_read_bytes():
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    return 0


# ---------------------------------------------------------------- the child (one measurement)

def child(args):
    """One cold measurement in this fresh process; prints one JSON object on stdout."""
    t_imp = time.perf_counter()
    import numpy as np
    import torch
    t_torch = time.perf_counter()
    sys.path.insert(0, PYDIR)
    import ckptfs
    t_ckptfs = time.perf_counter()
    torch.set_num_threads(1)
    path, name, mnt = args.path, args.tensor, args.mnt
    res = dict(mode=args.child, import_torch=t_torch - t_imp, import_ckptfs=t_ckptfs - t_torch,
               rss_base=vm("VmRSS"), hwm_base=vm("VmHWM"))
    s0 = stats(mnt) if mnt else {}
    io0 = io_read_bytes()

    def pack_delta():
        return stats(mnt)["pack_read_bytes"] - s0["pack_read_bytes"]

    if args.child == "lazy":
        t0 = time.perf_counter()
        sd = ckptfs.lazy_load(path, mmap=False)  # an in-memory copy: the read is timed
        t1 = time.perf_counter()
        p1 = pack_delta()
        x = sd[name]
        t2 = time.perf_counter()
        res.update(t_index=t1 - t0, t_access=t2 - t1, t_first=t2 - t0, pack_index=p1,
                   pack=pack_delta(), ntensors=len(sd))
    elif args.child in ("load", "native"):
        t0 = time.perf_counter()
        sd = torch.load(path, map_location="cpu")
        x = sd[name]
        t1 = time.perf_counter()
        res.update(t_first=t1 - t0, ntensors=len(sd))
        if mnt:
            res["pack"] = pack_delta()
    elif args.child == "steps":
        vdir = path + "@tensors"
        t = [time.perf_counter()]
        p = []
        os.stat(vdir)  # the lookup: the daemon builds the view
        t.append(time.perf_counter()); p.append(pack_delta())
        with open(os.path.join(vdir, "index.json"), "rb") as f:
            raw = f.read()
        t.append(time.perf_counter()); p.append(pack_delta())
        index = json.loads(raw)
        entry = next(e for e in index["tensors"] if e["name"] == name)
        t.append(time.perf_counter()); p.append(pack_delta())
        mm = np.load(os.path.join(vdir, entry["file"]), mmap_mode="r")  # as lazy.py does
        t.append(time.perf_counter()); p.append(pack_delta())
        x = torch.from_numpy(np.array(mm))  # the page faults on the mapping read the data
        t.append(time.perf_counter()); p.append(pack_delta())
        steps = ["lookup", "index_read", "index_parse", "npy_open", "npy_data"]
        for i, s in enumerate(steps):
            res["t_" + s] = t[i + 1] - t[i]
            res["pack_" + s] = p[i] - (p[i - 1] if i else 0)
        res.update(index_bytes=len(raw), ntensors=len(index["tensors"]),
                   t_first=t[-1] - t[0], pack=p[-1])
    # VmHWM, not getrusage's ru_maxrss: Linux carries ru_maxrss over fork + exec, so a child
    # of this (1 GiB) parent would report the parent's peak.
    res["peak_rss"] = vm("VmHWM")
    res["disk_read"] = io_read_bytes() - io0
    res["tensor_bytes"] = x.numel() * x.element_size()
    # Checksum of the tensor, so that every variant is seen to return the same bytes.
    res["sum"] = float(x.double().sum())
    res["shape"] = list(x.shape)
    print(json.dumps(res), flush=True)


# ---------------------------------------------------------------- the parent

def make_state(d, layers, vocab):
    import torch
    torch.manual_seed(0)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    sd = {"embed.weight": torch.randn(vocab, d) * 0.02}
    for i in range(layers):
        p = f"layers.{i}."
        for n in ("ln1", "ln2"):
            sd[p + n + ".weight"] = 1 + 0.02 * torch.randn(d)
            sd[p + n + ".bias"] = 0.02 * torch.randn(d)
        for n in ("q", "k", "v", "o"):
            sd[p + f"attn.{n}.weight"] = torch.randn(d, d) * 0.02
            sd[p + f"attn.{n}.bias"] = torch.randn(d) * 0.02
        sd[p + "mlp.fc1.weight"] = torch.randn(4 * d, d) * 0.02
        sd[p + "mlp.fc1.bias"] = torch.randn(4 * d) * 0.02
        sd[p + "mlp.fc2.weight"] = torch.randn(d, 4 * d) * 0.02
        sd[p + "mlp.fc2.bias"] = torch.randn(d) * 0.02
    sd["norm.weight"] = 1 + 0.02 * torch.randn(d)
    sd["norm.bias"] = 0.02 * torch.randn(d)
    return sd


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


class Mount:
    def __init__(self, args):
        self.args = args
        self.store = os.path.join(args.dir, "store")
        self.mnt = os.path.join(args.dir, "mnt_views")
        self.pid = None
        os.makedirs(self.mnt, exist_ok=True)

    def mount(self):
        cmd = [self.args.bin, "mount", self.store, self.mnt, "--create"]
        if self.args.cache_size:
            cmd += ["--cache-size", self.args.cache_size]
        subprocess.run(cmd, check=True)
        self.pid = int(os.getxattr(self.mnt, "user.ckptfs.pid"))

    def umount(self):
        if self.pid is None:
            return
        subprocess.run([self.args.bin, "umount", self.mnt], check=True)
        self.pid = None

    def daemon_hwm(self):
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        return 0


def run_child(args, mode, path, mnt):
    cmd = ["/usr/bin/python3", os.path.abspath(__file__), "--child", mode, "--path", path,
           "--tensor", args.tensor]
    if mnt:
        cmd += ["--mnt", mnt]
    t = time.monotonic()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    r["wall"] = time.monotonic() - t
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", help="scratch directory (the store, the mount, the native copy)")
    ap.add_argument("--bin", default="build/ckptfs")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--hidden", type=int, default=896)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--tensor", default="layers.12.attn.q.weight")
    ap.add_argument("--cache-size", default="", help="ckptfs mount --cache-size (default: its own)")
    ap.add_argument("--no-steps", action="store_true", help="skip the diagnostic breakdown")
    ap.add_argument("--json", help="also write every raw measurement here")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--path", help=argparse.SUPPRESS)
    ap.add_argument("--mnt", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    import signal
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    m = Mount(args)
    native_dir = os.path.join(args.dir, "native")
    os.makedirs(native_dir, exist_ok=True)
    native = os.path.join(native_dir, "model.pt")
    mpath = os.path.join(m.mnt, "v1", "model.pt")
    R = {}
    try:
        import torch
        log(f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; building the state dict "
            f"(d={args.hidden}, {args.layers} layers, vocab {args.vocab}, fp32)")
        sd = make_state(args.hidden, args.layers, args.vocab)
        if args.tensor not in sd:
            raise SystemExit(f"--tensor {args.tensor}: no such tensor")
        nbytes = sum(t.numel() * t.element_size() for t in sd.values())
        sizes = sorted(t.numel() * t.element_size() for t in sd.values())
        R.update(ntensors=len(sd), state_bytes=nbytes, tensor=args.tensor,
                 tensor_bytes=sd[args.tensor].numel() * 4, smallest=sizes[0], largest=sizes[-1],
                 median_tensor=sizes[len(sizes) // 2])
        log(f"state: {len(sd)} tensors, {nbytes / GIB:.3f} GiB; tensor sizes {sizes[0]} B .. "
            f"{sizes[-1] / MIB:.1f} MiB, median {sizes[len(sizes) // 2]} B")
        m.mount()
        os.mkdir(os.path.dirname(mpath))
        t = time.monotonic()
        with open(mpath, "wb") as f:
            torch.save(sd, f)
            f.flush()
            os.fsync(f.fileno())
        log(f"torch.save + fsync into the mount: {time.monotonic() - t:.2f} s")
        del sd
        subprocess.run([args.bin, "sync", m.mnt], check=True)
        subprocess.run(["cp", mpath, native], check=True)
        os.sync()
        R["file_bytes"] = os.path.getsize(native)
        m.umount()
        m.mount()
        st = stats(m.mnt)
        R["stats"] = st
        log(f"file {R['file_bytes'] / GIB:.3f} GiB; store: pack_bytes {st.get('pack_bytes')}, "
            f"logical_bytes {st.get('logical_bytes')}")
        m.umount()

        variants = ["lazy", "load", "native"] + ([] if args.no_steps else ["steps"])
        for run in range(args.runs):
            order = variants[run % len(variants):] + variants[:run % len(variants)]
            row = {}
            for v in order:
                if v == "native":
                    drop_caches()
                    r = run_child(args, v, native, None)
                else:
                    m.mount()
                    drop_caches()
                    r = run_child(args, v, mpath, m.mnt)
                    r["daemon_hwm"] = m.daemon_hwm()
                    m.umount()
                row[v] = r
                R.setdefault(v, []).append(r)
            sums = {v: r["sum"] for v, r in row.items()}
            if len(set(sums.values())) != 1:
                raise SystemExit(f"the variants returned different tensors: {sums}")
            log(f"run {run + 1} (load {os.getloadavg()[0]:.1f}): " + ", ".join(
                f"{v} {r['t_first'] * 1e3:.1f} ms"
                + (f" (read {r['pack'] / MIB:.1f} MiB of packs)" if "pack" in r else "")
                + f", RSS {r['peak_rss'] / MIB:.0f} MiB" for v, r in row.items()))
    finally:
        try:
            m.umount()
        except Exception as e:  # noqa: BLE001
            log(f"umount {m.mnt} failed: {e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(R, f, indent=1)
    print_table(R, args)
    log("done")


def print_table(R, args):
    pack_bytes = R["stats"]["pack_bytes"]
    fb = R["file_bytes"]
    L, D, N = R["lazy"], R["load"], R["native"]

    def col(rs, key):
        return [r[key] for r in rs]

    def ms(xs):
        return f"{med(xs) * 1e3:.1f} ms"

    lz_t, ld_t, nt_t = col(L, "t_first"), col(D, "t_first"), col(N, "t_first")
    lz_p, ld_p = col(L, "pack"), col(D, "pack")
    r_load = [a / b for a, b in zip(lz_t, ld_t)]
    r_nat = [a / b for a, b in zip(lz_t, nt_t)]
    r_ln = [a / b for a, b in zip(ld_t, nt_t)]
    pct = [100 * p / pack_bytes for p in lz_p]
    print(f"\nckptfs lazy_load benchmark: {fb / GIB:.3f} GiB torch.save file ({R['ntensors']} "
          f"fp32 tensors, {R['smallest']} B .. {R['largest'] / MIB:.1f} MiB, median "
          f"{R['median_tensor'] / 1024:.1f} KiB), stored in {pack_bytes / GIB:.3f} GiB of packs "
          f"(lz4); tensor `{R['tensor']}` ({R['tensor_bytes'] / MIB:.2f} MiB, "
          f"{100 * R['tensor_bytes'] / fb:.2f}% of the file)")
    print(f"{args.runs} runs, medians (ratios: medians of per-run ratios); every measurement in a "
          f"fresh /usr/bin/python3 (torch 1.13), cold: fresh daemon"
          f"{' --cache-size ' + args.cache_size if args.cache_size else ''} + sync + "
          f"drop_caches; native: the same file on the same disk\n")
    print("| measurement | lazy_load (mount) | torch.load (mount) | torch.load (native) | "
          "target | met |")
    print("|---|---|---|---|---|---|")
    print(f"| time to first tensor | **{ms(lz_t)}** ({rng([x * 1e3 for x in lz_t])}) | "
          f"{ms(ld_t)} ({rng([x * 1e3 for x in ld_t])}) | {ms(nt_t)} "
          f"({rng([x * 1e3 for x in nt_t])}) | lazy <= 50 ms | "
          f"{'YES' if med(lz_t) <= 0.050 else 'NO'} |")
    print(f"| ratio lazy / this | 1 | **{med(r_load):.4f}x** ({1 / med(r_load):.0f}x faster) | "
          f"**{med(r_nat):.4f}x** ({1 / med(r_nat):.0f}x faster) | | |")
    print(f"| ratio torch.load mount / native | | {med(r_ln):.2f}x | 1 | | |")
    print(f"| of which lazy_load() (index.json) / first access (.npy) | "
          f"{ms(col(L, 't_index'))} / {ms(col(L, 't_access'))} | | | | |")
    print(f"| pack bytes read (daemon pack_read_bytes) | **{med(lz_p) / MIB:.2f} MiB = "
          f"{med(pct):.3f}%** of stored ({rng(pct, '{:.3f}')}%) | {med(ld_p) / MIB:.1f} MiB = "
          f"{100 * med(ld_p) / pack_bytes:.1f}% | (disk: {med(col(N, 'disk_read')) / MIB:.1f} "
          f"MiB) | lazy <= 3% of stored | {'YES' if med(pct) <= 3 else 'NO'} |")
    print(f"| of which lazy_load() (index.json) / first access (.npy) | "
          f"{med(col(L, 'pack_index')) / MIB:.2f} / "
          f"{(med(lz_p) - med(col(L, 'pack_index'))) / MIB:.2f} MiB "
          f"(read / tensor bytes: {med(lz_p) / R['tensor_bytes']:.2f}x) | | | | |")
    print(f"| peak RSS of the process (VmHWM) | {med(col(L, 'peak_rss')) / MIB:.0f} MiB | "
          f"{med(col(D, 'peak_rss')) / MIB:.0f} MiB | {med(col(N, 'peak_rss')) / MIB:.0f} MiB | | |")
    print(f"| peak RSS above the imports (minus VmHWM after import torch, ckptfs) | "
          f"{med([r['peak_rss'] - r['hwm_base'] for r in L]) / MIB:.1f} MiB | "
          f"{med([r['peak_rss'] - r['hwm_base'] for r in D]) / MIB:.0f} MiB | "
          f"{med([r['peak_rss'] - r['hwm_base'] for r in N]) / MIB:.0f} MiB | | |")
    print(f"| daemon peak RSS (VmHWM, fresh daemon) | {med(col(L, 'daemon_hwm')) / MIB:.0f} MiB | "
          f"{med(col(D, 'daemon_hwm')) / MIB:.0f} MiB | | | |")
    print(f"| not timed: import torch / import ckptfs | {ms(col(L, 'import_torch'))} / "
          f"{ms(col(L, 'import_ckptfs'))} | | | | |")
    if "steps" in R:
        S = R["steps"]
        print(f"\ndiagnostic, the lazy path step by step (cold, {len(S)} runs, medians; total "
              f"{ms(col(S, 't_first'))}, index.json {med(col(S, 'index_bytes')) / 1024:.1f} KiB "
              f"for {S[0]['ntensors']} tensors):\n")
        print("| step | time | pack bytes read |")
        print("|---|---|---|")
        for s, label in (("lookup", "stat FILE@tensors (daemon parses data.pkl, builds the view)"),
                         ("index_read", "open + read index.json"),
                         ("index_parse", "json.loads + find the entry"),
                         ("npy_open", "np.load(mmap_mode='r'): open .npy, read its header, mmap"),
                         ("npy_data", "np.array copy (page faults on the mapping) + torch.from_numpy")):
            print(f"| {label} | {ms(col(S, 't_' + s))} ({rng([x * 1e3 for x in col(S, 't_' + s)], '{:.2f}')}) "
                  f"| {med(col(S, 'pack_' + s)) / MIB:.3f} MiB |")


if __name__ == "__main__":
    main()
