#!/usr/bin/python3
"""FUSE passthrough (fs/passthrough.h, docs/fs.md "FUSE passthrough"): files written from empty
go to a staging file the kernel writes itself; the daemon commits what is there at fsync, sync
and close. Checked through the mount with real files and torch: bytes after remount, fsync then
more writes, reads and stats while writing, a second open and an O_TRUNC open of a file being
written, truncate, mmap, `ckptfs sync` in the middle of a write, seal while open (EBUSY), and
kill -9 after an fsync (the fsync journal: the next daemon commits what the fsync acknowledged)
and during the commits that follow journaled fsyncs. The same must hold with passthrough off (CKPTFS_PASSTHROUGH=0); that run
also checks that no handle passed through."""
import errno
import gzip
import json
import mmap
import os
import platform
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mounted  # noqa: E402

MiB = mounted.MiB
data, write_file, read_file = mounted.data, mounted.write_file, mounted.read_file
OFF = os.environ.get("CKPTFS_PASSTHROUGH") == "0"


def kernel_offers_passthrough():
    major, minor = (int(x) for x in platform.release().split(".")[:2])
    if (major, minor) < (6, 9):
        return False
    try:
        with gzip.open("/proc/config.gz", "rt") as f:
            return "CONFIG_FUSE_PASSTHROUGH=y" in f.read()
    except OSError:
        return True  # no config to read: expect it, as Debian's and most kernels have it


