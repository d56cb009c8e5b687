#!/usr/bin/python3
"""Security (issue 15, docs/threat-model.md): the mount, the store and the control socket are
private to the user who mounted (here root) unless an option says otherwise.

- Another user (nobody) can neither list the mount (FUSE without allow_other) nor reach the
  store: the store directory and packs/ are 0700, its files 0600.
- The control socket serves only the daemon's user (SO_PEERCRED), even when its mode and the
  store's would let another user connect: nobody's connection is closed unanswered, while the
  owner's request on the same socket is answered.
- With `-o control_group=G`, a real second user (made with useradd here, removed afterwards) is
  served while it is in G, and snapshots a model into the root daemon through the snapshot
  engine (read back bitwise as root); the same user without G is refused. The store's root and
  packs/ are then 0710 in G (members list nothing), the socket 0660.
"""
import os
import grp
import pwd
import shutil
import socket
import stat
import struct
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mounted  # noqa: E402

NOBODY = 65534
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
# The snapshot library is built with the sanitizers in scripts/sanitize.sh's ASan run, and an
# uninstrumented /usr/bin/python3 cannot load it there.
SNAPSHOTS = not os.environ.get("CKPTFS_FAULTS_NO_SNAPSHOT")

# What the second user runs: a model's state through the snapshot engine into the daemon.
SNAPSHOT_AS_USER = r"""
import sys
sys.path.insert(0, sys.argv[1])
import torch
import ckptfs
torch.manual_seed(15)
state = {"w": torch.randn(64, 32), "b": torch.randn(32).bfloat16(), "step": torch.tensor(7)}
snap = ckptfs.snapshot(state, sys.argv[2], target="unix:" + sys.argv[3])
snap.wait()
print("ok")
"""


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


