"""ckptfs on an S3 store against the same cluster's raw S3 throughput, measured in the same run
(scripts/bench/s3.sh runs it; docs/scale-out.md has the results).

For K = 1, 2, 4 nodes (mounts of one s3:// store, each with its own cache directory and node
name), each node saves one torch shard of --mib MiB (a distinct random fp32 state dict) and
fsyncs it: fsync returns once the shard is in the bucket. Save throughput = K * shard bytes /
time until the last fsync returned. Restore: K new mounts with empty caches read their shard
back (a mount restores the node's catalog image and serves at once; records are read from the
bucket on demand); restore throughput = K * shard bytes / time from the mounts' start to the
last byte read. "mount s" is the median of the slowest mount's start-up, a fixed cost that a
larger shard amortizes. "local" is the ceiling of a restore on this machine: the same K
mounts and reads, timed the same way, from the caches that saved the shards (every record on
local disk, in the page cache: mount, decode and FUSE only), as a ratio to raw GET. The peers:
K concurrent boto3 PUTs of the same shard bytes, then K concurrent GETs of them, against the
same radosgw. Medians of --runs.

Not a test: prints a table. Needs root (FUSE), Ceph, python3-boto3 and torch."""
import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "s3"))
import ceph_fixture  # noqa: E402

import boto3  # noqa: E402
import botocore.config  # noqa: E402
import torch  # noqa: E402

MiB = 1 << 20