class PassthroughTest(mounted.MountedTestCase):
    def live(self):
        with open(self.m.path(".ckptfs", "stats")) as f:
            return json.load(f).get("passthrough", {})

    def opens(self):
        return mounted.passthrough_opens(self.mnt)

    def backing_refused(self):
        return "registering a backing file" in self.log()

    def test_mode_is_what_the_kernel_and_switch_say(self):
        v = self.version_dir()
        write_file(os.path.join(v, "probe.bin"), b"x" * 4096)
        if OFF:
            self.assertFalse(self.live().get("enabled"))
        elif not kernel_offers_passthrough():
            self.skipTest("this kernel has no FUSE passthrough")
        elif not self.live().get("enabled") and self.backing_refused():
            # Registering a backing file needs CAP_SYS_ADMIN in the initial user namespace
            # (root in an unprivileged container lacks it): the daemon fell back, as it must.
            self.skipTest("the kernel refused backing files here (no CAP_SYS_ADMIN)")
        else:
            self.assertTrue(self.live().get("enabled"), "the kernel offers passthrough")
            self.assertGreater(self.opens(), 0)

    def test_bytes_fsync_more_close_remount(self):
        v = self.version_dir()
        path = os.path.join(v, "model.bin")
        before = self.opens()
        a, b = data(5 * MiB + 123, 1), data(3 * MiB, 2)
        with open(path, "wb") as f:
            f.write(a)
            self.assertEqual(os.fstat(f.fileno()).st_size, len(a))
            self.assertEqual(os.stat(path).st_size, len(a))  # GetAttr while open
            f.flush()
            os.fsync(f.fileno())
            f.write(b)  # after the fsync's commit: the release's commit takes it
        self.assertEqual(os.stat(path).st_size, len(a) + len(b))
        self.assertEqual(read_file(path), a + b)
        on = not OFF and self.live().get("enabled")  # false also after a refused backing file
        self.assertEqual(self.opens(), before + (1 if on else 0))
        self.remount()
        self.assertEqual(read_file(path), a + b)

    def test_reader_and_truncating_writer_join_an_open_file(self):
        v = self.version_dir()
        path = os.path.join(v, "x.bin")
        w = open(path, "wb")
        w.write(data(2 * MiB, 3))
        w.flush()
        with open(path, "rb") as r:  # a second open of a passed-through file passes through
            self.assertEqual(r.read(), data(2 * MiB, 3))
        w2 = open(path, "r+b")
        w2.truncate(1000)
        w.seek(1000)
        w.write(b"tail")
        w.close()
        w2.seek(0)
        self.assertEqual(w2.read(), data(2 * MiB, 3)[:1000] + b"tail")
        w2.close()
        w3 = open(path, "wb")  # O_TRUNC while nobody else has it open
        w3.write(b"new")
        w3.close()
        self.assertEqual(read_file(path), b"new")
        self.remount()
        self.assertEqual(read_file(path), b"new")

    def test_mmap_and_sync_in_the_middle(self):
        v = self.version_dir()
        path = os.path.join(v, "mapped.bin")
        with open(path, "w+b") as f:
            f.write(data(1 * MiB, 4))
            f.flush()
            mounted.ckptfs("sync", self.mnt)  # commits while the writer may write on
            f.seek(10)
            f.write(b"after sync")  # same size: found by the file's times, or re-read
            f.flush()
            with mmap.mmap(f.fileno(), 0) as mm:
                mm[100:105] = b"MMAP!"
                mm.flush()
        expect = bytearray(data(1 * MiB, 4))
        expect[10:20] = b"after sync"
        expect[100:105] = b"MMAP!"
        mounted.ckptfs("sync", self.mnt)
        self.remount()
        self.assertEqual(read_file(path), bytes(expect))

    def test_seal_waits_for_passthrough_writers(self):
        v = self.version_dir()
        path = os.path.join(v, "open.bin")
        f = open(path, "wb")
        f.write(b"partial")
        f.flush()
        p = mounted.ckptfs("seal", v, check=False)
        if OFF or not self.live().get("enabled"):
            self.assertEqual(p.returncode, 0, p.stderr)  # writes through FUSE get EROFS
            with self.assertRaises(OSError) as cm:
                f.write(b"more")
                f.flush()
            self.assertEqual(cm.exception.errno, errno.EROFS)
            try:
                f.close()
            except OSError:
                pass
            return
        self.assertNotEqual(p.returncode, 0, "seal of a version with a passthrough writer")
        self.assertIn("passthrough", p.stderr + p.stdout)
        f.write(b" and the rest")
        f.close()
        mounted.ckptfs("seal", v)
        self.assertEqual(read_file(path), b"partial and the rest")
        self.assertErrno(errno.EROFS, open, path, "wb")

    def test_torch_save_load_and_concurrent_files(self):
        import torch
        v = self.version_dir()
        state = {"w%d" % i: torch.randn(256, 1024) for i in range(8)}
        errors = []

        def save(i):
            try:
                torch.save(state, os.path.join(v, "rank%d.pt" % i))
            except Exception as e:  # noqa: BLE001
                errors.append(e)
        threads = [threading.Thread(target=save, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        for i in range(4):
            back = torch.load(os.path.join(v, "rank%d.pt" % i))
            self.assertTrue(all(torch.equal(back[k], state[k]) for k in state))
        self.remount()
        back = torch.load(os.path.join(v, "rank3.pt"))
        self.assertTrue(all(torch.equal(back[k], state[k]) for k in state))

    def test_kill9_after_fsync_keeps_the_fsynced_bytes(self):
        v = self.version_dir()
        path = os.path.join(v, "durable.bin")
        f = open(path, "wb")
        f.write(data(3 * MiB, 5))
        f.flush()
        os.fsync(f.fileno())
        f.write(b"not acknowledged")
        f.flush()
        self.m.kill_daemon()
        try:
            f.close()
        except OSError:
            pass
        self.m.mount()
        got = read_file(path)
        self.assertIn(got, (data(3 * MiB, 5), data(3 * MiB, 5) + b"not acknowledged"))
        if self.passed_through():
            # The fsync was answered by the fsync journal (docs/fs.md): the new daemon found it
            # and committed it.
            self.assertIn("committed now (journal", self.log())
        self.assert_journals_go()

    def test_kill9_during_the_commit_after_a_journaled_fsync(self):
        v = self.version_dir()
        paths = [os.path.join(v, "rank%d.bin" % i) for i in range(3)]
        for i, path in enumerate(paths):
            with open(path, "wb") as f:
                f.write(data(24 * MiB, 10 + i))
                f.flush()
                os.fsync(f.fileno())
        # The commits of the closes (the store ingests 72 MiB) are running or queued.
        self.m.kill_daemon()
        self.m.mount()
        for i, path in enumerate(paths):
            self.assertEqual(read_file(path), data(24 * MiB, 10 + i), path)
        self.assert_journals_go()
        self.remount()
        for i, path in enumerate(paths):
            self.assertEqual(read_file(path), data(24 * MiB, 10 + i), path)

    def passed_through(self):
        return not OFF and self.live().get("enabled") and self.opens() > 0

    def log(self):
        with open(os.path.join(self.store, "ckptfs.log"), errors="replace") as f:
            return f.read()

    def assert_journals_go(self):
        """After a sync, no journal is left in the store's staging directory."""
        mounted.ckptfs("sync", self.mnt)
        left = [n for n in os.listdir(os.path.join(self.store, "staging"))
                if n.startswith("journal-")]
        self.assertEqual(left, [])


if __name__ == "__main__":
    mounted.main()
