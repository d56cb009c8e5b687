"""A store in an S3 bucket (docs/scale-out.md), through real mounts against the Ceph fixture:
`ckptfs init s3://...`, `ckptfs mount s3://... MNT --cache-dir DIR`; fsync and `ckptfs sync`
return once the data is in the bucket, so a node whose daemon is killed (SIGKILL) loses nothing
they acknowledged: a mount with an empty cache restores it bitwise; a kill in the middle of an
upload leaves the last whole publication.

Skips (77) without root/fuse, torch, Ceph or boto3."""
import os
import shutil
import subprocess
import sys
import threading
import time
import unittest
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "fs"))
import ceph_fixture  # noqa: E402
import mounted  # noqa: E402

try:
    import boto3
    import torch
except ImportError:
    boto3 = torch = None

CLUSTER = None


class S3Mount(mounted.Mount):
    """A node: a cache directory and a mountpoint; `ckptfs mount s3://LOC MNT --cache-dir`."""

    def __init__(self, location, node, name="n"):
        super().__init__(name)
        self.location, self.node = location, node

    def mount(self, options=None):
        assert not mounted.is_mounted(self.mnt)
        try:
            mounted.ckptfs("mount", self.location, self.mnt, "--cache-dir", self.store,
                           "--node", self.node, "--seal-after", "0", *(options or []),
                           timeout=120)
            self.pid = int(os.getxattr(self.mnt, "user.ckptfs.pid"))
            with open(mounted._daemon_pid_file(self.mnt), "w") as f:
                f.write(str(self.pid))
        except BaseException:
            self.close()
            raise
        return self


def model(seed):
    g = torch.Generator().manual_seed(seed)
    return {"layer%d.weight" % i: torch.randn(512, 1024, generator=g) for i in range(4)}


def save_fsynced(obj, path):
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def bucket_keys(prefix):
    if not hasattr(CLUSTER, "s3"):
        CLUSTER.s3 = boto3.client("s3", **CLUSTER.boto_args)
    pages = CLUSTER.s3.get_paginator("list_objects_v2").paginate(Bucket="ckpts", Prefix=prefix)
    return [o["Key"] for page in pages for o in page.get("Contents", [])]


def named_objects(prefix):
    """Object keys the manifests under prefix name (catalog images and pack segments)."""
    import json
    named = set()
    for key in bucket_keys(prefix + "nodes/"):
        doc = json.loads(CLUSTER.s3.get_object(Bucket="ckpts", Key=key)["Body"].read())
        named.add(prefix + "objects/" + doc["catalog"]["sha256"])
        for segments in doc["packs"].values():
            named.update(prefix + "objects/" + seg[2] for seg in segments)
    return named


def packs_on_disk(cache_dir):
    """Bytes the cache's pack files take on disk (allocated blocks; sparse ranges are none)."""
    packs = os.path.join(cache_dir, "packs")
    return sum(os.stat(os.path.join(packs, f)).st_blocks * 512 for f in os.listdir(packs))


def anonymous_resident_outside_the_heap(pid):
    """(resident bytes, mapping line) of the process's anonymous mappings other than [heap]
    (thread stacks, other malloc arenas), largest first."""
    out, head = [], None
    with open("/proc/%d/smaps" % pid) as f:
        for line in f:
            fields = line.split()
            if fields and "-" in fields[0] and ":" not in fields[0]:
                head = line.strip() if len(fields) == 5 else None  # no path: anonymous
            elif head and line.startswith("Rss:"):
                out.append((int(fields[1]) * 1024, head))
    return sorted(out, reverse=True)


