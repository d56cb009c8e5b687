#!/usr/bin/python3
"""Must-show 5: sealed versions are read-only (EROFS) but deletable, by `ckptfs seal` and by
the automatic policy (--seal-after: a version seals once a newer one exists and none of its
files has been open for that long)."""
import errno
import os
import random
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mounted  # noqa: E402

MiB = mounted.MiB
data, write_file, read_file = mounted.data, mounted.write_file, mounted.read_file


class SealTest(mounted.MountedTestCase):
    mount_options = ["--seal-after", "0"]  # only `ckptfs seal`

    def assertReadOnly(self, v):
        """Every kind of change inside version `v` fails with EROFS."""
        f = os.path.join(v, "weights.bin")
        self.assertErrno(errno.EROFS, open, f, "r+b")
        self.assertErrno(errno.EROFS, open, f, "wb")
        self.assertErrno(errno.EROFS, open, f, "ab")
        self.assertErrno(errno.EROFS, open, os.path.join(v, "new.bin"), "wb")
        self.assertErrno(errno.EROFS, os.open, os.path.join(v, "new2"),
                         os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        self.assertErrno(errno.EROFS, os.truncate, f, 10)
        self.assertErrno(errno.EROFS, os.mkdir, os.path.join(v, "newdir"))
        self.assertErrno(errno.EROFS, os.symlink, "weights.bin", os.path.join(v, "link"))
        self.assertErrno(errno.EROFS, os.rename, f, os.path.join(v, "renamed.bin"))
        self.assertErrno(errno.EROFS, os.chmod, f, 0o600)
        self.assertErrno(errno.EROFS, os.utime, f, ns=(1, 1))
        self.assertErrno(errno.EROFS, os.setxattr, f, "user.x", b"1")
        outside = self.m.path("outside.txt")
        write_file(outside, b"moving in is a change too")
        self.assertErrno(errno.EROFS, os.rename, outside, os.path.join(v, "outside.txt"))
        os.unlink(outside)
        self.assertEqual(os.getxattr(v, "user.ckptfs.sealed"), b"1")
        self.assertEqual(os.getxattr(f, "user.ckptfs.sealed"), b"1")

    def test_seal_then_rm_rf_then_gc(self):
        v1 = self.version_dir("global_step100")
        weights, optim = data(24 * MiB, 1), data(6 * MiB, 2)
        write_file(os.path.join(v1, "weights.bin"), weights)
        os.mkdir(os.path.join(v1, "sub"))
        write_file(os.path.join(v1, "sub", "optim.bin"), optim)
        v2 = self.version_dir("global_step200")
        small = data(2 * MiB, 3)
        write_file(os.path.join(v2, "weights.bin"), small)
        self.assertEqual(os.getxattr(v1, "user.ckptfs.sealed"), b"0")

        mounted.ckptfs("seal", v1)
        self.assertReadOnly(v1)
        self.assertEqual(read_file(os.path.join(v1, "weights.bin")), weights)
        self.assertEqual(os.getxattr(v2, "user.ckptfs.sealed"), b"0")  # only v1 was sealed
        write_file(os.path.join(v2, "more.bin"), b"still writable")
        # Only a version can be sealed, not a directory inside one.
        os.mkdir(os.path.join(v2, "sub"))
        self.assertErrno(errno.EINVAL, os.setxattr, os.path.join(v2, "sub"), "user.ckptfs.seal",
                         b"1")
        r = mounted.ckptfs("seal", os.path.join(v2, "sub"), check=False)
        self.assertEqual(r.returncode, 1, r.stderr)

        # Sealing survives a remount.
        self.m.umount()
        stats_full = self.m.stats()
        self.m.mount()
        self.assertReadOnly(v1)
        self.assertEqual(read_file(os.path.join(v1, "sub", "optim.bin")), optim)

        shutil.rmtree(v1)  # rm -rf of a sealed version works
        self.assertFalse(os.path.exists(v1))
        self.assertEqual(sorted(os.listdir(self.mnt)), ["global_step200"])
        self.m.umount()
        stats_rm = self.m.stats()
        gc = mounted.ckptfs("gc", self.store)
        stats_gc = self.m.stats()
        print("before rm %s\nafter rm  %s\nafter gc  %s\n%s"
              % (stats_full, stats_rm, stats_gc, gc.stdout.strip()), file=sys.stderr)
        self.assertLess(stats_rm["logical bytes"], stats_full["logical bytes"])
        self.assertLess(stats_rm["contents"], stats_full["contents"])
        self.assertLess(stats_gc["pack bytes"], stats_rm["pack bytes"])
        self.assertLess(stats_gc["pack bytes"], 8 * MiB)  # v2's bytes and little else
        self.m.mount()
        self.assertEqual(read_file(os.path.join(v2, "weights.bin")), small)

    def test_seal_commits_a_file_being_written(self):
        v = self.version_dir()
        path = os.path.join(v, "weights.bin")
        first = data(3 * MiB, 4)
        with open(path, "wb", buffering=0) as f:
            f.write(first)
            if mounted.passthrough_opens(self.mnt) > 0:
                # The kernel writes this file itself (FUSE passthrough), and its writes cannot
                # be refused: the seal fails with EBUSY until the writer closes.
                p = mounted.ckptfs("seal", v, check=False)
                self.assertNotEqual(p.returncode, 0)
                self.assertIn("passthrough", p.stderr)
                f.close()
                mounted.ckptfs("seal", v)
            else:
                mounted.ckptfs("seal", v)
                self.assertErrno(errno.EROFS, f.write, b"too late")
        self.assertEqual(read_file(path), first)
        self.remount()
        self.assertEqual(read_file(path), first)
        self.assertEqual(os.getxattr(v, "user.ckptfs.sealed"), b"1")

    def test_files_outside_versions_are_never_sealed(self):
        latest = self.m.path("latest")
        write_file(latest, b"global_step1")
        self.assertErrno(errno.ENODATA, os.getxattr, latest, "user.ckptfs.sealed")
        self.assertErrno(errno.EINVAL, os.setxattr, latest, "user.ckptfs.seal", b"1")
        write_file(latest, b"global_step2")
        self.assertEqual(read_file(latest), b"global_step2")


class AutoSealTest(mounted.MountedTestCase):
    mount_options = ["--seal-after", "1"]

    def sealed(self, v):
        return os.getxattr(v, "user.ckptfs.sealed") == b"1"

    def test_older_version_seals_after_idle(self):
        a = self.version_dir("A")
        payload = data(MiB, 5)
        write_file(os.path.join(a, "weights.bin"), payload)
        b = self.version_dir("B")
        t0 = time.monotonic()
        self.assertTrue(mounted.wait_until(lambda: self.sealed(a), 10), "A was never sealed")
        waited = time.monotonic() - t0
        print("A sealed %.2fs after B appeared" % waited, file=sys.stderr)
        self.assertLess(waited, 6)  # 1 s, plus the sealer's tick, plus a loaded machine
        self.assertErrno(errno.EROFS, open, os.path.join(a, "weights.bin"), "r+b")
        self.assertErrno(errno.EROFS, open, os.path.join(a, "new.bin"), "wb")
        self.assertEqual(read_file(os.path.join(a, "weights.bin")), payload)
        # B is the newest version: it stays writable.
        time.sleep(1.5)
        self.assertFalse(self.sealed(b))
        write_file(os.path.join(b, "weights.bin"), payload)
        self.assertEqual(read_file(os.path.join(b, "weights.bin")), payload)
        shutil.rmtree(a)
        self.assertEqual(os.listdir(self.mnt), ["B"])

    def test_open_file_holds_off_the_seal(self):
        a = self.version_dir("A")
        with open(os.path.join(a, "rank0.bin"), "wb") as f:
            f.write(data(MiB, 6))
            self.version_dir("B")
            time.sleep(2.5)  # well past --seal-after, but a file of A is open
            self.assertFalse(self.sealed(a))
            f.write(b"tail")
        self.assertTrue(mounted.wait_until(lambda: self.sealed(a), 10), "A was never sealed")
        self.assertEqual(read_file(os.path.join(a, "rank0.bin")), data(MiB, 6) + b"tail")


if __name__ == "__main__":
    mounted.main()
