#!/usr/bin/python3
"""The daemon is SIGKILLed while it re-encodes the last version into reverse deltas.

After each version of a real training trajectory (scripts/gen_trajectory.py --size ci, fp32
model + Adam, DeepSpeed layout) is copied in and acknowledged (`ckptfs sync`), the background
re-encoder (engine/store/reencode.cc) stores its pieces whole and re-encodes the previous
version's as deltas against them. The daemon runs with CKPTFS_TEST_REENCODE_PAUSE_MS (fs/mount.cc):
the re-encoder pauses between syncing its new records and the catalog transaction that points
the rows at them, and the daemon is killed inside that pause (its log shows it got there), in
several rounds. After each crash and a fresh mount: every acknowledged version reads back
bitwise, `ckptfs verify` is clean, and saving continues; a last version after a clean
unmount leaves a store that still holds deltas and verifies clean.
"""
import filecmp
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mounted  # noqa: E402

SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROUNDS = 6


class ReencodeCrashTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.root = tempfile.mkdtemp(prefix="reencode-crash-", dir=mounted.root_dir())
        cls.addClassCleanup(shutil.rmtree, cls.root, True)
        out = os.path.join(cls.root, "data")
        subprocess.run(["/usr/bin/python3", os.path.join(SOURCE, "scripts", "gen_trajectory.py"),
                        "--out", out, "--size", "ci", "--trajectories", "fp32"], check=True,
                       stdout=subprocess.DEVNULL, timeout=600)
        cls.src = os.path.join(out, "fp32")
        cls.steps = sorted((d for d in os.listdir(cls.src) if d.startswith("global_step")),
                           key=lambda d: int(d[len("global_step"):]))

    def test_sigkill_during_reencoding(self):
        os.environ["CKPTFS_TEST_REENCODE_PAUSE_MS"] = "400"
        self.addCleanup(os.environ.pop, "CKPTFS_TEST_REENCODE_PAUSE_MS", None)
        m = mounted.Mount("reencode-crash", ["--seal-after", "0"])
        self.addCleanup(m.close)
        m.mount()
        log = os.path.join(m.store, "ckptfs.log")

        def count(what):
            with open(log, errors="replace") as f:
                return f.read().count(what)

        def pauses():
            return count("CKPTFS_TEST_REENCODE_PAUSE_MS: re-encoded records synced")
        acknowledged = []
        for r in range(ROUNDS):
            step = self.steps[r % len(self.steps)]
            name = step if r < len(self.steps) else "%s-again%d" % (step, r)
            shutil.copytree(os.path.join(self.src, step), m.path(name))
            mounted.ckptfs("sync", m.mnt)
            acknowledged.append((step, name))
            if r > 0:  # from the second version on there are pieces to re-encode
                before = pauses()
                self.assertTrue(mounted.wait_until(lambda: pauses() > before, 30),
                                "round %d: the re-encoder never reached its pause" % r)
            cuts = count("cutting the uncommitted tail")
            m.kill_daemon()  # inside the pause: new records synced, catalog not yet changed
            m.mount()
            if r > 0:  # the re-encoder's records were past the committed end: cut at the open
                self.assertGreater(count("cutting the uncommitted tail"), cuts, "round %d" % r)
            for src_step, dst in acknowledged:
                a, b = os.path.join(self.src, src_step), m.path(dst)
                for f in sorted(os.listdir(a)):
                    self.assertTrue(filecmp.cmp(os.path.join(a, f), os.path.join(b, f),
                                                shallow=False), "round %d: %s/%s" % (r, dst, f))
            verify = mounted.ckptfs("verify", m.mnt, check=False)
            self.assertEqual(verify.returncode, 0, "round %d: %s%s" % (r, verify.stdout,
                                                                        verify.stderr))
        # One more version with a clean unmount: the re-encoder finishes, the newest is whole.
        last = self.steps[-1]
        shutil.copytree(os.path.join(self.src, last), m.path("final"))
        m.umount()
        m.mount()
        log = mounted.ckptfs("log", m.mnt, "--json").stdout
        self.assertIn("final", log)
        for src_step, dst in acknowledged + [(last, "final")]:
            a, b = os.path.join(self.src, src_step), m.path(dst)
            for f in sorted(os.listdir(a)):
                self.assertTrue(filecmp.cmp(os.path.join(a, f), os.path.join(b, f),
                                            shallow=False), dst + "/" + f)
        st = m.stats()
        self.assertGreater(st.get("delta chunks", 0), 0)
        verify = mounted.ckptfs("verify", m.mnt, check=False)
        self.assertEqual(verify.returncode, 0, verify.stdout + verify.stderr)


if __name__ == "__main__":
    unittest.main()
