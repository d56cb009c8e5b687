"""`ckptfs advise --mtbf DURATION [STORE|MNT]` (docs/cli.md "advise"): the checkpoint interval
(Young, Daly) from the save cost measured on real torch saves into a real mount, asked through
the daemon and, unmounted, of the store itself; --save-seconds; the refusal when nothing is
measured; durations."""
import math
import os
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

    def save(self, step, files):
        """A version of `files` (name -> tensors) saved one after another; the seconds from
        the first save's start until `ckptfs sync` says all of it is committed."""
        d = self.m.path("global_step%d" % step)
        os.mkdir(d)
        start = time.monotonic()
        for name, state in files:
            torch.save(state, os.path.join(d, name))
        self.assertEqual(run("sync", d).returncode, 0)
        wall = time.monotonic() - start
        self.assertEqual(run("seal", d).returncode, 0)
        return d, wall

    def test_measured_online_and_offline(self):
        walls = {}
        for step in (100, 200, 300):
            d, wall = self.save(step, [("model.pt", tensors(step, 1)),
                                       ("optimizer.pt", tensors(step, 2))])
            walls[os.path.basename(d)] = (wall, os.path.getsize(os.path.join(d, "model.pt")),
                                          os.path.getsize(os.path.join(d, "optimizer.pt")))
        online = json_of(self, "advise", "--mtbf", "6h", self.m.mnt)
        self.assertEqual(online["mount"], os.path.realpath(self.m.mnt))
        self.assertEqual(online["save_source"], "measured")
        self.assertEqual(online["mtbf_seconds"], SIX_HOURS)
        used = online["measured"]
        self.assertEqual([v["name"] for v in used],
                         ["global_step300", "global_step200", "global_step100"])  # newest first
        for v in used:
            wall, model, optimizer = walls[v["name"]]
            # The span from model.pt's commit to optimizer.pt's measures optimizer.pt's bytes,
            # and lies within the save the test timed.
            self.assertEqual(v["measured_bytes"], optimizer)
            self.assertEqual(v["logical_bytes"], model + optimizer)
            self.assertGreater(v["measured_seconds"], 0)
            self.assertLessEqual(v["measured_seconds"], wall)
            self.assertAlmostEqual(v["bytes_per_second"], optimizer / v["measured_seconds"],
                                   delta=1e-6 * v["bytes_per_second"])
            self.assertAlmostEqual(v["save_seconds"],
                                   (model + optimizer) / v["bytes_per_second"], places=6)
        c = sorted(v["save_seconds"] for v in used)[1]  # the median of three
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
        # One file a version: no span between commits measures a save.
        for step in (1, 2):
            self.save(step, [("model.pt", tensors(step, 2))])
        p = run("advise", "--mtbf", "6h", self.m.mnt)
        self.assertEqual(p.returncode, 1)
        self.assertIn("nothing measured yet", p.stderr)
        self.assertIn("--save-seconds", p.stderr)
        self.assertEqual(p.stdout, "")
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
