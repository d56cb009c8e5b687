"""Shared helpers for the tests that really mount ckptfs (tests/fs/test_*.py).

Run by Debian's /usr/bin/python3 (the interpreter that sees python3-torch and numpy), as root.
The binary comes from $CKPTFS (CTest passes $<TARGET_FILE:ckptfs>), else build/ckptfs.

    class MyTest(mounted.MountedTestCase):
        mount_options = ["--seal-after", "0"]
        def test_x(self):
            path = os.path.join(self.mnt, "v1")   # a mount per test, unmounted afterwards
            ...
            self.remount()                        # umount + mount of the same store

Every mount made here is undone however a test ends: Mount.close() (umount, then
`fusermount3 -u -z`, then SIGKILL of the daemon) runs from addCleanup, and a guard process
started on import does the same for whatever is left if this process dies without cleaning up
(e.g. CTest's timeout kills it). All files live under one temporary root, removed at the end.
"""
import atexit
import errno
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

CKPTFS = os.path.abspath(os.environ.get("CKPTFS") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "ckptfs"))

ROOT_PREFIX = "ckptfs-fstest-"


MiB = 1 << 20


def data(n, seed):
    return random.Random(seed).randbytes(n)


def write_file(path, payload):
    with open(path, "wb") as f:
        f.write(payload)


def read_file(path):
    with open(path, "rb") as f:
        return f.read()


def mounted_points():
    """Mount points of fuse.ckptfs filesystems, from /proc/self/mountinfo."""
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            if right.split(" ")[0] == "fuse.ckptfs":
                points.append(left.split(" ")[4].replace("\\040", " "))
    return points


def is_mounted(path):
    return os.path.realpath(path) in mounted_points()


def pid_alive(pid):
    """True while `pid` runs (a zombie counts as gone)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_until(predicate, timeout, interval=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def sanitizer(binary=CKPTFS):
    """"address" or "thread" when `binary` is built with that sanitizer (scripts/sanitize.sh),
    else None: its runtime's init symbol is in the file, linked in or imported."""
    import mmap
    with open(binary, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        for symbol, name in ((b"__asan_init", "address"), (b"__tsan_init", "thread")):
            if m.find(symbol) >= 0:
                return name
    return None


def run(args, check=True, timeout=300, **kwargs):
    """Runs a command, capturing text output; raises with the output on failure."""
    p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=timeout, **kwargs)
    if check and p.returncode != 0:
        raise AssertionError("%s exited %d\nstdout: %s\nstderr: %s"
                             % (" ".join(args), p.returncode, p.stdout, p.stderr))
    return p


def ckptfs(*args, check=True, timeout=300):
    return run([CKPTFS] + [str(a) for a in args], check=check, timeout=timeout)


def store_stats(store):
    """`ckptfs stats STORE` as a dict of its counters: {"pack bytes": int, "contents": int, ...}.
    On a mounted store the daemon's lines follow (latencies in us, CPU seconds): only lines that
    end in a whole number are counters."""
    out = ckptfs("stats", store).stdout
    stats = {}
    for line in out.splitlines():
        key, _, value = line.rpartition(" ")
        key = key.strip()
        if key and key != "stored/logical" and value.isdigit():
            stats[key] = int(value)
    return stats


def passthrough_opens(mnt):
    """Handles the mount at `mnt` has opened with FUSE passthrough (fs/passthrough.h)."""
    import json
    with open(os.path.join(mnt, ".ckptfs", "stats")) as f:
        return json.load(f).get("passthrough", {}).get("opens", 0)


