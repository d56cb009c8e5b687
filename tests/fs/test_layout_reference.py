#!/usr/bin/python3
"""Deltas for checkpoints that change their names: the delta reference found by tensor layout.

Lightning's ModelCheckpoint writes every checkpoint as a new file (`epoch=0-step=N.ckpt`) into
one directory, and plain loops write `ckpt_{step}.pt`: no file has a same-named predecessor in
a previous version. The real training trajectory of scripts/gen_trajectory.py (--size ci,
fp32: model + Adam, DeepSpeed layout) is saved three ways, each into a fresh store:

  deepspeed   global_stepN/FILE, one version per checkpoint (deltas by path, as before)
  lightning   lightning_logs/version_0/checkpoints/epoch=0-step=N-FILE: one directory
  renamed     the same names, into a store mounted with --delta-chain 1 (no deltas at all)
(the first two with --forward-deltas, and again with the default reverse deltas)

Then: the lightning layout stores about as few bytes as the deepspeed one (its files found
their predecessors by layout), clearly fewer than without deltas; every file reads back
bitwise, also after a remount; `ckptfs verify` is clean.
"""
import filecmp
import os
import shutil
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mounted  # noqa: E402

LIGHTNING_DIR = os.path.join("lightning_logs", "version_0", "checkpoints")


def checkpoint_files(version_dir):
    return sorted(f for f in os.listdir(version_dir) if f.endswith(".pt"))


class LayoutReferenceTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.src, cls.steps = mounted.ci_trajectory(cls, "layoutref-")

    def save(self, name, layout, options):
        """Saves every checkpoint in order through a fresh mount; returns (mount, saved paths)."""
        m = mounted.Mount(name, ["--seal-after", "0"] + options)
        self.addCleanup(m.close)
        m.mount()
        saved = []  # (source file, path in the mount, relative to it)
        for step in self.steps:
            for f in checkpoint_files(os.path.join(self.src, step)):
                if layout == "deepspeed":
                    rel = os.path.join(step, f)
                else:
                    rel = os.path.join(LIGHTNING_DIR, "epoch=0-step=%s-%s" % (
                        step[len("global_step"):], f))
                os.makedirs(os.path.dirname(m.path(rel)), exist_ok=True)
                shutil.copyfile(os.path.join(self.src, step, f), m.path(rel))
                # Committed before the next checkpoint starts, as between a trainer's saves:
                # a file whose predecessor is still committing (back-to-back copies on a
                # loaded machine) finds no reference by layout and is stored without deltas
                # (docs/fs.md, "Delta references"); a version directory waits for that anyway,
                # since creating the next one seals it.
                fd = os.open(m.path(rel), os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
                saved.append((os.path.join(self.src, step, f), rel))
        return m, saved

    def check_bitwise(self, m, saved):
        for src, rel in saved:
            self.assertTrue(filecmp.cmp(src, m.path(rel), shallow=False), rel)

    def test_renamed_checkpoints_get_deltas_like_versions(self):
        raw = sum(os.path.getsize(src) for step in self.steps
                  for src in [os.path.join(self.src, step, f)
                              for f in checkpoint_files(os.path.join(self.src, step))])
        results = {}
        # Forward deltas (--forward-deltas) for the comparison with no deltas at all: the
        # reverse-delta re-encoder (the default, engine/store/reencode.cc) keeps the oldest
        # version whole next to the newest, which on this 4-version trajectory costs one more
        # whole version than forward deltas, whatever found the references. The default mode
        # is checked too: both layouts store the same bytes there as well.
        forward = ["--forward-deltas"]
        for name, layout, options in [("deepspeed", "deepspeed", forward),
                                      ("lightning", "lightning", forward),
                                      ("nodelta", "lightning", ["--delta-chain", "1"]),
                                      ("deepspeed-reverse", "deepspeed", []),
                                      ("lightning-reverse", "lightning", [])]:
            m, saved = self.save(name, layout, options)
            self.check_bitwise(m, saved)
            m.remount()
            self.check_bitwise(m, saved)
            m.umount()
            st = m.stats()
            results[name] = st
            print("%-9s pack bytes %d (%.3f of raw), delta chunks %d" % (
                name, st["pack bytes"], st["pack bytes"] / raw, st.get("delta chunks", 0)),
                file=sys.stderr)
            verify = mounted.ckptfs("verify", m.store, check=False)
            self.assertEqual(verify.returncode, 0, verify.stdout + verify.stderr)
        self.assertGreater(results["lightning"]["delta chunks"], 0)
        self.assertEqual(results["nodelta"].get("delta chunks", 0), 0)
        # Found by layout, the references are the ones the paths give: the same bytes stored,
        # up to the first checkpoint's files (which may delta against each other's layout).
        self.assertLessEqual(results["lightning"]["pack bytes"],
                             1.02 * results["deepspeed"]["pack bytes"])
        self.assertLess(results["lightning"]["pack bytes"],
                        0.97 * results["nodelta"]["pack bytes"])
        self.assertLessEqual(results["lightning-reverse"]["pack bytes"],
                             1.02 * results["deepspeed-reverse"]["pack bytes"])


if __name__ == "__main__":
    unittest.main()
