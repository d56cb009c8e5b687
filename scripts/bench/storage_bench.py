#!/usr/bin/python3
"""The storage benchmark behind scripts/bench/storage.sh: what each version of a real training
trajectory costs to keep, in ckptfs and in the usual tools, measured from outside.

Input: directories of trajectories as scripts/gen_trajectory.py writes them
(DIR/<trajectory>/global_step<N>/*.pt, DIR/<trajectory>/latest), and of real pretrained weights
as scripts/bench/pretrained_weights.py writes them (one version per dtype). For each
trajectory, versions in step order:

  raw      the bytes of the version's files.
  ckptfs   one fresh store per trajectory, mounted with `ckptfs mount` and default options,
           as a user would (--codec CODEC only when given);
           `cp -r VERSION MNT/`, `latest` rewritten with the tag (as DeepSpeed does), then
           `ckptfs sync MNT`. Stored bytes added = growth of the store's pack bytes (the
           `ckptfs stats MNT` pack_bytes, cross-checked against the sizes of STORE/packs/*).
  ckptfs, Lightning layout
           the same files, but saved as Lightning and `ckpt_{step}.pt` loops save: every
           checkpoint as a new file name in ONE directory (`lightning_logs/version_0/
           checkpoints/epoch=0-step=N-FILE`, the directory marked for file versions, docs/fs.md),
           so no file has a same-named predecessor and deltas come from the tensor layout.
           One run (stored bytes do not vary between runs); versions of more than one file
           (DeepSpeed's model + optimizer files) give one checkpoint file each.
  zstd -3  every file of the version compressed on its own (`zstd -3`, one thread); the sum of
           the compressed sizes. No dedup between versions: the baseline of "just compress it".
  restic   `restic backup` of the version directory into ONE repository per trajectory
           (restic's defaults: content-defined chunking, repository v2, compression auto);
           growth of the repository's bytes (du -s -B1, allocated: packs, index, snapshot). restic draws its
           chunker polynomial at random per repository, so its numbers vary a little per run.
  borg     `borg create --compression zstd,3` into ONE repository per trajectory (--encryption
           none; borg's default chunker, buzhash 512 KiB .. 8 MiB, ~2 MiB average); growth of the
           repository's bytes.
  ingest   wall time, medians of --runs runs, each on a fresh store / fresh target directory,
           the three variants back to back per version in an order rotated per run:
             ckptfs   cp -r into the mount + latest + ckptfs sync (durable)
             cp       cp -r to a native directory on the same disk + sync (durable)
             zstd     zstd -3 -T2 of the version's files into a native directory + sync
           An untimed `sync` runs before each, so no one pays for another's dirty pages. The
           source files are in the page cache for all three (no drop_caches). The restic and
           borg times (one run, not durable in the same sense) are printed for reference.

  read-back
           after the table's runs, the first run's ckptfs store of the trajectory is mounted
           again (umount + mount, default options) and every file of every version is compared
           with the source files (BLAKE2b-256, the source hashed once); then two middle
           versions (one with three versions, none with fewer) are `rm -rf`ed, `ckptfs gc MNT`
           runs, and every remaining version is compared again. One line per trajectory:
           versions checked, files, bytes, mismatches; the bench exits 1 on any mismatch.

Ratios: each tool's stored/raw, ckptfs/zstd (stored bytes) and ckptfs/cp, ckptfs/zstd (time),
per version and per trajectory for the first version, the versions after it, and all of them.
Progress goes to stderr, the table to stdout. storage.sh is the entry point (it installs restic,
borgbackup and zstd and unmounts whatever is left on failure); this file unmounts its own
mounts in finally blocks, also on SIGTERM.
"""
import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time

T0 = time.monotonic()
ORDER = ["fp32", "bf16", "finetune", "pretrained-fp32", "pretrained-fp16", "pretrained-bf16"]


