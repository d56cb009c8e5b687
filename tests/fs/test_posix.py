#!/usr/bin/python3
"""POSIX behaviour of a real ckptfs mount: cp -r / ls / stat / du / df, the non-streaming
write paths (patch a header after the body, sparse writes, truncate), and the namespace calls
(mkdir/rmdir, rename, unlink of an open file, symlinks, chmod/utime, user.* xattrs, link)."""
import errno
import filecmp
import os
import random
import stat
import struct
import subprocess
import sys
import tempfile
import zipfile
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mounted  # noqa: E402

MiB = mounted.MiB
data, write_file, read_file = mounted.data, mounted.write_file, mounted.read_file


class CopyAndStatTest(mounted.MountedTestCase):
    """Must-show 3: `cp -r` of a version out equals the source; ls/stat/du/df are sane."""

    def test_cp_r_ls_stat_du_df(self):
        v = self.version_dir("global_step7")
        os.mkdir(os.path.join(v, "sub"))
        files = {
            "mp_rank_00_model_states.pt": data(9 * MiB + 123, 1),
            "empty": b"",
            "tiny.json": b'{"step": 7}\n',
            "sub/optim.bin": data(3 * MiB, 2),
            "sub/zeros.bin": bytes(2 * MiB),
            "sub/dup.bin": data(3 * MiB, 2),  # same bytes as optim.bin: dedup must not mix them
        }
        for rel, payload in files.items():
            write_file(os.path.join(v, rel), payload)
        self.check_copy_and_stats(v, files)
        self.remount()
        self.check_copy_and_stats(v, files)

    def check_copy_and_stats(self, v, files):
        with tempfile.TemporaryDirectory(dir=mounted.root_dir()) as out:
            dst = os.path.join(out, "copy")
            mounted.run(["cp", "-r", v, dst])
            mounted.run(["diff", "-r", v, dst])
            for rel, payload in files.items():
                mounted.run(["cmp", os.path.join(v, rel), os.path.join(dst, rel)])
                self.assertEqual(read_file(os.path.join(dst, rel)), payload, rel)
            cmp = filecmp.dircmp(v, dst)
            self.assertEqual(sorted(cmp.left_only + cmp.right_only), [])

        for rel, payload in files.items():
            st = os.stat(os.path.join(v, rel))
            self.assertTrue(stat.S_ISREG(st.st_mode), rel)
            self.assertEqual(st.st_size, len(payload), rel)
            self.assertEqual(st.st_nlink, 1, rel)
            self.assertGreaterEqual(st.st_blocks * 512, len(payload), rel)
            self.assertLess(st.st_blocks * 512, len(payload) + 4096 + 1, rel)
            self.assertGreater(st.st_blksize, 0)
        st = os.stat(v)
        self.assertTrue(stat.S_ISDIR(st.st_mode))
        self.assertEqual(st.st_nlink, 3)  # ".", its entry in the root, "sub/.."

        # ls -l: the size column equals the written size.
        ls = mounted.run(["ls", "-ln", os.path.join(v, "sub")]).stdout.splitlines()
        sizes = {line.split()[-1]: int(line.split()[4]) for line in ls[1:]}
        self.assertEqual(sizes, {"optim.bin": 3 * MiB, "zeros.bin": 2 * MiB, "dup.bin": 3 * MiB})
        # stat(1) agrees with os.stat.
        out = mounted.run(["stat", "-c", "%s %F", os.path.join(v, "tiny.json")]).stdout.split()
        self.assertEqual(out[0], str(len(files["tiny.json"])))
        # du: apparent size is the sum of the file sizes; allocated size is at least that.
        total = sum(len(p) for p in files.values())
        du_b = int(mounted.run(["du", "-sb", v]).stdout.split()[0])
        self.assertGreaterEqual(du_b, total)
        self.assertLess(du_b, total + 64 * 1024)  # plus the directories' own sizes
        du_k = int(mounted.run(["du", "-sk", v]).stdout.split()[0])
        self.assertGreaterEqual(du_k * 1024, total)
        # df and statvfs: a non-zero size, free space no more than the size.
        df = mounted.run(["df", "-B1", "--output=size,avail", self.mnt]).stdout.splitlines()
        size, avail = (int(x) for x in df[1].split())
        self.assertGreater(size, 0)
        self.assertLessEqual(avail, size)
        sv = os.statvfs(self.mnt)
        self.assertGreater(sv.f_blocks, 0)
        self.assertGreater(sv.f_bsize, 0)
        self.assertEqual(sv.f_namemax, 255)


