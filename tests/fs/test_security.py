#!/usr/bin/python3
"""Security (issue 15, docs/threat-model.md): the mount, the store and the control socket are
private to the user who mounted (here root) unless an option says otherwise.

- Another user (nobody) can neither list the mount (FUSE without allow_other) nor reach the
  store: the store directory and packs/ are 0700, its files 0600.
- The control socket serves only the daemon's user (SO_PEERCRED), even when its mode and the
  store's would let another user connect: nobody's connection is closed unanswered, while the
  owner's request on the same socket is answered.
"""
import os
import socket
import stat
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mounted  # noqa: E402

NOBODY = 65534


def as_nobody(fn):
    """Runs fn() in a child process as uid/gid nobody; returns what it returned (a short str)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            out = fn()
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            out = "raised %s: %s" % (type(e).__name__, e)
        os.write(w, out.encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        out = f.read()
    os.waitpid(pid, 0)
    return out


def request(path):
    """One control frame (4-byte little-endian length, JSON) and the reply's first bytes."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(20)
        s.connect(path)
        body = b'{"op": "status"}'
        try:  # a refused connection may be closed before the request is even sent
            s.sendall(struct.pack("<I", len(body)) + body)
            return s.recv(64)
        except (BrokenPipeError, ConnectionResetError):
            return b""


class SecurityTest(mounted.MountedTestCase):
    def test_store_files_and_directories_are_private(self):
        v = self.version_dir("v1")
        mounted.write_file(os.path.join(v, "model.pt"), mounted.data(3 * mounted.MiB, 1))
        os.setxattr(self.mnt, "user.ckptfs.sync", b"1")
        seen = 0
        for root, dirs, files in os.walk(self.store):
            for name in [root] + [os.path.join(root, f) for f in files]:
                mode = os.lstat(name).st_mode
                self.assertEqual(stat.S_IMODE(mode) & 0o077, 0,
                                 "%s is mode %o: readable by others" % (name, stat.S_IMODE(mode)))
                seen += 1
        self.assertGreater(seen, 5)
        self.assertEqual(stat.S_IMODE(os.stat(self.store).st_mode), 0o700)

    def test_other_users_cannot_use_the_mount_or_the_store(self):
        mounted.write_file(self.m.path("f"), b"secret")
        self.assertIn("PermissionError", as_nobody(lambda: str(os.listdir(self.mnt))))
        self.assertIn("PermissionError", as_nobody(lambda: str(os.listdir(self.store))))

    def test_control_socket_serves_only_the_daemons_user(self):
        path = os.getxattr(self.mnt, "user.ckptfs.control").decode()
        self.assertNotEqual(request(path), b"", "the owner gets a reply")
        # Open the way (the store and the directories above it 0711, the socket 0666): the
        # peer check alone must refuse nobody.
        dirs = [self.store]
        while os.path.dirname(dirs[-1]) != dirs[-1] and dirs[-1] != mounted.root_dir():
            dirs.append(os.path.dirname(dirs[-1]))
        modes = {d: stat.S_IMODE(os.stat(d).st_mode) for d in dirs}
        for d in dirs:
            os.chmod(d, modes[d] | 0o711)
        os.chmod(path, 0o666)
        try:
            got = as_nobody(lambda: repr(request(path)))
        finally:
            os.chmod(path, 0o600)
            for d in dirs:
                os.chmod(d, modes[d])
        self.assertEqual(got, "b''", "nobody's connection must be closed unanswered")
        self.assertNotEqual(request(path), b"", "the owner is still served")


if __name__ == "__main__":
    mounted.main()