def shard_bytes(mib, seed):
    g = torch.Generator().manual_seed(seed)
    n = mib * MiB // 4 // 8
    state = {"w%d" % i: torch.randn(n, generator=g) for i in range(8)}
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def run(args, env, timeout=600):
    p = subprocess.run(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError("%s failed: %s %s" % (" ".join(args), p.stdout, p.stderr))
    return p.stdout


def parallel(fns):
    errors = []

    def wrap(fn):
        try:
            fn()
        except BaseException as e:  # reported after the join
            errors.append(e)
    threads = [threading.Thread(target=wrap, args=(fn,)) for fn in fns]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return time.monotonic() - t0


class Bench:
    def __init__(self, ckptfs, root, cluster):
        self.ckptfs, self.root, self.cluster = ckptfs, root, cluster
        self.env = dict(os.environ, **cluster.env())
        self.s3 = boto3.client("s3", endpoint_url=cluster.endpoint,
                               aws_access_key_id=cluster.access_key,
                               aws_secret_access_key=cluster.secret_key, region_name="us-east-1",
                               config=botocore.config.Config(max_pool_connections=16))
        self.s3.create_bucket(Bucket="bench")
        self.mounts = []

    def mount(self, loc, node, tag):
        base = tempfile.mkdtemp(prefix=tag + "-", dir=self.root)
        mnt, cache = os.path.join(base, "mnt"), os.path.join(base, "cache")
        os.mkdir(mnt)
        run([self.ckptfs, "mount", loc, mnt, "--cache-dir", cache, "--node", node,
             "--seal-after", "0"], self.env)
        self.mounts.append(mnt)
        return mnt, base

    def umount(self, mnt):
        run([self.ckptfs, "umount", mnt], self.env)
        self.mounts.remove(mnt)

    def close(self):
        for mnt in list(self.mounts):
            subprocess.run(["fusermount3", "-u", "-z", mnt], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
        self.mounts = []

    def ckptfs_round(self, k, shards, tag):
        loc = "s3://bench/%s" % tag
        run([self.ckptfs, "init", loc], self.env)
        nodes = [self.mount(loc, "r%d" % i, tag + "-save") for i in range(k)]
        os_dirs = []
        for mnt, _ in nodes:
            os.mkdir(os.path.join(mnt, "step1"))
            os_dirs.append(os.path.join(mnt, "step1"))

        def save(i):
            def fn():
                with open(os.path.join(os_dirs[i], "shard.pt"), "wb") as f:
                    f.write(shards[i])
                    f.flush()
                    os.fsync(f.fileno())
            return fn
        save_s = parallel([save(i) for i in range(k)])
        for mnt, base in nodes:
            self.umount(mnt)

        # The floor of a restore: the same reads, timed the same way, from the caches that
        # saved the shards (every record on local disk, in the page cache): mount, decode, FUSE.
        local_got = [None] * k

        def local(i):
            def fn():
                mnt = os.path.join(nodes[i][1], "mnt")
                run([self.ckptfs, "mount", loc, mnt, "--cache-dir",
                     os.path.join(nodes[i][1], "cache"), "--node", "r%d" % i, "--seal-after",
                     "0"], self.env)
                self.mounts.append(mnt)
                with open(os.path.join(mnt, "step1", "shard.pt"), "rb") as f:
                    local_got[i] = f.read()
            return fn
        local_s = parallel([local(i) for i in range(k)])
        for i, (mnt, base) in enumerate(nodes):
            self.umount(mnt)
            shutil.rmtree(base)
            if local_got[i] != shards[i]:
                raise RuntimeError("shard %d read back from its own cache differs" % i)

        got = [None] * k
        mount_s = [0.0] * k

        def restore(i):
            def fn():
                t0 = time.monotonic()
                mnt, _ = self.mount(loc, "r%d" % i, tag + "-restore")
                mount_s[i] = time.monotonic() - t0
                with open(os.path.join(mnt, "step1", "shard.pt"), "rb") as f:
                    got[i] = f.read()
            return fn
        restore_s = parallel([restore(i) for i in range(k)])
        for i in range(k):
            if got[i] != shards[i]:
                raise RuntimeError("restored shard %d differs" % i)
        for mnt in list(self.mounts):
            self.umount(mnt)
        uploaded = sum(o["Size"] for page in self.s3.get_paginator("list_objects_v2").paginate(
            Bucket="bench", Prefix=tag + "/") for o in page.get("Contents", []))
        self.delete_prefix(tag + "/")
        return save_s, restore_s, uploaded, max(mount_s), local_s

    def raw_round(self, k, shards, tag):
        keys = ["%s/raw-%d" % (tag, i) for i in range(k)]
        put_s = parallel([lambda i=i: self.s3.put_object(Bucket="bench", Key=keys[i],
                                                         Body=shards[i]) for i in range(k)])
        got = [None] * k

        def get(i):
            got[i] = self.s3.get_object(Bucket="bench", Key=keys[i])["Body"].read()
        get_s = parallel([lambda i=i: get(i) for i in range(k)])
        if got != shards[:k]:
            raise RuntimeError("raw GET returned other bytes")
        self.delete_prefix(tag + "/")
        return put_s, get_s

    def delete_prefix(self, prefix):
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket="bench",
                                                                      Prefix=prefix):
            for o in page.get("Contents", []):
                self.s3.delete_object(Bucket="bench", Key=o["Key"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckptfs", required=True)
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--nodes", default="1,2,4")
    ap.add_argument("--json")
    args = ap.parse_args()
    ks = [int(k) for k in args.nodes.split(",")]
    root = tempfile.mkdtemp(prefix="s3-bench-", dir="/tmp")
    shards = [shard_bytes(args.mib, seed) for seed in range(max(ks))]
    size = len(shards[0])
    results = {}
    cluster = ceph_fixture.CephCluster(os.path.join(root, "ceph"),
                                       memstore_bytes=max(4 << 30, 6 * max(ks) * size))
    bench = None
    try:
        cluster.start()
        bench = Bench(os.path.abspath(args.ckptfs), root, cluster)
        for run_no in range(args.runs):
            for k in ks:
                tag = "r%d-k%d" % (run_no, k)
                put_s, get_s = bench.raw_round(k, shards, tag + "-raw")
                save_s, restore_s, uploaded, mount_s, local_s = bench.ckptfs_round(k, shards,
                                                                                   tag)
                r = results.setdefault(k, {"put": [], "get": [], "save": [], "restore": [],
                                           "uploaded": [], "mount": [], "local": []})
                r["put"].append(put_s)
                r["get"].append(get_s)
                r["save"].append(save_s)
                r["restore"].append(restore_s)
                r["uploaded"].append(uploaded)
                r["mount"].append(mount_s)
                r["local"].append(local_s)
                print("run %d, %d node(s): raw PUT %.2f s, GET %.2f s; ckptfs save %.2f s, "
                      "restore %.2f s (mount %.2f s; from the saving caches %.2f s), "
                      "%.1f MiB in the bucket"
                      % (run_no + 1, k, put_s, get_s, save_s, restore_s, mount_s, local_s,
                         uploaded / MiB),
                      file=sys.stderr)
    finally:
        if bench:
            bench.close()
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)

    print("shard %.1f MiB per node, medians of %d runs (MB/s aggregate)" % (size / MiB, args.runs))
    print("%-6s %10s %10s %8s %10s %10s %8s %12s %8s %10s" % (
        "nodes", "raw PUT", "save", "ratio", "raw GET", "restore", "ratio", "uploaded/raw",
        "mount s", "local"))
    for k in ks:
        r = results[k]
        mb = k * size / 1e6
        put, save = mb / statistics.median(r["put"]), mb / statistics.median(r["save"])
        get, restore = mb / statistics.median(r["get"]), mb / statistics.median(r["restore"])
        local = mb / statistics.median(r["local"])
        print("%-6d %10.1f %10.1f %7.2fx %10.1f %10.1f %7.2fx %12.2f %8.2f %9.2fx"
              % (k, put, save, save / put, get, restore, restore / get,
                 statistics.median(r["uploaded"]) / (k * size), statistics.median(r["mount"]),
                 local / get))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"shard_bytes": size, "runs": results}, f, indent=1)


if __name__ == "__main__":
    main()
