#!/usr/bin/python3
"""The daemon is SIGKILLed while it re-encodes the last version into reverse deltas.

After each version of a real training trajectory (scripts/gen_trajectory.py --size ci, fp32
model + Adam, DeepSpeed layout) is copied in and acknowledged (fsync of each file), the background
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
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mounted  # noqa: E402

ROUNDS = 6


class ReencodeCrashTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.src, cls.steps = mounted.ci_trajectory(cls, "reencode-crash-")

    def test_sigkill_during_reencoding(self):
        os.environ["CKPTFS_TEST_REENCODE_PAUSE_MS"] = "400"
        self.addCleanup(os.environ.pop, "CKPTFS_TEST_REENCODE_PAUSE_MS", None)
        m = mounted.Mount("reencode-crash", ["--seal-after", "0"])
        self.addCleanup(m.close)
        m.mount()
        log = os.path.join(m.store, "ckptfs.log")

        def pauses():
            with open(log, errors="replace") as f:
                return f.read().count("CKPTFS_TEST_REENCODE_PAUSE_MS: re-encoded records synced")
        acknowledged = []
        for r in range(ROUNDS):
            step = self.steps[r % len(self.steps)]
            name = step if r < len(self.steps) else "%s-again%d" % (step, r)
            before = pauses()
            os.mkdir(m.path(name))
            for f in sorted(os.listdir(os.path.join(self.src, step))):
                with open(os.path.join(self.src, step, f), "rb") as src, \
                        open(m.path(name, f), "wb") as dst:
                    shutil.copyfileobj(src, dst)
                    dst.flush()
                    os.fsync(dst.fileno())  # acknowledged (`ckptfs sync` would also wait for
                                            # the re-encoder, which is what is killed here)
            acknowledged.append((step, name))
            if r > 0:  # from the second version on there are pieces to re-encode
                self.assertTrue(mounted.wait_until(lambda: pauses() > before, 30),
                                "round %d: the re-encoder never reached its pause" % r)
            m.kill_daemon()  # inside the pause: new records synced, catalog not yet changed
            m.mount()
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
