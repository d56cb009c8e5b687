"""Rotation as versions seal (docs/cli.md "forget", `ckptfs mount --keep-last N
[--keep-every K]`): real torch saves into a real mount, `ckptfs seal`, and the daemon forgets
what `ckptfs forget` would, then gcs; ls, torch.load, log, verify and the daemon's log agree."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cli_common import json_of, mounted, run  # noqa: E402

try:
    import torch  # noqa: E402
except ImportError:
    mounted.skip_all("needs python3-torch (run with Debian's /usr/bin/python3)")


def model_state(step):
    g = torch.Generator().manual_seed(step)  # every version new bytes: forgetting frees them
    return {"w": torch.randn(512, 512, generator=g), "step": torch.tensor(step)}


class Retention(unittest.TestCase):
    def start(self, options):
        self.m = mounted.Mount("retain")
        self.addCleanup(self.m.close)
        self.assertEqual(run("init", self.m.store).returncode, 0)
        self.m.mount(["--seal-after", "0"] + options)

    def save_and_seal(self, step):
        d = self.m.path("global_step%d" % step)
        os.mkdir(d)
        torch.save(model_state(step), os.path.join(d, "model.pt"))
        p = run("seal", d)
        self.assertEqual(p.returncode, 0, p.stderr)

    def names(self):
        return [v["name"] for v in json_of(self, "log", self.m.mnt)["versions"]]

    def wait_for(self, expected):
        ok = mounted.wait_until(lambda: self.names() == expected, 60)
        self.assertTrue(ok, "versions %s, expected %s" % (self.names(), expected))

    def test_keep_last_rotates_as_versions_seal(self):
        # A slow re-encoder (fs/mount.cc's test switch holds each re-encoding 1 s before its
        # commit): the retention thread's gc runs once the re-encoder caught up. The
        # re-encoder's commit drops the reference a forgotten version's piece holds as the base
        # of the next version's delta; a gc running beside it could leave that piece for a gc
        # that never comes (pack bytes stuck at 3.5 MB in ~3 of 12 parallel ctest runs).
        os.environ["CKPTFS_TEST_REENCODE_PAUSE_MS"] = "1000"
        self.addCleanup(os.environ.pop, "CKPTFS_TEST_REENCODE_PAUSE_MS", None)
        self.start(["--keep-last", "2"])
        self.save_and_seal(1)
        self.save_and_seal(2)
        self.assertEqual(self.names(), ["global_step1", "global_step2"])
        pack_bytes_two = json_of(self, "stats", self.m.mnt)["pack_bytes"]
        os.mkdir(self.m.path("open"))  # never sealed: never forgotten, not counted as kept
        for step in (3, 4, 5):
            self.save_and_seal(step)
        self.wait_for(["open", "global_step4", "global_step5"])  # in creation order
        # The kernel forgot the names at once (no stale dentry).
        self.assertEqual(sorted(os.listdir(self.m.mnt)), ["global_step4", "global_step5", "open"])
        self.assertFalse(os.path.exists(self.m.path("global_step3")))
        for step in (4, 5):
            loaded = torch.load(self.m.path("global_step%d" % step, "model.pt"))
            mounted.assert_same_objects(self, model_state(step), loaded)
        # gc ran: the forgotten versions' bytes left the packs (three versions' worth went,
        # two stayed; the store holds about what it held with two versions). The retention
        # thread runs gc after it removed the versions: the names go first.
        pack_bytes = lambda: json_of(self, "stats", self.m.mnt)["pack_bytes"]  # noqa: E731
        mounted.wait_until(lambda: pack_bytes() < 1.5 * pack_bytes_two, 30)
        self.assertLess(pack_bytes(), 1.5 * pack_bytes_two)
        self.assertTrue(json_of(self, "verify", self.m.mnt)["ok"])
        # The same rules as `ckptfs forget`: nothing left for it to do.
        dry = json_of(self, "forget", self.m.mnt, "--keep-last", "2", "--dry-run")
        self.assertEqual(dry["forgotten"], [])
        p = run("sync", self.m.mnt)  # waits for the re-encoder: its lines are in the log
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(os.path.join(self.m.store, "ckptfs.log")) as f:
            log = f.read()
        for step in (1, 2, 3):
            self.assertIn("retention: forgot version global_step%d" % step, log)
        self.assertIn("retention: gc after forgetting", log)
        self.assertIn("CKPTFS_TEST_REENCODE_PAUSE_MS", log)
        self.assertLess(log.rindex("CKPTFS_TEST_REENCODE_PAUSE_MS"),
                        log.rindex("retention: gc after forgetting"),
                        "the retention thread's last gc ran before the re-encoder was done")

    def test_keep_every_survives_rotation_and_remount(self):
        self.start(["-o", "keep_last=1,keep_every=2"])
        for step in (1, 2, 3, 4, 5):
            self.save_and_seal(step)
        # Sequence numbers 1, 3, 5 are every 2nd; 5 is also the last.
        self.wait_for(["global_step1", "global_step3", "global_step5"])
        self.m.umount()
        # Rotation runs at mount too: a stricter rule applies to what is there.
        self.m.mount(["--seal-after", "0", "--keep-last", "1"])
        self.wait_for(["global_step5"])
        self.assertEqual(os.listdir(self.m.mnt), ["global_step5"])

    def test_bad_rotation_options_are_refused(self):
        m = mounted.Mount("retain-bad")
        self.addCleanup(m.close)
        self.assertEqual(run("init", m.store).returncode, 0)
        p = run("mount", m.store, m.mnt, "--keep-every", "2")
        self.assertEqual(p.returncode, 1)
        self.assertIn("--keep-every needs --keep-last", p.stderr)
        p = run("mount", m.store, m.mnt, "-o", "keep_last=0")
        self.assertEqual(p.returncode, 1)
        self.assertIn("keep_last", p.stderr)
        self.assertFalse(mounted.is_mounted(m.mnt))


if __name__ == "__main__":
    mounted.main()