def request_json(path, body):
    """One control request; returns the reply's JSON text ('' when closed unanswered)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(20)
        s.connect(path)
        try:
            s.sendall(struct.pack("<I", len(body)) + body)
            head = s.recv(4, socket.MSG_WAITALL)
            if len(head) < 4:
                return ""
            return s.recv(struct.unpack("<I", head)[0], socket.MSG_WAITALL).decode()
        except (BrokenPipeError, ConnectionResetError):
            return ""


def run_as(uid, gid, groups, code, *args):
    """Runs `code` in /usr/bin/python3 as uid/gid with supplementary `groups`."""
    return subprocess.run([sys.executable, "-c", code, *args], user=uid, group=gid,
                          extra_groups=groups, capture_output=True, text=True, timeout=180,
                          env={"PATH": "/usr/bin:/bin", "HOME": "/tmp",
                               "CKPTFS_SNAPSHOT_LIB": os.environ.get("CKPTFS_SNAPSHOT_LIB", ""),
                               "PYTHONDONTWRITEBYTECODE": "1"})


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

    def test_malformed_requests_are_errors_not_crashes(self):
        # Each used to throw out of json::value() in the daemon's connection thread (the
        # daemon ended, the mount with it); each must be an error reply now.
        path = os.getxattr(self.mnt, "user.ckptfs.control").decode()
        for body in (b'{"op":"admin","cmd":"log","version":5}',
                     b'{"op":"admin","cmd":"forget_plan","keep_last":"3"}',
                     b'{"op":"admin","cmd":"gc","progress":1}',
                     b'{"op":"commit","file":"rank_0.safetensors","size":1,"pack_id":1,'
                     b'"pack_length":40,"chunks":[["' + b"a" * 64 + b'",4294967297]],"shard":{}}',
                     b'{"op":"begin","version":"v","rank":2,"world_size":2}', b'[]', b'{'):
            reply = request_json(path, body)
            self.assertIn('"ok":false', reply, body)
        self.assertEqual(os.listdir(self.mnt), [], "the daemon still serves the mount")
        self.assertIn('"ok":true', request_json(path, b'{"op":"admin","cmd":"log"}'))


class ControlGroupTest(mounted.MountedTestCase):
    """-o control_group=G with a real second user."""

    def setUp(self):
        if shutil.which("useradd") is None or shutil.which("groupadd") is None:
            self.skipTest("needs useradd and groupadd")
        tag = "ckptfs%d" % os.getpid()
        self.group, self.user = tag + "g", tag + "u"
        subprocess.run(["groupadd", self.group], check=True)
        self.addCleanup(subprocess.run, ["groupdel", self.group], check=False)
        subprocess.run(["useradd", "--no-create-home", "--no-user-group", "--gid", "nogroup",
                        "--shell", "/usr/sbin/nologin", self.user], check=True)
        self.addCleanup(subprocess.run, ["userdel", self.user], check=False)
        self.uid = pwd.getpwnam(self.user).pw_uid
        self.user_gid = pwd.getpwnam(self.user).pw_gid
        self.gid = grp.getgrnam(self.group).gr_gid
        self.m = self.new_mount(["--seal-after", "0", "-o", "control_group=" + self.group])
        # The directories above the store are the administrator's: open them to the user.
        dirs = [os.path.dirname(self.store)]
        while dirs[-1] != mounted.root_dir():
            dirs.append(os.path.dirname(dirs[-1]))
        for d in dirs:
            mode = stat.S_IMODE(os.stat(d).st_mode)
            os.chmod(d, mode | 0o011)
            self.addCleanup(os.chmod, d, mode)
        self.socket = os.getxattr(self.mnt, "user.ckptfs.control").decode()

    def as_user(self, groups, code, *args):
        return run_as(self.uid, self.user_gid, groups, code, *args)

    def test_modes_open_only_what_the_group_needs(self):
        for path, mode in ((self.store, 0o710), (os.path.join(self.store, "packs"), 0o710),
                           (self.socket, 0o660)):
            st = os.stat(path)
            self.assertEqual((stat.S_IMODE(st.st_mode), st.st_gid), (mode, self.gid), path)
        for name in os.listdir(self.store):
            path = os.path.join(self.store, name)
            if path != self.socket and not os.path.isdir(path):
                self.assertEqual(stat.S_IMODE(os.stat(path).st_mode) & 0o077, 0, path)
        listing = "import os, sys\ntry:\n  print(os.listdir(sys.argv[1]))\n" \
                  "except PermissionError:\n  print('refused')\n"
        self.assertEqual(self.as_user([self.gid], listing, self.store).stdout.strip(), "refused")
        # Without the option, the next mount is private again.
        self.remount(["--seal-after", "0"])
        for path in (self.store, os.path.join(self.store, "packs")):
            self.assertEqual(stat.S_IMODE(os.stat(path).st_mode), 0o700, path)
        self.assertEqual(stat.S_IMODE(os.stat(self.socket).st_mode), 0o600)

    def test_members_are_served_others_refused(self):
        code = ("import sys; sys.path.insert(0, sys.argv[1]); import test_security as t; "
                "print(repr(t.request_json(sys.argv[2], b'{\"op\":\"admin\",\"cmd\":\"log\"}')))")
        member = self.as_user([self.gid], code, HERE, self.socket)
        self.assertEqual(member.returncode, 0, member.stderr)
        self.assertIn('"ok":true', member.stdout, "a member of the group is served")
        self.assertIn("versions", member.stdout)
        outsider = self.as_user([], code, HERE, self.socket)
        self.assertIn("PermissionError", outsider.stderr, "without the group: the modes refuse")
        # With the modes opened up (store 0711, socket 0666), the peer check alone refuses.
        os.chmod(self.store, 0o711)
        os.chmod(self.socket, 0o666)
        try:
            outsider = self.as_user([], code, HERE, self.socket)
        finally:
            os.chmod(self.store, 0o710)
            os.chmod(self.socket, 0o660)
        self.assertEqual(outsider.returncode, 0, outsider.stderr)
        self.assertEqual(outsider.stdout.strip(), "''", "without the group: closed unanswered")
        # The same user as the primary group counts too.
        primary = run_as(self.uid, self.gid, [], code, HERE, self.socket)
        self.assertIn('"ok":true', primary.stdout, primary.stderr)

    def test_member_snapshots_into_the_root_daemon(self):
        if not SNAPSHOTS:
            self.skipTest("CKPTFS_FAULTS_NO_SNAPSHOT: the snapshot library is not loadable here")
        try:
            import torch
        except ImportError:
            self.skipTest("needs python3-torch")
        out = self.as_user([self.gid], SNAPSHOT_AS_USER, os.path.join(REPO, "python"),
                           self.m.path("from_job"), self.socket)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        sys.path.insert(0, os.path.join(REPO, "python"))
        from ckptfs import sharded
        got = sharded.load_sharded(self.m.path("from_job"), 0, 1)
        torch.manual_seed(15)
        want = {"w": torch.randn(64, 32), "b": torch.randn(32).bfloat16(),
                "step": torch.tensor(7)}
        self.assertEqual(sorted(got), sorted(want))
        for k in want:
            self.assertTrue(torch.equal(got[k], want[k]), (k, got[k], want[k]))
        verify = mounted.ckptfs("verify", self.store, check=False)
        self.assertEqual(verify.returncode, 0, verify.stdout + verify.stderr)


if __name__ == "__main__":
    mounted.main()
