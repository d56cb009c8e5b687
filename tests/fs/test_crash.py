#!/usr/bin/python3
"""Must-show 7: the daemon is SIGKILLed while a checkpoint save is in flight.

What is expected, from the write path's rules (engine/namespace/filesystem.h): a file's bytes
become durable when the file is committed (fsync, or the asynchronous commit after its last
close, or `ckptfs sync`), and a commit swaps the file's content in one catalog transaction.
So after the crash and a fresh mount:
  - A, written and fsync()ed before the crash, is bitwise intact;
  - B, still being written (never closed or fsynced) when the daemon died, is absent or
    incomplete: its name exists (the namespace change was committed at create) with fewer
    bytes than were to be written - in practice 0 - and whatever bytes it has are a prefix of
    what was written. It is never a file of full size with wrong bytes;
  - C, closed just before the crash but not fsynced, has either nothing (its commit had not
    run) or all of its bytes, nothing in between;
  - the store verifies clean and the filesystem keeps working.

test_sigkill_during_ingest_from_the_spool: writes land in a spool and are ingested behind the
writer (docs/fs.md). The daemon is killed while a file streams through its spool; files
acknowledged meanwhile (fsync, `ckptfs sync`) must be intact after the crash.
"""
import hashlib
import multiprocessing
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mounted  # noqa: E402

MiB = 1 << 20
A_BYTES, B_BYTES, C_BYTES = 16 * MiB + 3, 400 * MiB, 8 * MiB


def payload(seed, n):
    return random.Random(seed).randbytes(n)