def log(msg):
    print(f"[{time.monotonic() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def run(argv, env=None, cwd=None, quiet=True):
    p = subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.PIPE if quiet else None,
                       stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        raise SystemExit(f"storage_bench: {' '.join(argv)} exited {p.returncode}\n"
                         f"{p.stdout or ''}{p.stderr}")
    return p.stdout


def cpu_name():
    """The CPU as /proc/cpuinfo names it, with its family and model (a VM's "AMD EPYC" says
    neither the generation nor the core): ingest times are only comparable on the same one."""
    info = {}
    processors = 0
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:  # the first CPU's lines only
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "processor":
                    processors += 1
                    if processors > 1:
                        break
                info.setdefault(key, value.strip())
    except OSError:
        return "unknown CPU"
    name = info.get("model name", "unknown CPU")
    if "cpu family" in info:
        name += f" (family {info['cpu family']} model {info.get('model', '?')})"
    return name


def timed(argvs, env=None, cwd=None):
    """Runs the commands in sequence; wall seconds for all of them."""
    t = time.monotonic()
    for argv in argvs:
        run(argv, env=env, cwd=cwd)
    return time.monotonic() - t


def tree_bytes(path):
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            st = os.lstat(os.path.join(root, f))
            total += st.st_size
    return total


def du_b(path):
    """Bytes the tree takes on disk (allocated blocks: holes, e.g. the records ckptfs punches
    out of its packs once re-encoded, take none), the same measure for every tool."""
    return int(run(["du", "-s", "-B1", path]).split()[0])


def med(xs):
    return statistics.median(xs) if xs else float("nan")


# ---------------------------------------------------------------- the input

def trajectories(data):
    out = []
    for name in os.listdir(data):
        tdir = os.path.join(data, name)
        if not os.path.isdir(tdir):
            continue
        versions = []
        for v in os.listdir(tdir):
            m = re.fullmatch(r"global_step(\d+)", v)
            if m and os.path.isdir(os.path.join(tdir, v)):
                versions.append((int(m.group(1)), v))
        if versions:
            versions.sort()
            out.append((name, tdir, [v for _, v in versions]))
    out.sort(key=lambda t: (ORDER.index(t[0]) if t[0] in ORDER else len(ORDER), t[0]))
    return out


def version_files(vdir):
    files = []
    for root, _, names in os.walk(vdir):
        files += [os.path.join(root, n) for n in names]
    return sorted(files)


# ---------------------------------------------------------------- ckptfs

class Mount:
    def __init__(self, args, store, mnt):
        self.args, self.store, self.mnt = args, store, mnt
        self.mounted = False

    def __enter__(self):
        os.makedirs(self.mnt, exist_ok=True)
        codec = ["--codec", self.args.codec] if self.args.codec else []
        run([self.args.bin, "mount", self.store, self.mnt, "--create"] + codec)
        self.mounted = True
        return self

    def close(self):
        if not self.mounted:
            return
        try:
            run([self.args.bin, "umount", self.mnt])
        except SystemExit as e:
            log(f"ckptfs umount failed ({e}); fusermount3 -u -z")
            subprocess.run(["fusermount3", "-u", "-z", self.mnt])
        self.mounted = False

    def __exit__(self, *exc):
        self.close()
        return False


def parse_stats(text):
    res = {}
    for line in text.splitlines():
        parts = line.rsplit(None, 1)
        if len(parts) == 2:
            with_spaces = parts[0].strip().replace("_", " ")
            try:
                res[with_spaces] = float(parts[1])
            except ValueError:
                pass
    return res


def pack_bytes(args, where, store):
    st = parse_stats(run([args.bin, "stats", where]))
    packs = os.path.join(store, "packs")
    def on_disk(p):  # the file's length, less its holes (as the store counts pack bytes)
        st = os.stat(p)
        return min(st.st_size, st.st_blocks * 512)
    files = sum(on_disk(os.path.join(packs, f)) for f in os.listdir(packs)) \
        if os.path.isdir(packs) else 0
    return int(st.get("pack bytes", -1)), files


# ---------------------------------------------------------------- one trajectory

def measure(args, name, tdir, versions):
    scratch = os.path.join(args.dir, name)
    os.makedirs(scratch, exist_ok=True)
    V = [dict(tag=v, raw=tree_bytes(os.path.join(tdir, v)),
              files=version_files(os.path.join(tdir, v)), t_ckptfs=[], t_cp=[], t_zstd=[],
              ckptfs_runs=[]) for v in versions]
    umounts = []
    store_totals = {}
    for r in range(args.runs):
        store = os.path.join(scratch, f"store{r}")
        mnt = os.path.join(scratch, f"mnt{r}")
        native = os.path.join(scratch, f"native{r}")
        zdir = os.path.join(scratch, f"zstd{r}")
        os.makedirs(native)
        os.makedirs(zdir)
        with Mount(args, store, mnt) as m:
            prev = pack_bytes(args, mnt, store)
            for i, v in enumerate(V):
                src = os.path.join(tdir, v["tag"])
                latest = os.path.join(mnt, "latest")

                def do_ckptfs():
                    t = time.monotonic()
                    run(["cp", "-r", src, mnt + "/"])
                    with open(latest, "w") as f:
                        f.write(v["tag"])
                    run([args.bin, "sync", mnt])
                    return time.monotonic() - t

                def do_cp():
                    return timed([["cp", "-r", src, native + "/"], ["sync"]])

                def do_zstd():
                    out = os.path.join(zdir, v["tag"])
                    os.makedirs(out)
                    return timed([["zstd", "-3", "-T2", "-q", "--output-dir-flat", out]
                                  + v["files"], ["sync"]])

                variants = [("t_ckptfs", do_ckptfs), ("t_cp", do_cp), ("t_zstd", do_zstd)]
                k = (r + i) % len(variants)
                for key, fn in variants[k:] + variants[:k]:
                    os.sync()
                    v[key].append(fn())
                now = pack_bytes(args, mnt, store)
                v["ckptfs_runs"].append((now[0] - prev[0], now[1] - prev[1]))
                prev = now
                log(f"{name} run {r + 1}/{args.runs} {v['tag']}: ckptfs "
                    f"+{v['ckptfs_runs'][-1][0]:,} B in {v['t_ckptfs'][-1]:.2f} s, "
                    f"cp {v['t_cp'][-1]:.2f} s, zstd -T2 {v['t_zstd'][-1]:.2f} s")
            t = time.monotonic()
            m.close()
            umounts.append(time.monotonic() - t)
        if r == 0:
            st = parse_stats(run([args.bin, "stats", store]))
            store_totals = dict(pack=int(st.get("pack bytes", 0)), du=du_b(store),
                                catalog=du_b(os.path.join(store, "catalog")),
                                logical=int(st.get("logical bytes", 0)))
            readback = read_back(args, name, tdir, V, store, mnt)
        for p in (store, mnt, native, zdir):
            shutil.rmtree(p, ignore_errors=True)

    # The Lightning layout: one directory of renamed checkpoint files, one store, one run.
    store = os.path.join(scratch, "store-lightning")
    mnt = os.path.join(scratch, "mnt-lightning")
    with Mount(args, store, mnt):
        logs = os.path.join(mnt, "lightning_logs")
        os.mkdir(logs)
        os.setxattr(logs, "user.ckptfs.file_versions", b"1")
        ckpts = os.path.join(logs, "version_0", "checkpoints")
        os.makedirs(ckpts)
        prev = pack_bytes(args, mnt, store)[0]
        for v in V:
            step = re.search(r"\d+$", v["tag"]).group(0)
            src = os.path.join(tdir, v["tag"])
            for f in v["files"]:
                rel = os.path.relpath(f, src).replace(os.sep, "-")
                run(["cp", f, os.path.join(ckpts, f"epoch=0-step={step}-{rel}")])
            run([args.bin, "sync", mnt])
            now = pack_bytes(args, mnt, store)[0]
            v["ckptfs_lightning"] = now - prev
            prev = now
        log(f"{name}: Lightning layout done")
    shutil.rmtree(store, ignore_errors=True)

    for v in V:
        runs = v.pop("ckptfs_runs")
        v["ckptfs"] = runs[0][0]
        v["ckptfs_packfiles"] = runs[0][1]
        v["ckptfs_all_runs"] = [x[0] for x in runs]

    # zstd -3, one thread: the compressed size of each file.
    for v in V:
        total = 0
        for f in v["files"]:
            p = subprocess.Popen(["zstd", "-3", "-T1", "-q", "-c", f], stdout=subprocess.PIPE)
            while True:
                b = p.stdout.read(1 << 20)
                if not b:
                    break
                total += len(b)
            if p.wait() != 0:
                raise SystemExit(f"storage_bench: zstd -3 -c {f} failed")
        v["zstd"] = total
    log(f"{name}: zstd -3 sizes done")

    # restic: one repository for the whole trajectory.
    env = dict(os.environ, RESTIC_PASSWORD="ckptfs-bench", RESTIC_CACHE_DIR=os.path.join(
        scratch, "restic-cache"))
    repo = os.path.join(scratch, "restic")
    run(["restic", "init", "--repo", repo], env=env)
    prev = du_b(repo)
    for v in V:
        t = time.monotonic()
        run(["restic", "backup", "--repo", repo, "--no-cache", "--host", "bench", "--tag",
             v["tag"], v["tag"]], env=env, cwd=tdir)
        v["t_restic"] = time.monotonic() - t
        now = du_b(repo)
        v["restic"] = now - prev
        prev = now
    restic_total = prev
    shutil.rmtree(repo)
    log(f"{name}: restic done")

    # borg: one repository for the whole trajectory.
    env = dict(os.environ, BORG_PASSPHRASE="", BORG_UNKNOWN_UNENCRYPTED_REPO_ACCESS_IS_OK="yes",
               BORG_RELOCATED_REPO_ACCESS_IS_OK="yes",
               BORG_BASE_DIR=os.path.join(scratch, "borg-base"))
    repo = os.path.join(scratch, "borg")
    run(["borg", "init", "--encryption", "none", repo], env=env)
    prev = du_b(repo)
    for v in V:
        t = time.monotonic()
        run(["borg", "create", "--compression", args.borg_compression, f"{repo}::{v['tag']}",
             v["tag"]], env=env, cwd=tdir)
        v["t_borg"] = time.monotonic() - t
        now = du_b(repo)
        v["borg"] = now - prev
        prev = now
    borg_total = prev
    shutil.rmtree(scratch, ignore_errors=True)
    log(f"{name}: borg done")

    for v in V:
        v.pop("files")
    return dict(name=name, versions=V, umount=umounts, store=store_totals,
                restic_total=restic_total, borg_total=borg_total, readback=readback)


# ---------------------------------------------------------------- read-back

def digest(path):
    h = hashlib.blake2b(digest_size=32)
    with open(path, "rb") as f:
        while True:
            b = f.read(1 << 20)
            if not b:
                break
            h.update(b)
    return h.digest()


def read_back(args, name, tdir, V, store, mnt):
    """Every file of every version of the run-0 store, read back through a fresh mount of it
    (umount + mount) and compared with the source bytes; then two middle versions `rm -rf`
    (one when there are three versions, none with fewer), `ckptfs gc` on the mount, and every
    remaining version compared again. The source is hashed once (BLAKE2b-256); a read error
    counts as a mismatch. Returns the counts for the read-back line."""
    src = {}
    for v in V:
        base = os.path.join(tdir, v["tag"])
        for f in v["files"]:
            src[(v["tag"], os.path.relpath(f, base))] = (digest(f), os.path.getsize(f))
    res = dict(checks=[], removed=[], gc=False)

    def compare(label, tags):
        n_files = n_bytes = bad = 0
        problems = []
        for tag in tags:
            vdir = os.path.join(mnt, tag)
            want = {rel for (t, rel) in src if t == tag}
            have = {os.path.relpath(f, vdir) for f in version_files(vdir)} \
                if os.path.isdir(vdir) else set()
            for rel in sorted(want | have):
                n_files += 1
                if rel not in want or rel not in have:
                    bad += 1
                    problems.append(f"{tag}/{rel}: {'missing' if rel in want else 'extra'}")
                    continue
                h, size = src[(tag, rel)]
                try:
                    got = digest(os.path.join(vdir, rel))
                except OSError as e:
                    got = None
                    problems.append(f"{tag}/{rel}: {e}")
                if got != h:
                    bad += 1
                    if got is not None:
                        problems.append(f"{tag}/{rel}: bytes differ")
                else:
                    n_bytes += size
        for p in problems[:10]:
            log(f"{name} read-back {label}: MISMATCH {p}")
        res["checks"].append(dict(label=label, versions=len(tags), files=n_files,
                                  bytes=n_bytes, mismatches=bad))
        log(f"{name} read-back {label}: {len(tags)} versions, {n_files} files, "
            f"{n_bytes:,} B, {bad} mismatches")

    tags = [v["tag"] for v in V]
    with Mount(args, store, mnt):
        compare("after remount", tags)
        middle = tags[1:-1]
        k = len(middle)
        gone = middle[(k - 1) // 2:(k - 1) // 2 + 2] if k >= 2 else middle
        for tag in gone:
            run(["rm", "-rf", os.path.join(mnt, tag)])
        res["removed"] = gone
        if gone:
            run([args.bin, "gc", mnt])
            res["gc"] = True
            compare(f"after rm -rf {' '.join(gone)} + gc", [t for t in tags if t not in gone])
    return res


def readback_lines(results):
    lines, bad = [], 0
    for res in results:
        rb = res["readback"]
        parts = []
        for c in rb["checks"]:
            bad += c["mismatches"]
            parts.append(f"{c['label']}: {c['versions']} versions, {c['files']} files, "
                         f"{mb(c['bytes'])} MB, {c['mismatches']} mismatches")
        if not rb["gc"]:
            parts.append("no middle version to remove (gc not exercised)")
        lines.append(f"read-back {res['name']}: " + "; ".join(parts))
    return lines, bad


# ---------------------------------------------------------------- the table

def mb(b):
    return f"{b / 1e6:.3f}" if abs(b) < 1e7 else f"{b / 1e6:.1f}"


def cell(b, raw):
    return f"{mb(b)} ({b / raw:.3f})" if raw else mb(b)


def rows(res):
    """(label, dict of summed sizes and per-run summed times) per row of one trajectory."""
    V = res["versions"]
    groups = [(v["tag"], [v]) for v in V]
    groups.append(("**first version**", V[:1]))
    if len(V) > 1:
        groups.append(("**versions after the first**", V[1:]))
    groups.append(("**all versions**", V))
    out = []
    for label, vs in groups:
        agg = {k: sum(v[k] for v in vs)
               for k in ("raw", "ckptfs", "ckptfs_lightning", "zstd", "restic", "borg")}
        for k in ("t_ckptfs", "t_cp", "t_zstd"):
            # median over runs of the per-run sum
            agg[k] = med([sum(v[k][r] for v in vs) for r in range(len(vs[0][k]))])
        agg["t_restic"] = sum(v["t_restic"] for v in vs)
        agg["t_borg"] = sum(v["t_borg"] for v in vs)
        out.append((label, agg))
    return out


def codec_label(args):
    return f"--codec {args.codec}" if args.codec else "(default options)"


def table(results, args):
    print(f"\n| trajectory | version | raw MB | ckptfs {codec_label(args)} MB (/raw) | "
          "ckptfs, Lightning layout MB (/raw) | "
          f"zstd -3 MB (/raw) | restic MB (/raw) | borg {args.borg_compression} MB (/raw) | "
          "ckptfs/zstd bytes | ingest s: ckptfs / cp / zstd -T2 | ckptfs/cp time | "
          "ckptfs/zstd time |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for res in results:
        for label, a in rows(res):
            raw = a["raw"]
            print(f"| {res['name']} | {label} | {mb(raw)} | {cell(a['ckptfs'], raw)} | "
                  f"{cell(a['ckptfs_lightning'], raw)} | {cell(a['zstd'], raw)} | {cell(a['restic'], raw)} | {cell(a['borg'], raw)} | "
                  f"{a['ckptfs'] / a['zstd']:.3f} | {a['t_ckptfs']:.2f} / {a['t_cp']:.2f} / "
                  f"{a['t_zstd']:.2f} | {a['t_ckptfs'] / a['t_cp']:.2f}x | "
                  f"{a['t_ckptfs'] / a['t_zstd']:.2f}x |")
    print("\nWhole stores after the last version, du -s -B1 (allocated bytes; /raw of all versions): the ckptfs "
          "store is packs + LMDB catalog + small files, after umount; the restic and borg "
          "repositories include their indexes and snapshots.")
    print("\n| trajectory | raw MB | ckptfs store MB | of which catalog MB | restic repo MB | "
          "borg repo MB | restic / borg time, 1 run | ckptfs umount s |")
    print("|---|---|---|---|---|---|---|---|")
    for res in results:
        raw = sum(v["raw"] for v in res["versions"])
        st = res["store"]
        print(f"| {res['name']} | {mb(raw)} | {cell(st['du'], raw)} | {mb(st['catalog'])} | "
              f"{cell(res['restic_total'], raw)} | {cell(res['borg_total'], raw)} | "
              f"{sum(v['t_restic'] for v in res['versions']):.1f} s / "
              f"{sum(v['t_borg'] for v in res['versions']):.1f} s | {med(res['umount']):.2f} |")
    notes = []
    for res in results:
        for v in res["versions"]:
            if len(set(v["ckptfs_all_runs"])) > 1:
                notes.append(f"{res['name']} {v['tag']}: ckptfs stored bytes differ between "
                             f"runs: {v['ckptfs_all_runs']}")
            if v["ckptfs_packfiles"] != v["ckptfs"]:
                notes.append(f"{res['name']} {v['tag']}: stats pack bytes +{v['ckptfs']} vs "
                             f"pack files +{v['ckptfs_packfiles']}")
    for n in notes:
        print("note: " + n)
    if not notes:
        print(f"\nckptfs stored bytes were the same in all {args.runs} runs, and equal to the "
              "growth of STORE/packs/*.")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True, action="append",
                    help="trajectories (gen_trajectory.py --out, pretrained_weights.py --out); "
                         "may be given more than once")
    ap.add_argument("--dir", required=True, help="scratch directory (stores, repositories)")
    ap.add_argument("--bin", default="build/ckptfs")
    ap.add_argument("--codec", default="",
                    help="ckptfs mount --codec; default: none given (the store's default)")
    ap.add_argument("--borg-compression", default="zstd,3")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", help="also write every measurement there")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    trajs = [t for d in args.data for t in trajectories(d)]
    trajs.sort(key=lambda t: (ORDER.index(t[0]) if t[0] in ORDER else len(ORDER), t[0]))
    if not trajs:
        raise SystemExit(f"storage_bench: no DIR/<trajectory>/global_step<N>/ in {args.data}")
    versions = {
        "ckptfs": args.bin,
        "zstd": "zstd " + re.search(r"v[0-9.]+", run(["zstd", "--version"])).group(0),
        "restic": " ".join(run(["restic", "version"]).split()[:2]),
        "borg": run(["borg", "--version"]).strip(),
    }
    log(f"{os.cpu_count()} CPUs ({cpu_name()}), load {os.getloadavg()[0]:.2f}; " + "; ".join(
        f"{k}: {v}" for k, v in versions.items()))
    results = []
    for name, tdir, vs in trajs:
        log(f"{name}: {len(vs)} versions ({vs[0]} .. {vs[-1]})")
        results.append(measure(args, name, tdir, vs))
    print(f"\nstorage bench: {len(results)} trajectories from {', '.join(args.data)}; ckptfs "
          f"{codec_label(args)}; ingest times are medians of {args.runs} run(s); MB = 10^6 bytes; "
          f"{versions['zstd']}; {versions['restic']} (repository v2, compression auto); "
          f"{versions['borg']} "
          f"(--compression {args.borg_compression}); load at the end "
          f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs ({cpu_name()})")
    table(results, args)
    lines, bad = readback_lines(results)
    print("\nRead-back (run 1's store, default-options mount, against BLAKE2b of the source "
          "files):")
    for line in lines:
        print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(args=vars(args), tools=versions, results=results), f, indent=1)
    if bad:
        raise SystemExit(f"storage_bench: {bad} file(s) did not read back bitwise (see above)")


if __name__ == "__main__":
    main()