class S3StoreTest(unittest.TestCase):
    def node(self, location, node, name, options=None):
        """A node mounted on `location` (S3Mount), closed when the test ends, whatever happens."""
        m = S3Mount(location, node, name)
        self.addCleanup(m.close)
        return m.mount(options)

    def test_init_refuses_twice_and_mount_says_what_is_missing(self):
        mounted.ckptfs("init", "s3://ckpts/twice")
        again = mounted.ckptfs("init", "s3://ckpts/twice", check=False)
        self.assertNotEqual(again.returncode, 0)
        self.assertIn("already", again.stderr)
        node = S3Mount("s3://ckpts/never-made", "n1")
        out = mounted.ckptfs("mount", node.location, node.mnt, "--cache-dir", node.store,
                             check=False, timeout=60)
        self.assertNotEqual(out.returncode, 0)
        self.assertIn("ckptfs init s3://ckpts/never-made", out.stdout + out.stderr)
        out = mounted.ckptfs("mount", "s3://ckpts/twice", node.mnt, check=False)
        self.assertIn("--cache-dir", out.stderr)
        self.assertFalse(mounted.is_mounted(node.mnt))

    def test_acknowledged_saves_survive_sigkill_and_restore_into_an_empty_cache(self):
        loc = "s3://ckpts/acked"
        mounted.ckptfs("init", loc)
        a = self.node(loc, "rank0", "a")
        os.mkdir(a.path("step1"))
        save_fsynced(model(1), a.path("step1", "model.pt"))      # acknowledged by fsync
        with open(a.path("step1", "notes.txt"), "wb") as f:
            f.write(b"step 1\n" * 1000)
        mounted.ckptfs("sync", a.mnt)                             # acknowledged by sync
        expected = {n: mounted.read_file(a.path("step1", n)) for n in ("model.pt", "notes.txt")}
        self.assertTrue(any("/nodes/rank0/manifests/" in k for k in bucket_keys("acked/")))
        a.kill_daemon()                                           # the node dies

        b = self.node(loc, "rank0", "b")  # a new node, empty cache
        # Reads on demand: the mount restored the catalog and serves at once; the packs are
        # sparse files whose records come from the bucket as they are read, through the
        # memory cache, never onto this node's disk.
        self.assertTrue(os.path.exists(os.path.join(b.store, "remote-packs.json")))
        self.assertLess(packs_on_disk(b.store), 1 << 20)
        for name, data in expected.items():
            self.assertEqual(mounted.read_file(b.path("step1", name)), data, name)
        self.assertLess(packs_on_disk(b.store), 1 << 20)
        loaded = torch.load(b.path("step1", "model.pt"))
        for k, v in model(1).items():
            self.assertTrue(torch.equal(loaded[k], v), k)
        # The restored node goes on writing and publishing from where the bucket was: a next
        # step, stored as deltas that the re-encoder then reverses (its punches race the
        # publication's reads of the packs; bucket_mirror.cc).
        step2 = {k: v * (1 + 1e-6) for k, v in model(1).items()}
        os.mkdir(b.path("step2"))
        save_fsynced(step2, b.path("step2", "model.pt"))
        os.mkdir(b.path("step3"))
        step3 = {k: v * (1 + 1e-6) for k, v in step2.items()}
        save_fsynced(step3, b.path("step3", "model.pt"))
        # The store's own gc rewrites packs under the mirror (deleted packs leave the manifest).
        shutil.rmtree(b.path("step2"))
        mounted.ckptfs("gc", b.mnt, "--rewrite-below", "1.0")
        mounted.ckptfs("sync", b.mnt)
        b.umount()
        c = self.node(loc, "rank0", "c")
        self.assertEqual(sorted(os.listdir(c.mnt)), ["step1", "step3"])
        self.assertEqual(mounted.read_file(c.path("step1", "model.pt")), expected["model.pt"])
        loaded = torch.load(c.path("step3", "model.pt"))
        self.assertTrue(all(torch.equal(loaded[k], v) for k, v in step3.items()))
        self.assertEqual(mounted.ckptfs("verify", c.mnt).returncode, 0)

    def test_a_restore_that_a_crash_cut_short_is_done_again(self):
        # A restore syncs nothing on the mount's path but a marker; the files are synced behind
        # the mount, then the marker goes. A cache a crash left with the marker (here: its
        # catalog lost, as a power cut may leave unsynced files) is restored again.
        loc = "s3://ckpts/unsettled"
        mounted.ckptfs("init", loc)
        a = self.node(loc, "n0", "a")
        os.mkdir(a.path("step1"))
        save_fsynced(model(3), a.path("step1", "model.pt"))
        expected = mounted.read_file(a.path("step1", "model.pt"))
        a.umount()
        b = self.node(loc, "n0", "b")
        self.assertEqual(mounted.read_file(b.path("step1", "model.pt")), expected)
        b.umount()
        marker = os.path.join(b.store, "restore-unsettled")
        self.assertFalse(os.path.exists(marker), "the restore was not settled by the unmount")
        with open(os.path.join(b.store, "catalog", "data.mdb"), "wb"):
            pass                                                  # what a crash may leave
        open(marker, "wb").close()
        b.mount()
        self.assertEqual(os.listdir(b.mnt), ["step1"])
        self.assertEqual(mounted.read_file(b.path("step1", "model.pt")), expected)
        b.umount()
        self.assertFalse(os.path.exists(marker))

    def test_a_restoring_daemon_keeps_its_buffers_in_its_one_heap(self):
        # fs/daemon_heap.h: one malloc arena, the heap in huge pages. The S3 client's and the
        # bucket fetchers' threads start before the FUSE session; one that allocated before the
        # daemon asked for a single arena kept an arena of its own (an anonymous mapping beside
        # [heap], in 4 KiB pages: ~10 000 page faults to restore 64 MiB).
        loc = "s3://ckpts/one-heap"
        mounted.ckptfs("init", loc)
        a = self.node(loc, "n0", "a")
        os.mkdir(a.path("step1"))
        g = torch.Generator().manual_seed(5)
        save_fsynced({"w%d" % i: torch.randn(1 << 20, generator=g) for i in range(8)},
                     a.path("step1", "model.pt"))
        a.umount()
        b = self.node(loc, "n0", "b")  # an empty cache
        self.assertGreater(len(mounted.read_file(b.path("step1", "model.pt"))), 32 << 20)
        outside = anonymous_resident_outside_the_heap(b.pid)
        self.assertFalse([m for m in outside if m[0] > (4 << 20)],
                         "anonymous memory outside [heap] (resident bytes, mapping): %s"
                         % outside[:4])
        b.umount()

    def test_ranks_of_a_version_from_two_nodes_appear_whole_on_a_third(self):
        loc = "s3://ckpts/ranks"
        mounted.ckptfs("init", loc)
        poll = ["--remote-poll", "0.3"]
        a = self.node(loc, "node-a", "ra", ["--rank", "0", "--world-size", "2"] + poll)
        b = self.node(loc, "node-b", "rb", ["--rank", "1", "--world-size", "2"] + poll)
        c = self.node(loc, "node-c", "rc", poll)  # a reader with an empty cache
        parts = lambda v: [k for k in bucket_keys("ranks/versions/%s/" % v)]

        # Rank 0 commits its part of step1: the reader must not show step1 yet.
        os.mkdir(a.path("step1"))
        save_fsynced(model(10), a.path("step1", "rank0.pt"))
        mounted.ckptfs("seal", a.path("step1"))
        self.assertTrue(mounted.wait_until(lambda: parts("step1"), 30, 0.1))
        time.sleep(1.5)                                          # several polls of the reader
        self.assertNotIn("step1", os.listdir(c.mnt))
        # Rank 1 commits: step1 appears on the reader with both ranks' files.
        os.mkdir(b.path("step1"))
        save_fsynced(model(11), b.path("step1", "rank1.pt"))
        mounted.ckptfs("seal", b.path("step1"))
        self.assertTrue(mounted.wait_until(lambda: "step1" in os.listdir(c.mnt), 30, 0.1))
        self.assertEqual(sorted(os.listdir(c.path("step1"))),
                         ["manifest.json", "rank0.pt", "rank1.pt"])

        # step2: both ranks save at the same time.
        def save(node, rank):
            os.mkdir(node.path("step2"))
            save_fsynced(model(20 + rank), node.path("step2", "rank%d.pt" % rank))
            mounted.ckptfs("seal", node.path("step2"))
        threads = [threading.Thread(target=save, args=(n, r)) for r, n in enumerate((a, b))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertTrue(mounted.wait_until(lambda: "step2" in os.listdir(c.mnt), 30, 0.1))
        for step, seed in (("step1", 10), ("step2", 20)):
            for rank, node in enumerate((a, b)):
                name = "rank%d.pt" % rank
                self.assertEqual(mounted.read_file(c.path(step, name)),
                                 mounted.read_file(node.path(step, name)), step + "/" + name)
                loaded = torch.load(c.path(step, name))
                self.assertTrue(all(torch.equal(loaded[k], v)
                                    for k, v in model(seed + rank).items()), step + "/" + name)
        # Read from the writers' records in the bucket, on demand: nothing of theirs on disk.
        self.assertLess(packs_on_disk(c.store), 1 << 20)
        # The reader publishes too (its catalog names the writers' segments), and a mount
        # that restores its store reads the versions back; gc keeps what the parts name.
        mounted.ckptfs("sync", c.mnt)
        c.umount()
        mounted.ckptfs("gc", loc, "--grace", "0")
        d = self.node(loc, "node-c", "rd", poll)
        self.assertEqual(mounted.read_file(d.path("step2", "rank1.pt")),
                         mounted.read_file(b.path("step2", "rank1.pt")))

    def test_a_node_saving_state_another_node_published_uploads_almost_nothing(self):
        loc = "s3://ckpts/dedup"
        mounted.ckptfs("init", loc)
        poll = ["--remote-poll", "0.3"]
        a = self.node(loc, "node-a", "da", ["--rank", "0", "--world-size", "1"] + poll)
        os.mkdir(a.path("step1"))
        save_fsynced(model(30), a.path("step1", "model.pt"))
        mounted.ckptfs("seal", a.path("step1"))
        self.assertTrue(mounted.wait_until(lambda: bucket_keys("dedup/versions/step1/"), 30, 0.1))
        shard = os.path.getsize(a.path("step1", "model.pt"))
        a.kill_daemon()                                          # the node dies
        # A new node takes rank 0 over with an empty cache: it adds step1 from the bucket, and
        # its save of the same state finds every chunk there (chunk ids are content hashes).
        e = self.node(loc, "node-e", "de", ["--rank", "0", "--world-size", "1"] + poll)
        self.assertTrue(mounted.wait_until(lambda: "step1" in os.listdir(e.mnt), 30, 0.1))

        def objects():
            pages = CLUSTER.s3.get_paginator("list_objects_v2").paginate(
                Bucket="ckpts", Prefix="dedup/objects/")
            return {o["Key"]: o["Size"] for page in pages for o in page.get("Contents", [])}
        before = objects()
        os.mkdir(e.path("step2"))
        save_fsynced(model(30), e.path("step2", "model.pt"))   # in the bucket when fsync returns
        import json
        images = set()
        for key in bucket_keys("dedup/nodes/node-e/manifests/"):
            doc = json.loads(CLUSTER.s3.get_object(Bucket="ckpts", Key=key)["Body"].read())
            images.add("dedup/objects/" + doc["catalog"]["sha256"])
        new_pack_bytes = sum(size for key, size in objects().items()
                             if key not in before and key not in images)
        print("shard %d bytes; new pack bytes uploaded by the second node: %d"
              % (shard, new_pack_bytes))
        self.assertLess(new_pack_bytes, shard // 50)
        self.assertEqual(mounted.read_file(e.path("step2", "model.pt")),
                         mounted.read_file(e.path("step1", "model.pt")))

    def test_sigkill_during_upload_leaves_the_last_whole_publication(self):
        loc = "s3://ckpts/killed"
        mounted.ckptfs("init", loc)
        a = self.node(loc, "rank0", "a")
        os.mkdir(a.path("v1"))
        first = mounted.data(6 << 20, 1)
        mounted.write_file(a.path("v1", "shard"), first)
        mounted.ckptfs("sync", a.mnt)
        os.mkdir(a.path("v2"))
        second = mounted.data(48 << 20, 2)
        mounted.write_file(a.path("v2", "shard"), second)
        sync = subprocess.Popen([mounted.CKPTFS, "sync", a.mnt], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        # Kill while the second publication uploads (its segments are 16 MiB), not before.
        manifests = lambda: [k for k in bucket_keys("killed/") if "/manifests/" in k]
        objects = len([k for k in bucket_keys("killed/") if "/objects/" in k])
        mounted.wait_until(lambda: len([k for k in bucket_keys("killed/")
                                        if "/objects/" in k]) > objects or sync.poll() is not None,
                           60, 0.02)
        published_before_kill = len(manifests())
        a.kill_daemon()
        sync.wait(60)

        b = self.node(loc, "rank0", "b")
        self.assertEqual(mounted.read_file(b.path("v1", "shard")), first)
        if os.path.exists(b.path("v2", "shard")):  # the publication finished before the kill
            self.assertEqual(mounted.read_file(b.path("v2", "shard")), second)
        v2_restored = os.path.exists(b.path("v2", "shard"))
        b.umount()

        # The killed publication's objects are named by no manifest: gc collects them (grace 0:
        # nothing uploads now), and keeps everything the kept manifests name.
        orphans = set(bucket_keys("killed/objects/")) - named_objects("killed/")
        self.assertTrue(orphans or v2_restored, "the kill left no orphan to collect")
        # A multipart upload a killed node left unfinished (it is what a node dies in during a
        # large segment upload).
        CLUSTER.s3.create_multipart_upload(Bucket="ckpts", Key="killed/objects/" + "0" * 64)
        import json
        # With the default grace period (1 h) nothing this young goes: uploads may be in flight.
        report = json.loads(mounted.ckptfs("gc", loc, "--json").stdout)
        self.assertEqual((report["objects_deleted"], report["uploads_aborted"]), (0, 0))
        report = json.loads(mounted.ckptfs("gc", loc, "--grace", "0", "--json").stdout)
        # (More than the orphans when the kill came after the publication: then the oldest
        # manifest and what only it named go too.)
        self.assertGreaterEqual(report["objects_deleted"], len(orphans))
        self.assertEqual(report["uploads_aborted"], 1)
        self.assertEqual(CLUSTER.s3.list_multipart_uploads(Bucket="ckpts", Prefix="killed/")
                         .get("Uploads", []), [])
        objects = set(bucket_keys("killed/objects/"))
        self.assertEqual(objects & orphans, set())
        self.assertTrue(named_objects("killed/") <= objects)
        c = self.node(loc, "rank0", "c")
        self.assertEqual(mounted.read_file(c.path("v1", "shard")), first)
        print("manifests before the kill: %d; v2 restored: %s; orphans collected: %d"
              % (published_before_kill, v2_restored, len(orphans)))


def main():
    global CLUSTER
    mounted.check_prerequisites()
    if not ceph_fixture.installed() or boto3 is None or torch is None:
        mounted.skip_all("needs Ceph, python3-boto3 and torch (scripts/setup.sh)")
    cluster = ceph_fixture.CephCluster(os.path.join(mounted.root_dir(), "ceph"))
    try:
        cluster.start()
        cluster.boto_args = dict(endpoint_url=cluster.endpoint,
                                 aws_access_key_id=cluster.access_key,
                                 aws_secret_access_key=cluster.secret_key,
                                 region_name="us-east-1")
        os.environ.update(cluster.env())
        CLUSTER = cluster
        warnings.simplefilter("ignore", ResourceWarning)  # boto3's pooled connections
        prog = unittest.main(exit=False, verbosity=2)
    finally:
        # Mounts first (their daemons talk to the gateway), then the cluster.
        for point in mounted.mounted_points():
            if point.startswith(os.path.realpath(mounted.root_dir())):
                mounted.force_unmount(point)
        cluster.stop()
    mounted._remove_root()
    sys.exit(0 if prog.result.wasSuccessful() else 1)


if __name__ == "__main__":
    main()
