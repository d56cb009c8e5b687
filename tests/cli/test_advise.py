"""`ckptfs advise --mtbf DURATION [STORE|MNT]` (docs/cli.md "advise"): the checkpoint interval
(Young, Daly) from the save cost measured on real torch saves into a real mount (each from its
version's mkdir to its last commit, checked against the test's own clock), asked through the
daemon and, unmounted, of the store itself; --save-seconds; the refusal when nothing is
measured (no version, the newest still open, one copied in with `cp -a`); durations."""
import math
import os
import shutil
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cli_common import json_of, mounted, run  # noqa: E402

try:
    import torch  # noqa: E402
except ImportError:
    mounted.skip_all("needs python3-torch (run with Debian's /usr/bin/python3)")

SIX_HOURS = 6 * 3600


def tensors(step, n):
    g = torch.Generator().manual_seed(step * 10 + n)
    return {"t%d" % i: torch.randn(512, 512, generator=g) for i in range(n)}  # 1 MiB each


class Advise(unittest.TestCase):
    def setUp(self):
        self.m = mounted.Mount("advise")
        self.addCleanup(self.m.close)
        self.assertEqual(run("init", self.m.store).returncode, 0)
        self.m.mount(["--seal-after", "0"])

    def save(self, step, files, seal=True):
        """A version of `files` (name -> tensors) saved one after another; its name and the
        wall-clock ns (time.time_ns) before its mkdir, after it, before the last file's save,
        and once `ckptfs sync` says all of it is committed."""
        name = "global_step%d" % step
        d = self.m.path(name)
        before_mkdir = time.time_ns()
        os.mkdir(d)
        after_mkdir = time.time_ns()
        before_last = None
        for file_name, state in files:
            before_last = time.time_ns()
            torch.save(state, os.path.join(d, file_name))
        self.assertEqual(run("sync", d).returncode, 0)
        synced = time.time_ns()
        if seal:
            self.assertEqual(run("seal", d).returncode, 0)
        return name, (before_mkdir, after_mkdir, before_last, synced)

    def test_measured_online_and_offline(self):
        times, sizes = {}, {}
        for step in (100, 200, 300):
            name, times[name] = self.save(step, [("model.pt", tensors(step, 1)),
                                                 ("optimizer.pt", tensors(step, 2))])
            sizes[name] = sum(os.path.getsize(self.m.path(name, f))
                              for f in ("model.pt", "optimizer.pt"))
        name, times[name] = self.save(400, [("model.pt", tensors(400, 1))])  # one file
        sizes[name] = os.path.getsize(self.m.path(name, "model.pt"))
        online = json_of(self, "advise", "--mtbf", "6h", self.m.mnt)
        self.assertEqual(online["mount"], os.path.realpath(self.m.mnt))
        self.assertEqual(online["save_source"], "measured")
        self.assertEqual(online["mtbf_seconds"], SIX_HOURS)
        used = online["measured"]
        self.assertEqual([v["name"] for v in used], ["global_step400", "global_step300",
                                                     "global_step200", "global_step100"])
        for v in used:
            before_mkdir, after_mkdir, before_last, synced = times[v["name"]]
            # A save runs from the version's mkdir to its last file's commit.
            self.assertGreaterEqual(v["started_unix_ns"], before_mkdir)
            self.assertLessEqual(v["started_unix_ns"], after_mkdir)
            self.assertGreater(v["finished_unix_ns"], before_last)
            self.assertLessEqual(v["finished_unix_ns"], synced)
            self.assertAlmostEqual(v["save_seconds"],
                                   (v["finished_unix_ns"] - v["started_unix_ns"]) / 1e9, places=6)
            self.assertEqual(v["logical_bytes"], sizes[v["name"]])
            self.assertAlmostEqual(v["bytes_per_second"], v["logical_bytes"] / v["save_seconds"],
                                   delta=1e-6 * v["bytes_per_second"])
        costs = sorted(v["save_seconds"] for v in used)
        c = (costs[1] + costs[2]) / 2  # the median of four
        self.assertAlmostEqual(online["save_seconds"], c, places=9)
        self.assertAlmostEqual(online["young_seconds"], math.sqrt(2 * c * SIX_HOURS), places=6)
        self.assertLess(online["daly_seconds"], online["young_seconds"])
        words = run("advise", "--mtbf", "6h", self.m.mnt)
        self.assertEqual(words.returncode, 0, words.stderr)
        for text in ("checkpoint every", "Young", "Daly", "global_step300", "6h (given by --mtbf)",
                     "asked through its daemon"):
            self.assertIn(text, words.stdout)
        self.m.umount()
        offline = json_of(self, "advise", "--mtbf", "360m", self.m.store)
        self.assertIsNone(offline["mount"])
        self.assertEqual(offline["measured"], used)  # the same catalog, the same figures
        self.assertEqual(offline["save_seconds"], online["save_seconds"])
        self.assertIn("read from its catalog", run("advise", "--mtbf", "6h", self.m.store).stdout)

    def test_nothing_measured_is_refused_until_given(self):
        def refused():
            p = run("advise", "--mtbf", "6h", self.m.mnt)
            self.assertEqual(p.returncode, 1)
            self.assertIn("nothing measured yet", p.stderr)
            self.assertIn("--save-seconds", p.stderr)
            self.assertEqual(p.stdout, "")

        refused()  # no version at all
        self.save(1, [("model.pt", tensors(1, 1))], seal=False)
        refused()  # the newest, not sealed: it may still be being written
        # A checkpoint copied in with its times kept (cp -a) is no save of this store's.
        old = os.path.join(mounted.root_dir(), "advise-old")
        os.makedirs(old)
        self.addCleanup(shutil.rmtree, old, True)
        torch.save(tensors(2, 1), os.path.join(old, "model.pt"))
        for path in (os.path.join(old, "model.pt"), old):
            os.utime(path, (1577836800, 1577836800))  # 2020-01-01
        subprocess.run(["cp", "-a", old, self.m.path("global_step2")], check=True)
        self.assertEqual(run("seal", self.m.path("global_step2")).returncode, 0)
        self.assertEqual(run("seal", self.m.path("global_step1")).returncode, 0)
        doc = json_of(self, "advise", "--mtbf", "6h", self.m.mnt)  # global_step1 measures
        self.assertEqual([v["name"] for v in doc["measured"]], ["global_step1"])
        given = json_of(self, "advise", "--mtbf", "2d", "--save-seconds", "30", self.m.mnt)
        self.assertEqual(given["save_source"], "given")
        self.assertEqual(given["measured"], [])
        self.assertEqual(given["save_seconds"], 30)
        self.assertAlmostEqual(given["young_seconds"], math.sqrt(2 * 30 * 2 * 86400), places=6)
        # No store needed when the cost is given.
        alone = json_of(self, "advise", "--mtbf", "1h30m", "--save-seconds", "5")
        self.assertIsNone(alone["store"])
        self.assertAlmostEqual(alone["young_seconds"], math.sqrt(2 * 5 * 5400), places=6)

    def test_durations(self):
        for text, seconds in (("90m", 5400), ("2d", 172800), ("1.5h", 5400), ("45s", 45)):
            doc = json_of(self, "advise", "--mtbf", text, "--save-seconds", "1")
            self.assertEqual(doc["mtbf_seconds"], seconds, text)
        for bad in ("6x", "h", "1h30", "0"):
            p = run("advise", "--mtbf", bad, "--save-seconds", "1")
            self.assertEqual(p.returncode, 2, bad)
            self.assertIn("is not a duration", p.stderr)
        p = run("advise", "--mtbf", "6h")
        self.assertEqual(p.returncode, 2)
        self.assertIn("--save-seconds", p.stderr)


if __name__ == "__main__":
    mounted.main()