def force_unmount(mountpoint, pid=None):
    """Detaches a mount whatever its state (lazy) and kills its daemon if it still runs."""
    if is_mounted(mountpoint):
        run(["fusermount3", "-u", "-z", mountpoint], check=False, timeout=60)
    if pid and pid_alive(pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        wait_until(lambda: not pid_alive(pid), 30)


def assert_same_objects(test, expected, actual, where="checkpoint"):
    """Deep equality of what torch.load returns: tensors bitwise (dtype, shape and bits)."""
    import torch  # only the torch tests call this
    if isinstance(expected, torch.Tensor):
        test.assertIsInstance(actual, torch.Tensor, where)
        test.assertEqual((expected.dtype, tuple(expected.shape)),
                         (actual.dtype, tuple(actual.shape)), where)
        if expected.is_floating_point() and expected.element_size() in (2, 4, 8):
            bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[expected.element_size()]
            same = torch.equal(expected.contiguous().view(bits), actual.contiguous().view(bits))
        else:
            same = torch.equal(expected, actual)
        test.assertTrue(same, where + ": tensor differs")
    elif isinstance(expected, dict):
        test.assertIsInstance(actual, dict, where)
        test.assertEqual(list(expected.keys()), list(actual.keys()), where)
        for k in expected:
            assert_same_objects(test, expected[k], actual[k], "%s[%r]" % (where, k))
    elif isinstance(expected, (list, tuple)):
        test.assertEqual((type(expected), len(expected)), (type(actual), len(actual)), where)
        for i, (e, a) in enumerate(zip(expected, actual)):
            assert_same_objects(test, e, a, "%s[%d]" % (where, i))
    else:
        test.assertEqual(expected, actual, where)


# ---- The temporary root and its guard -------------------------------------------------------

_root = None
_guard_pipe = None


def ci_trajectory(test_class, prefix):
    """Generates the real fp32 training trajectory of scripts/gen_trajectory.py --size ci
    (model + Adam, DeepSpeed layout) under a temporary directory removed after the class;
    returns (its directory, its global_stepN names in step order)."""
    root = tempfile.mkdtemp(prefix=prefix, dir=root_dir())
    test_class.addClassCleanup(shutil.rmtree, root, True)
    out = os.path.join(root, "data")
    source = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    subprocess.run(["/usr/bin/python3", os.path.join(source, "scripts", "gen_trajectory.py"),
                    "--out", out, "--size", "ci", "--trajectories", "fp32"], check=True,
                   stdout=subprocess.DEVNULL, timeout=600)
    src = os.path.join(out, "fp32")
    steps = sorted((d for d in os.listdir(src) if d.startswith("global_step")),
                   key=lambda d: int(d[len("global_step"):]))
    return src, steps


def root_dir():
    """This process's temporary root (created on first use, guarded, removed at exit)."""
    global _root, _guard_pipe
    if _root is None:
        _root = tempfile.mkdtemp(prefix=ROOT_PREFIX)
        read_end, _guard_pipe = os.pipe()
        # The guard detaches (new session, then a second fork inside) so that killing this
        # process and its children does not kill it; it waits for EOF on the pipe.
        subprocess.run([sys.executable, os.path.abspath(__file__), "--guard", _root],
                       stdin=read_end, check=True, start_new_session=True)
        os.close(read_end)
        atexit.register(_remove_root)
    return _root


def _daemon_pid_file(mountpoint):
    return mountpoint.rstrip("/") + ".daemon-pid"


def cleanup_root(root):
    """Unmounts every ckptfs mount under `root`, kills their daemons, removes `root`."""
    root = os.path.realpath(root)
    for point in mounted_points():
        if point == root or point.startswith(root + "/"):
            pid = None
            try:
                with open(_daemon_pid_file(point)) as f:
                    pid = int(f.read())
            except (OSError, ValueError):
                pass
            force_unmount(point, pid)
    for name in os.listdir(root) if os.path.isdir(root) else []:
        if name.endswith(".daemon-pid"):
            try:
                with open(os.path.join(root, name)) as f:
                    force_unmount(os.path.join(root, name[:-len(".daemon-pid")]), int(f.read()))
            except (OSError, ValueError):
                pass
    # Other filesystems a test mounted there (a small loop-device disk), deepest first.
    with open("/proc/self/mountinfo") as f:
        others = [line.split(" ")[4].replace("\\040", " ") for line in f]
    for point in sorted((p for p in others if p.startswith(root + "/")), reverse=True):
        run(["umount", "-l", point], check=False, timeout=60)
    shutil.rmtree(root, ignore_errors=True)


def _remove_root():
    if _root is not None:
        cleanup_root(_root)


def _guard_main(root):
    if os.fork() != 0:
        os._exit(0)
    # stdin is the pipe; its other end stays open while the test process lives.
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    while os.read(0, 4096):
        pass
    cleanup_root(root)


# ---- Mounts -----------------------------------------------------------------------------------

class Mount:
    """A store and a mountpoint under the temporary root; `ckptfs mount` of one on the other."""

    def __init__(self, name="m", options=()):
        base = tempfile.mkdtemp(prefix=name + "-", dir=root_dir())
        self.store = os.path.join(base, "store")
        self.mnt = os.path.join(base, "mnt")
        os.mkdir(self.mnt)
        self.options = [str(o) for o in options]
        self.pid = None

    def mount(self, options=None):
        assert not is_mounted(self.mnt), self.mnt + " is already mounted"
        if options is not None:
            self.options = [str(o) for o in options]
        try:
            # The first mount makes the store (`ckptfs mount` refuses a missing one otherwise).
            create = [] if os.path.exists(os.path.join(self.store, "ckptfs.json")) else ["--create"]
            ckptfs("mount", self.store, self.mnt, *create, *self.options, timeout=60)
            self.pid = int(os.getxattr(self.mnt, "user.ckptfs.pid"))
            with open(_daemon_pid_file(self.mnt), "w") as f:
                f.write(str(self.pid))
        except BaseException:
            self.close()
            raise
        return self

    def umount(self):
        """The clean way: `ckptfs umount` (syncs, unmounts, waits for the daemon)."""
        ckptfs("umount", self.mnt, timeout=120)
        assert not is_mounted(self.mnt), self.mnt + " is still mounted after ckptfs umount"
        assert not (self.pid and pid_alive(self.pid)), "daemon still runs after ckptfs umount"
        self.pid = None

    def remount(self, options=None):
        self.umount()
        return self.mount(options)

    def kill_daemon(self):
        """SIGKILLs the daemon (a crash) and detaches the dead mount."""
        pid = int(os.getxattr(self.mnt, "user.ckptfs.pid"))
        os.kill(pid, signal.SIGKILL)
        assert wait_until(lambda: not pid_alive(pid), 30), "daemon survived SIGKILL"
        force_unmount(self.mnt)
        self.pid = None

    def close(self):
        """Always leaves nothing behind: umount, else lazy fusermount3 -u -z, else SIGKILL."""
        if is_mounted(self.mnt):
            try:
                ckptfs("umount", self.mnt, check=False, timeout=120)
            except subprocess.TimeoutExpired:
                pass
        force_unmount(self.mnt, self.pid)
        self.pid = None

    def stats(self):
        return store_stats(self.store)

    def path(self, *parts):
        return os.path.join(self.mnt, *parts)

    def __enter__(self):
        return self.mount()

    def __exit__(self, *exc):
        self.close()
        return False


class MountedTestCase(unittest.TestCase):
    """A store mounted at self.mnt; always unmounted afterwards.

    One mount per test, or one per class when share_mount is set (then each test should work
    in its own version directory, e.g. self.version_dir()).
    """

    mount_options = ["--seal-after", "0"]
    share_mount = False

    @classmethod
    def setUpClass(cls):
        cls.m = None
        if cls.share_mount:
            cls.m = Mount(cls.__name__[:40], cls.mount_options)
            cls.addClassCleanup(cls.m.close)
            cls.m.mount()

    def setUp(self):
        if not self.share_mount:
            self.m = self.new_mount(self.mount_options)
        elif not is_mounted(self.m.mnt):  # an earlier test failed half-way through a remount
            self.m.close()
            self.m.mount()

    def new_mount(self, options=(), name=None):
        m = Mount(name or self.id().rsplit(".", 1)[-1][:40], options)
        self.addCleanup(m.close)
        return m.mount()

    @property
    def mnt(self):
        return self.m.mnt

    @property
    def store(self):
        return self.m.store

    def remount(self, options=None):
        self.m.remount(options)

    def version_dir(self, name=None):
        """A new version (top-level directory) named after the test."""
        path = self.m.path(name or self.id().rsplit(".", 1)[-1])
        os.mkdir(path)
        return path

    def assertErrno(self, err, fn, *args, **kwargs):
        with self.assertRaises(OSError) as cm:
            fn(*args, **kwargs)
        self.assertEqual(cm.exception.errno, err, "expected %s, got %r"
                         % (errno.errorcode[err], cm.exception))


SKIP = 77  # CTest's SKIP_RETURN_CODE for these tests


def skip_all(why):
    print("SKIPPED: " + why, file=sys.stderr)
    sys.exit(SKIP)


def check_prerequisites():
    if os.geteuid() != 0:
        skip_all("mounting needs root")
    if not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None:
        skip_all("needs /dev/fuse and fusermount3")
    if not os.access(CKPTFS, os.X_OK):
        raise SystemExit("no ckptfs binary at %s (set CKPTFS)" % CKPTFS)


def main():
    """unittest.main(), then a check that no mount of ours survived."""
    check_prerequisites()
    prog = unittest.main(exit=False, verbosity=2)
    left = [p for p in mounted_points() if _root and p.startswith(os.path.realpath(_root))]
    _remove_root()
    if left:
        print("LEFT MOUNTED (now forcibly removed): %s" % left, file=sys.stderr)
    sys.exit(0 if prog.result.wasSuccessful() and not left else 1)


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--guard":
    _guard_main(sys.argv[2])
