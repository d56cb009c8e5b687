"""Live statistics of a mounted store (docs/cli.md "stats", "status"): MNT/.ckptfs/stats read
with open()/json and cat, `ckptfs stats` online and offline, and `ckptfs status`'s write
backlog, around real torch saves and loads; every document checked against schemas.json."""
import json
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cli_common import SCHEMAS, check_schema, json_of, mounted, run, status_of  # noqa: E402

try:
    import torch  # noqa: E402
except ImportError:
    mounted.skip_all("needs python3-torch (run with Debian's /usr/bin/python3)")

MiB = 1 << 20


def state(step):
    g = torch.Generator().manual_seed(step)
    return {"w%d" % i: torch.randn(1024, 1024, generator=g) for i in range(4)}  # 16 MiB


def daemon_write(mnt, path):
    """A write that reaches the daemon with or without FUSE passthrough (an existing non-empty
    file opened without O_TRUNC never passes through), then `ckptfs sync`. `path` must exist
    (non-empty): the overwrite replaces its content, so the store holds as many as before."""
    with open(path, "r+b") as f:
        f.write(b"again")
    run("sync", mnt)


class LiveStats(unittest.TestCase):
    def setUp(self):
        self.m = mounted.Mount("stats")
        self.addCleanup(self.m.close)
        self.m.mount(["--seal-after", "0"])

    def live(self):
        with open(self.m.path(".ckptfs", "stats")) as f:
            doc = json.load(f)
        check_schema(doc, SCHEMAS["stats"], "$stats-file")
        return doc

    def test_stats_file_counts_saves_loads_and_fsyncs(self):
        os.mkdir(self.m.path("step1"))
        notes = self.m.path("step1", "notes.txt")
        with open(notes, "wb") as f:
            f.write(b"first")
        run("sync", self.m.mnt)
        before = self.live()
        self.assertEqual(before["mount"], os.path.realpath(self.m.mnt))
        self.assertEqual(before["store"], os.path.realpath(self.m.store))
        path = self.m.path("step1", "model.pt")
        with open(path, "wb") as f:
            torch.save(state(1), f)
            f.flush()
            os.fsync(f.fileno())
        size = os.path.getsize(path)
        loaded = torch.load(path)
        for k, v in state(1).items():
            self.assertTrue(torch.equal(loaded[k], v), k)
        # A write the daemon sees whatever the mode: with FUSE passthrough (docs/fs.md) the
        # kernel writes files written from empty itself, so the save above has no samples.
        daemon_write(self.m.mnt, notes)
        after = self.live()
        d0, d = before["daemon"], after["daemon"]
        self.assertEqual(d["pid"], self.m.pid)
        self.assertGreaterEqual(d["bytes_written"] - d0["bytes_written"], size)
        self.assertGreaterEqual(d["bytes_read"] - d0["bytes_read"], size)
        lat = d["latency"]
        self.assertGreater(lat["write"]["count"], d0["latency"]["write"]["count"])
        self.assertGreater(lat["read"]["count"], d0["latency"]["read"]["count"])
        self.assertEqual(lat["fsync"]["count"] - d0["latency"]["fsync"]["count"], 1)
        for op in ("read", "write", "fsync"):
            self.assertGreater(lat[op]["p50_us"], 0, op)
            self.assertGreaterEqual(lat[op]["p99_us"], lat[op]["p50_us"], op)
        cpu = d["cpu_seconds"]
        for role in ("fuse", "worker", "commit", "exited"):
            self.assertIn(role, cpu)
        self.assertGreater(sum(cpu.values()), 0)  # clock ticks: some role has one by now
        self.assertEqual(after["contents"], before["contents"] + 1)
        self.assertGreater(after["cache_hits"] + after["cache_misses"], 0)
        # Hidden: not listed, read-only, generated again at each open (cat sees the reads so far).
        self.assertNotIn(".ckptfs", os.listdir(self.m.mnt))
        self.assertEqual(os.listdir(self.m.path(".ckptfs")), ["stats"])
        with self.assertRaises(OSError):
            open(self.m.path(".ckptfs", "stats"), "w")
        cat = subprocess.run(["cat", self.m.path(".ckptfs", "stats")], capture_output=True,
                             text=True, check=True)
        self.assertGreater(json.loads(cat.stdout)["daemon"]["latency"]["read"]["count"],
                           lat["read"]["count"])
        # `ckptfs stats --json` says the same (a later moment: counters only grow).
        cli = json_of(self, "stats", self.m.mnt)
        self.assertGreaterEqual(cli["daemon"]["bytes_written"], d["bytes_written"])
        self.assertEqual(cli["daemon"]["latency"]["fsync"]["count"], lat["fsync"]["count"])
        self.assertEqual(cli["contents"], after["contents"])
        words = run("stats", self.m.mnt)
        self.assertEqual(words.returncode, 0, words.stderr)
        self.assertIn("fsync latency   1 calls", words.stdout)
        self.assertIn("cpu worker", words.stdout)
        self.m.umount()
        offline = json_of(self, "stats", self.m.store)
        self.assertIsNone(offline["daemon"])
        self.assertEqual(offline["contents"], after["contents"])
        self.assertNotIn("cpu worker", run("stats", self.m.store).stdout)

    def test_prometheus_endpoint_on_localhost(self):
        import socket
        import urllib.error
        import urllib.request
        with socket.socket() as s:  # a port free now
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        m = mounted.Mount("prom")
        self.addCleanup(m.close)
        m.mount(["--seal-after", "0", "--prometheus", str(port)])
        os.mkdir(m.path("v"))
        torch.save(state(2), m.path("v", "model.pt"))
        size = os.path.getsize(m.path("v", "model.pt"))
        torch.load(m.path("v", "model.pt"))
        with open(m.path("v", "notes.txt"), "wb") as f:
            f.write(b"first")
        daemon_write(m.mnt, m.path("v", "notes.txt"))
        url = "http://127.0.0.1:%d/metrics" % port
        with urllib.request.urlopen(url, timeout=30) as r:
            self.assertEqual(r.status, 200)
            self.assertIn("text/plain", r.headers["Content-Type"])
            text = r.read().decode()
        values = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                values[name] = float(value)
        self.assertGreaterEqual(values["ckptfs_bytes_written_total"], size)
        self.assertGreaterEqual(values["ckptfs_bytes_read_total"], size)
        self.assertGreater(values['ckptfs_latency_seconds_count{op="write"}'], 0)
        self.assertGreater(values['ckptfs_latency_seconds{op="write",quantile="0.99"}'], 0)
        self.assertIn('ckptfs_cpu_seconds_total{role="worker"}', values)
        self.assertEqual(values["ckptfs_contents"], json_of(self, "stats", m.mnt)["contents"])
        self.assertEqual(values["ckptfs_pending_bytes"], 0)
        self.assertEqual(values["ckptfs_journaled_bytes"], 0)
        with self.assertRaises(urllib.error.HTTPError) as e:
            urllib.request.urlopen("http://127.0.0.1:%d/other" % port, timeout=30)
        self.assertEqual(e.exception.code, 404)
        # Off by default: the other mount's daemon serves no endpoint.
        with open(os.path.join(self.m.store, "ckptfs.log")) as f:
            self.assertNotIn("Prometheus endpoint", f.read())
        # A second mount asking for the same port fails and says why; nothing is left mounted.
        other = mounted.Mount("prom2")
        self.addCleanup(other.close)
        p = run("mount", other.store, other.mnt, "--create", "--prometheus", port)
        self.assertEqual(p.returncode, 1)
        self.assertIn("127.0.0.1:%d" % port, p.stderr)
        self.assertFalse(mounted.is_mounted(other.mnt))
        m.umount()  # the endpoint goes with the daemon
        with self.assertRaises(urllib.error.URLError):
            urllib.request.urlopen(url, timeout=30)

    def test_status_shows_bytes_pending_durability(self):
        def mine():
            return status_of(self, self.m.mnt)["daemon"]

        os.mkdir(self.m.path("v"))
        self.assertEqual(mine()["pending_bytes"], 0)
        opens_before = mounted.passthrough_opens(self.m.mnt)
        f = open(self.m.path("v", "big.bin"), "wb")
        try:
            f.write(os.urandom(3 * MiB))
            f.flush()
            # Written, not closed: accepted by the daemon, not durable.
            d = mine()
            self.assertEqual(d["pending_bytes"], 3 * MiB)
            self.assertGreaterEqual(d["queued_commits"], 0)
            words = run("status").stdout
            self.assertIn("pending durability 3.00 MiB", words)
            os.fsync(f.fileno())
            self.assertEqual(mine()["pending_bytes"], 0)
            if mounted.passthrough_opens(self.m.mnt) > opens_before:
                # The fsync journal answered that fsync: durable, not in the store yet.
                self.assertEqual(mine()["journaled_bytes"], 3 * MiB)
                self.assertIn("journaled 3.00 MiB", run("status").stdout)
            f.write(os.urandom(MiB))
            f.flush()
            self.assertEqual(mine()["pending_bytes"], MiB)
        finally:
            f.close()
        self.assertEqual(run("sync", self.m.mnt).returncode, 0)
        d = mine()
        self.assertEqual(d["pending_bytes"], 0)
        self.assertEqual(d["queued_commits"], 0)
        self.assertEqual(d["journaled_bytes"], 0)


if __name__ == "__main__":
    mounted.main()