def write_slowly(path, seed, total, patch_header):
    """Writes `total` bytes in 1 MiB pieces until the mount dies under it, at most ~200 MiB/s:
    through FUSE passthrough a write runs at page-cache speed, and the writer must still be
    writing when the test kills the daemon."""
    block = payload(seed, MiB)
    try:
        with open(path, "wb") as f:
            if patch_header:  # the staging path: a header patched after some body
                f.write(bytes(4096))
                f.write(block)
                f.seek(0)
                f.write(block[:4096])
                f.seek(0, os.SEEK_END)
            for _ in range(total // MiB):
                f.write(block)
                time.sleep(0.005)
    except OSError:
        pass  # ENOTCONN / EIO / ECONNABORTED once the daemon is gone
    os._exit(0)


class CrashTest(mounted.MountedTestCase):
    def test_sigkill_during_save(self):
        v = self.version_dir("global_step5")
        a, b, b2, c = (os.path.join(v, n) for n in ("A.pt", "B.pt", "B2.pt", "C.pt"))
        a_bytes = payload(1, A_BYTES)
        with open(a, "wb") as f:
            f.write(a_bytes)
            os.fsync(f.fileno())
        c_bytes = payload(3, C_BYTES)

        ctx = multiprocessing.get_context("fork")
        writers = [ctx.Process(target=write_slowly, args=(b, 2, B_BYTES, False)),
                   ctx.Process(target=write_slowly, args=(b2, 4, B_BYTES, True))]
        try:
            for p in writers:
                p.start()
            # Wait until both saves are well under way, then close C and crash.
            self.assertTrue(mounted.wait_until(
                lambda: all(os.path.exists(p) and os.stat(p).st_size >= 24 * MiB
                            for p in (b, b2)), 60), "the writers did not get going")
            with open(c, "wb") as f:
                f.write(c_bytes)
            pid = self.m.pid
            self.assertEqual(int(os.getxattr(self.mnt, "user.ckptfs.pid")), pid)
            sizes_at_kill = [os.stat(p).st_size for p in (b, b2)]
            self.m.kill_daemon()  # SIGKILL, then fusermount3 -u -z of the dead mount
            self.assertFalse(mounted.pid_alive(pid))
            self.assertFalse(mounted.is_mounted(self.mnt))
            for p in writers:
                p.join(60)
                self.assertFalse(p.is_alive(), "a writer hangs on the dead mount")
        finally:
            for p in writers:
                if p.is_alive():
                    p.kill()
                    p.join()
        self.assertTrue(all(s < B_BYTES for s in sizes_at_kill), sizes_at_kill)

        self.m.mount()
        with open(a, "rb") as f:
            self.assertEqual(f.read(), a_bytes, "A was fsynced before the crash")
        for path, seed in ((b, 2), (b2, 4)):
            if not os.path.exists(path):
                continue
            size = os.stat(path).st_size
            print("%s after the crash: %d bytes" % (os.path.basename(path), size),
                  file=sys.stderr)
            self.assertLess(size, B_BYTES, path + " must not have its full size")
            with open(path, "rb") as f:
                got = f.read()
            self.assertEqual(len(got), size)
            block = payload(seed, MiB)
            expect = (block * (size // MiB + 2))[:size]
            self.assertEqual(hashlib.sha256(got).digest(), hashlib.sha256(expect).digest(),
                             path + " holds bytes that were never written there")
        with open(c, "rb") as f:
            got = f.read()
        print("C after the crash: %d bytes" % len(got), file=sys.stderr)
        self.assertIn(len(got), (0, C_BYTES), "C must be all or nothing")
        if got:
            self.assertEqual(got, c_bytes)

        # The filesystem keeps working and the store is sound.
        d = os.path.join(v, "D.pt")
        with open(d, "wb") as f:
            f.write(a_bytes[::-1])
        self.remount()
        with open(d, "rb") as f:
            self.assertEqual(f.read(), a_bytes[::-1])
        self.m.umount()
        verify = mounted.ckptfs("verify", self.store)
        self.assertIn("no problems", verify.stdout)


    def test_sigkill_during_ingest_from_the_spool(self):
        # The spool is off by default (fs/mount.cc); CKPTFS_SPOOL=1 turns it on for this daemon,
        # and CKPTFS_PASSTHROUGH=0 keeps new files from bypassing it (FUSE passthrough).
        self.m.umount()
        os.environ["CKPTFS_SPOOL"] = "1"
        os.environ["CKPTFS_PASSTHROUGH"] = "0"
        try:
            self.m.mount()
        finally:
            del os.environ["CKPTFS_SPOOL"]
            del os.environ["CKPTFS_PASSTHROUGH"]
        v = self.version_dir("global_step7")
        e, f_, g = (os.path.join(v, n) for n in ("E.pt", "F.pt", "G.pt"))
        F_BYTES = 1024 * MiB  # more than is written before the kill: F is open at the kill
        ctx = multiprocessing.get_context("fork")
        writer = ctx.Process(target=write_slowly, args=(f_, 5, F_BYTES, False))
        e_bytes, g_bytes = payload(6, 48 * MiB + 5), payload(7, 24 * MiB + 1)
        pid = self.m.pid
        try:
            writer.start()
            self.assertTrue(mounted.wait_until(
                lambda: os.path.exists(f_) and os.stat(f_).st_size >= 32 * MiB, 60),
                "F did not get going")
            # Acknowledged while F streams: fsync of E, then `ckptfs sync` after G's close.
            with open(e, "wb") as f:
                f.write(e_bytes)
                os.fsync(f.fileno())
            with open(g, "wb") as f:
                f.write(g_bytes)
            os.setxattr(self.mnt, "user.ckptfs.sync", b"1")
            # F is still being written: its bytes go through a spool (an unnamed file in the
            # store's staging directory) that the daemon holds open. The sync committed F and
            # closed its spool; F's next write opens a new one.
            def spool_open():
                for fd in os.listdir("/proc/%d/fd" % pid):
                    try:
                        if "/staging/" in os.readlink("/proc/%d/fd/%s" % (pid, fd)):
                            return True
                    except FileNotFoundError:  # closed meanwhile
                        pass
                return False
            self.assertTrue(mounted.wait_until(spool_open, 30), "no spool open while F is written")
            self.assertTrue(writer.is_alive(), "F finished before the kill")
            size_at_kill = os.stat(f_).st_size
            self.m.kill_daemon()
            self.assertFalse(mounted.pid_alive(pid))
            writer.join(60)
            self.assertFalse(writer.is_alive(), "the writer hangs on the dead mount")
        finally:
            if writer.is_alive():
                writer.kill()
                writer.join()
        print("F was %d bytes at the kill" % size_at_kill, file=sys.stderr)

        self.m.mount()
        with open(e, "rb") as f:
            self.assertEqual(f.read(), e_bytes, "E was fsynced before the crash")
        with open(g, "rb") as f:
            self.assertEqual(f.read(), g_bytes, "G was synced before the crash")
        size = os.stat(f_).st_size
        print("F after the crash: %d bytes" % size, file=sys.stderr)
        self.assertLess(size, F_BYTES)
        with open(f_, "rb") as f:
            got = f.read()
        block = payload(5, MiB)
        self.assertEqual(got, (block * (size // MiB + 2))[:size],
                         "F holds bytes that were never written there")
        self.m.umount()
        verify = mounted.ckptfs("verify", self.store)
        self.assertIn("no problems", verify.stdout)


if __name__ == "__main__":
    mounted.main()