class WritePathTest(mounted.MountedTestCase):
    """Must-show 4: header patched after the body, sparse writes and truncate."""

    share_mount = True

    def test_patch_header_after_body(self):
        v = self.version_dir()
        path = os.path.join(v, "model.h5")
        body = data(6 * MiB + 17, 3)
        header_len = 512
        with open(path, "wb") as f:
            f.write(bytes(header_len))  # placeholder, as zip and HDF5 writers do
            for i in range(0, len(body), 1 * MiB):
                f.write(body[i:i + 1 * MiB])
            f.seek(0)
            header = struct.pack("<8sQI", b"CKPTHDR1", len(body), zlib.crc32(body))
            f.write(header)
            f.seek(0, os.SEEK_END)
            f.write(b"TRAILER")
        expect = header + bytes(header_len - len(header)) + body + b"TRAILER"

        # A real zip writer: ZipFile.write() of a file seeks back to fill in CRC and sizes.
        src = os.path.join(mounted.root_dir(), "zip-src.bin")
        payload = data(4 * MiB, 4) + bytes(2 * MiB)
        write_file(src, payload)
        zpath = os.path.join(v, "archive.zip")
        with zipfile.ZipFile(zpath, "w", compression=zipfile.ZIP_STORED) as zf:
            zf.write(src, "weights.bin")
            zf.writestr("meta.json", '{"step": 1}')
        local_zip = os.path.join(mounted.root_dir(), "local.zip")
        with zipfile.ZipFile(local_zip, "w", compression=zipfile.ZIP_STORED) as zf:
            zf.write(src, "weights.bin")
            zf.writestr("meta.json", '{"step": 1}')

        def check():
            self.assertEqual(read_file(path), expect)
            self.assertEqual(os.stat(path).st_size, len(expect))
            with zipfile.ZipFile(zpath) as zf:
                self.assertIsNone(zf.testzip())
                self.assertEqual(zf.read("weights.bin"), payload)
                self.assertEqual(zf.read("meta.json"), b'{"step": 1}')
            self.assertEqual(os.stat(zpath).st_size, os.stat(local_zip).st_size)

        check()
        self.remount()
        check()

    def test_sparse_writes(self):
        v = self.version_dir()
        path = os.path.join(v, "sparse.bin")
        tail = data(1 * MiB, 5)
        with open(path, "wb") as f:
            f.seek(10 * MiB)
            f.write(tail)
        # Seek past the end of a file that already has bytes.
        path2 = os.path.join(v, "sparse2.bin")
        head = data(3 * MiB + 5, 6)
        with open(path2, "wb") as f:
            f.write(head)
            f.seek(7 * MiB + 3)
            f.write(b"end")
        # Punch through an existing (committed) file with r+b.
        with open(path2, "r+b") as f:
            f.seek(4 * MiB)
            f.write(b"middle")
        expect2 = head + bytes(MiB - 5) + b"middle" + bytes(3 * MiB - 3) + b"end"

        def check():
            got = read_file(path)
            self.assertEqual(len(got), 11 * MiB)
            self.assertEqual(got[:10 * MiB], bytes(10 * MiB))
            self.assertEqual(got[10 * MiB:], tail)
            self.assertEqual(os.stat(path).st_size, 11 * MiB)
            self.assertEqual(len(expect2), 7 * MiB + 6)
            self.assertEqual(read_file(path2), expect2)

        check()
        self.remount()
        check()

    def test_truncate(self):
        v = self.version_dir()
        a, b, c, d = (os.path.join(v, n) for n in ("a", "b", "c", "d"))
        pa, pb, pc = data(5 * MiB, 7), data(2 * MiB + 1, 8), data(3 * MiB, 9)
        write_file(a, pa)
        write_file(b, pb)
        write_file(c, pc)
        write_file(d, b"will be emptied")
        os.truncate(a, 1 * MiB + 3)            # smaller, by path, committed file
        os.truncate(b, 4 * MiB)                # larger: zeros after the old end
        with open(c, "r+b") as f:              # on an open file, then write past the new end
            os.ftruncate(f.fileno(), 1000)
            f.seek(2000)
            f.write(b"xyz")
        os.truncate(d, 0)
        same = os.path.join(v, "same")         # to its own size: nothing changes
        write_file(same, pc)
        os.truncate(same, len(pc))
        fresh = os.path.join(v, "e")
        with open(fresh, "wb") as f:           # while it streams: larger, then keep writing
            f.write(pa[:MiB])
            f.truncate(2 * MiB)
            f.seek(0, os.SEEK_END)
            f.write(b"after")
        expect = {
            a: pa[:MiB + 3],
            b: pb + bytes(4 * MiB - len(pb)),
            c: pc[:1000] + bytes(1000) + b"xyz",
            d: b"",
            same: pc,
            fresh: pa[:MiB] + bytes(MiB) + b"after",
        }

        def check():
            for path, want in expect.items():
                self.assertEqual(os.stat(path).st_size, len(want), path)
                self.assertEqual(read_file(path), want, path)

        check()
        self.remount()
        check()
        os.truncate(a, 0)  # a committed file to nothing
        self.assertEqual(read_file(a), b"")
        self.assertEqual(os.stat(a).st_size, 0)


class NamespaceTest(mounted.MountedTestCase):
    """Basic POSIX calls."""

    share_mount = True

    def test_mkdir_rmdir(self):
        v = self.version_dir()
        d = os.path.join(v, "d", )
        os.mkdir(d)
        os.makedirs(os.path.join(d, "x", "y"))
        self.assertErrno(errno.EEXIST, os.mkdir, d)
        self.assertErrno(errno.ENOTEMPTY, os.rmdir, d)
        write_file(os.path.join(d, "x", "f"), b"f")
        self.assertErrno(errno.ENOTDIR, os.rmdir, os.path.join(d, "x", "f"))
        self.assertErrno(errno.EISDIR, os.unlink, os.path.join(d, "x"))
        self.assertEqual(os.stat(d).st_nlink, 3)
        os.rmdir(os.path.join(d, "x", "y"))
        os.unlink(os.path.join(d, "x", "f"))
        os.rmdir(os.path.join(d, "x"))
        self.assertEqual(os.stat(d).st_nlink, 2)
        os.rmdir(d)
        self.assertFalse(os.path.exists(d))
        self.assertErrno(errno.ENOENT, os.rmdir, d)
        self.assertEqual(os.listdir(v), [])

    def test_rename_file_over_existing(self):
        v = self.version_dir()
        src, dst = os.path.join(v, "tmp.pt"), os.path.join(v, "model.pt")
        new, old = data(2 * MiB, 10), data(3 * MiB, 11)
        write_file(dst, old)
        write_file(src, new)
        with open(dst, "rb") as reader:  # a reader of the old file keeps the old bytes
            os.rename(src, dst)
            self.assertEqual(reader.read(), old)
        self.assertFalse(os.path.exists(src))
        self.assertEqual(read_file(dst), new)
        self.assertEqual(sorted(os.listdir(v)), ["model.pt"])
        # Into a subdirectory of the same version, replacing again.
        os.mkdir(os.path.join(v, "sub"))
        write_file(os.path.join(v, "sub", "model.pt"), b"older")
        os.replace(dst, os.path.join(v, "sub", "model.pt"))
        self.assertEqual(read_file(os.path.join(v, "sub", "model.pt")), new)
        self.assertEqual(os.listdir(v), ["sub"])
        self.remount()
        self.assertEqual(read_file(os.path.join(v, "sub", "model.pt")), new)
        self.assertEqual(os.listdir(v), ["sub"])

    def test_rename_top_level_dir(self):
        tmp = self.version_dir("tmp-checkpoint-9")
        os.mkdir(os.path.join(tmp, "inner"))
        payload = data(MiB, 12)
        write_file(os.path.join(tmp, "inner", "w.bin"), payload)
        final = self.m.path("checkpoint-9")
        os.rename(tmp, final)
        self.assertFalse(os.path.exists(tmp))
        self.assertEqual(read_file(os.path.join(final, "inner", "w.bin")), payload)
        self.assertIn("checkpoint-9", os.listdir(self.mnt))
        self.assertNotIn("tmp-checkpoint-9", os.listdir(self.mnt))
        self.assertEqual(os.getxattr(final, "user.ckptfs.sealed"), b"0")
        self.remount()
        self.assertEqual(read_file(os.path.join(final, "inner", "w.bin")), payload)
        self.assertFalse(os.path.exists(tmp))

    def test_unlink_open_file(self):
        v = self.version_dir()
        path = os.path.join(v, "victim")
        payload = data(3 * MiB, 13)
        write_file(path, payload)
        fd = os.open(path, os.O_RDONLY)
        try:
            os.unlink(path)
            self.assertFalse(os.path.exists(path))
            self.assertNotIn("victim", os.listdir(v))
            self.assertEqual(os.pread(fd, len(payload) + 10, 0), payload)
            self.assertEqual(os.fstat(fd).st_size, len(payload))
        finally:
            os.close(fd)
        self.assertFalse(os.path.exists(path))
        # Unlinked while being written: writes and reads through the fd still work.
        path2 = os.path.join(v, "victim2")
        with open(path2, "w+b") as f:
            f.write(payload[:MiB])
            os.unlink(path2)
            f.write(payload[MiB:])
            f.flush()
            f.seek(0)
            self.assertEqual(f.read(), payload)
        self.assertEqual(os.listdir(v), [])
        self.remount()
        self.assertEqual(os.listdir(v), [])

    def test_symlink_readlink(self):
        v = self.version_dir()
        write_file(os.path.join(v, "global_step3.pt"), b"weights")
        link = os.path.join(v, "latest.pt")
        os.symlink("global_step3.pt", link)
        self.assertEqual(os.readlink(link), "global_step3.pt")
        self.assertTrue(stat.S_ISLNK(os.lstat(link).st_mode))
        self.assertEqual(os.lstat(link).st_size, len("global_step3.pt"))
        self.assertEqual(read_file(link), b"weights")
        dangling = os.path.join(v, "dangling")
        os.symlink("/nonexistent/target", dangling)
        self.assertEqual(os.readlink(dangling), "/nonexistent/target")
        self.assertFalse(os.path.exists(dangling))
        self.assertErrno(errno.EEXIST, os.symlink, "x", link)
        self.remount()
        self.assertEqual(os.readlink(link), "global_step3.pt")
        os.unlink(link)
        self.assertTrue(os.path.exists(os.path.join(v, "global_step3.pt")))

    def test_chmod_utime(self):
        v = self.version_dir()
        path = os.path.join(v, "f")
        write_file(path, b"x" * 100)
        os.chmod(path, 0o600)
        self.assertEqual(stat.S_IMODE(os.stat(path).st_mode), 0o600)
        os.chmod(v, 0o750)
        self.assertEqual(stat.S_IMODE(os.stat(v).st_mode), 0o750)
        atime, mtime = 1_600_000_000_123_456_789, 1_500_000_000_987_654_321
        os.utime(path, ns=(atime, mtime))
        st = os.stat(path)
        self.assertEqual(st.st_atime_ns, atime)
        self.assertEqual(st.st_mtime_ns, mtime)
        before = os.stat(path).st_ctime_ns
        os.utime(path)  # now
        st = os.stat(path)
        self.assertGreater(st.st_mtime_ns, mtime)
        self.assertGreaterEqual(st.st_ctime_ns, before)
        os.utime(path, ns=(atime, mtime))
        self.remount()
        st = os.stat(path)
        self.assertEqual(stat.S_IMODE(st.st_mode), 0o600)
        self.assertEqual((st.st_atime_ns, st.st_mtime_ns), (atime, mtime))
        self.assertEqual(stat.S_IMODE(os.stat(v).st_mode), 0o750)
        os.chmod(v, 0o755)

    def test_rewrite_right_after_close(self):
        # DeepSpeed rewrites the top-level `latest` at every save: an open(O_TRUNC) that comes
        # while the previous close's commit is still in flight must not lose to it.
        v = self.version_dir()
        for i in range(30):
            for d in (self.mnt, v):
                p = os.path.join(d, "latest-%s-%d" % (os.path.basename(v), i))
                write_file(p, b"global_step1")
                write_file(p, b"global_step2")
                self.assertEqual(read_file(p), b"global_step2", p)
                with open(p, "ab") as f:
                    f.write(b"+tail")
                self.assertEqual(read_file(p), b"global_step2+tail", p)
                os.unlink(p)

    def test_utime_right_after_close_sticks(self):
        # cp -p, rsync -t and tar set the mtime as soon as the file is closed, racing the
        # asynchronous commit of the file's bytes; the commit must not bring back its own mtime.
        v = self.version_dir()
        src = os.path.join(mounted.root_dir(), "cp-p-src")
        os.mkdir(src)
        want = {}
        for i in range(12):
            p = os.path.join(src, "f%d" % i)
            write_file(p, data(64 * 1024 * (i + 1), 100 + i))
            os.utime(p, ns=(1_400_000_000_000_000_000 + i, 1_300_000_000_000_000_000 + i))
            want["f%d" % i] = 1_300_000_000_000_000_000 + i
        mounted.run(["cp", "-p", "-r", src, os.path.join(v, "copy")])
        for i in range(12):
            p = os.path.join(v, "direct%d" % i)
            write_file(p, data(200 * 1024, 200 + i))
            os.utime(p, ns=(1, 1_200_000_000_000_000_000 + i))
            want["direct%d" % i] = 1_200_000_000_000_000_000 + i

        def mtimes():
            got = {}
            for name in want:
                p = os.path.join(v, "copy", name) if name.startswith("f") else os.path.join(v, name)
                got[name] = os.stat(p).st_mtime_ns
            return got

        self.remount()
        self.assertEqual(mtimes(), want)

    def test_user_xattrs(self):
        v = self.version_dir()
        path = os.path.join(v, "f")
        write_file(path, b"x")
        os.setxattr(path, "user.step", b"42")
        os.setxattr(path, "user.blob", bytes(range(256)) * 16)
        os.setxattr(v, "user.kind", b"deepspeed")
        self.assertEqual(os.getxattr(path, "user.step"), b"42")
        self.assertEqual(os.getxattr(path, "user.blob"), bytes(range(256)) * 16)
        self.assertEqual(sorted(os.listxattr(path)), ["user.blob", "user.step"])
        self.assertEqual(os.listxattr(v), ["user.kind"])  # control attributes are not listed
        self.assertErrno(errno.EEXIST, os.setxattr, path, "user.step", b"1", os.XATTR_CREATE)
        self.assertErrno(errno.ENODATA, os.setxattr, path, "user.nope", b"1", os.XATTR_REPLACE)
        os.setxattr(path, "user.step", b"43", os.XATTR_REPLACE)
        self.assertEqual(os.getxattr(path, "user.step"), b"43")
        os.removexattr(path, "user.blob")
        self.assertErrno(errno.ENODATA, os.getxattr, path, "user.blob")
        self.assertErrno(errno.ENODATA, os.removexattr, path, "user.blob")
        self.assertEqual(os.listxattr(path), ["user.step"])
        self.remount()
        self.assertEqual(os.getxattr(path, "user.step"), b"43")
        self.assertEqual(os.getxattr(v, "user.kind"), b"deepspeed")
        self.assertEqual(os.listxattr(path), ["user.step"])

    def test_hard_link_fails_with_eperm(self):
        v = self.version_dir()
        path = os.path.join(v, "f")
        write_file(path, b"x")
        self.assertErrno(errno.EPERM, os.link, path, os.path.join(v, "g"))
        self.assertFalse(os.path.exists(os.path.join(v, "g")))
        self.assertEqual(os.stat(path).st_nlink, 1)
        r = subprocess.run(["ln", path, os.path.join(v, "h")], stderr=subprocess.PIPE)
        self.assertNotEqual(r.returncode, 0)


if __name__ == "__main__":
    mounted.main()
