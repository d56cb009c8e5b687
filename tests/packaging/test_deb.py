"""The Debian package, as a user gets it (issue 17; packaging/README.md).

Builds the .deb from the built tree (packaging/build-deb.sh), installs it on this machine with
dpkg -i, and then uses the installed files only, with a bare environment (no PYTHONPATH, no
CKPTFS_* variables, PATH of the system directories):
  - `ckptfs --version` is VERSION's;
  - `mount -t fuse.ckptfs STORE MNT -o cache_size=...,codec=...` mounts with those settings,
    a bad option fails the mount;
  - torch.save into the mount, torch.load back bitwise (from Debian's /usr/bin/python3);
  - `import ckptfs; ckptfs.snapshot(...)` finds the installed library, the version matches;
  - `umount MNT`, then the daemon commits and exits: everything saved reads back after
  - an fstab line (in a temporary fstab file: mount --fstab) mounted by `mount MNT`;
  - `man ckptfs`, the bash completion;
  - the systemd unit: `systemd-analyze verify`, and its ExecStart run as systemd would, with a
    fake NOTIFY_SOCKET: READY=1 arrives when the mount serves, SIGTERM stops it cleanly
    (exit 0, unmounted, nothing lost); where systemd runs, also systemctl start/stop of it;
  - pip installs ./python (into a temporary target) with the binary's version and the library;
  - dpkg --purge leaves no file behind.
Everything is undone however the test ends: mounts, the package, temporary files.
Exit 0 passed, 1 failed, 77 skipped (not root, no /dev/fuse).
"""
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

SOURCE = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BUILD = os.path.abspath(os.environ.get("CKPTFS_BUILD_DIR") or os.path.join(SOURCE, "build"))
PYTHON = "/usr/bin/python3"
# What a shell of root has with nothing set up: the installed files only.
BARE_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8"}
PACKAGE = "ckptfs"
VERSION = open(os.path.join(SOURCE, "VERSION")).read().strip()
LOCK = "/run/lock/ckptfs-packaging-test.lock"


class Failure(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Failure(what)
    print("ok:", what, flush=True)


def run(cmd, env=None, check_rc=True, timeout=300, **kw):
    p = subprocess.run(cmd, env=BARE_ENV if env is None else env, capture_output=True,
                       text=True, timeout=timeout, **kw)
    if check_rc and p.returncode != 0:
        raise Failure("%s exited %d\nstdout: %s\nstderr: %s" %
                      (" ".join(cmd), p.returncode, p.stdout[-3000:], p.stderr[-3000:]))
    return p


def mount_entry(mnt):
    """(fstype, source, super options) of the mount at `mnt`, or None."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            if left.split(" ")[4] == mnt:
                fstype, source, opts = right.split(" ")[:3]
                return fstype, source, opts.strip()
    return None


def daemon_pid(mnt):
    return int(os.getxattr(mnt, "user.ckptfs.pid").decode())


def exited(pid):
    """True once `pid` has exited (a zombie counts: the daemon is reparented to init)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rpartition(")")[2].split()[0] == "Z"
    except FileNotFoundError:
        return True


def wait_exit(pid, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if exited(pid):
            return
        time.sleep(0.05)
    raise Failure("daemon %d still running %d s after unmount" % (pid, timeout))


def log_tail(store):
    with open(os.path.join(store, "ckptfs.log")) as f:
        return f.read()


def dpkg_locked(stderr):
    return "lock" in stderr and ("dpkg" in stderr or "frontend" in stderr)


def dpkg(*args):
    """dpkg, waiting while another dpkg or apt holds its lock."""
    for _ in range(120):
        p = run(["dpkg"] + list(args), check_rc=False)
        if p.returncode == 0 or not dpkg_locked(p.stderr):
            break
        time.sleep(1)
    if p.returncode != 0:
        raise Failure("dpkg %s exited %d: %s" % (" ".join(args), p.returncode, p.stderr[-2000:]))
    return p


def installed():
    p = run(["dpkg-query", "-W", "-f=${Status}", PACKAGE], check_rc=False)
    return p.returncode == 0 and "installed" in p.stdout and "not-installed" not in p.stdout


class Footprint:
    """What of the package's directories exists, to compare before install and after purge.
    For the directories the package creates: whether they exist. For the directories it shares
    with the system (/usr/bin, dist-packages, ...): their entries named like the package, so
    that others installing software meanwhile do not count."""

    def __init__(self, deb):
        paths = run(["dpkg-deb", "-c", deb]).stdout.splitlines()
        self.paths = []
        for line in paths:
            p = os.path.normpath(line.split(None, 5)[5].split(" -> ")[0].lstrip("."))
            self.paths.append(p)
        dirs = set()
        for p in self.paths:
            d = os.path.dirname(p)
            while d != "/":
                dirs.add(d)
                d = os.path.dirname(d)
        self.dirs = sorted(dirs)
        self.extra = ["/etc/ckptfs", "/var/lib/ckptfs", "/usr/lib/python3/dist-packages",
                      "/usr/local/lib/python3.%d/dist-packages" % sys.version_info[1]]

    def snapshot(self):
        state = {}
        for d in self.dirs + self.extra:
            if os.path.isdir(d):
                state[d] = sorted(e for e in os.listdir(d) if PACKAGE in e)
            else:
                state[d] = None
        state["dpkg-info"] = sorted(e for e in os.listdir("/var/lib/dpkg/info")
                                    if e.startswith(PACKAGE + ".") or e.startswith(PACKAGE + ":"))
        return state


def build_deb(out):
    p = run([os.path.join(SOURCE, "packaging", "build-deb.sh"), BUILD, out], env=dict(os.environ))
    deb = p.stdout.strip().splitlines()[-1]
    check(os.path.exists(deb) and os.path.basename(deb) == "ckptfs_%s_%s.deb" % (
        VERSION, run(["dpkg", "--print-architecture"]).stdout.strip()), "built " + deb)
    info = run(["dpkg-deb", "-f", deb, "Depends"]).stdout
    # Declared from the shared libraries the binary and the library link (dpkg-shlibdeps).
    for lib in ("libfuse3-3", "liblmdb0", "libzstd1", "liburing2", "libc6"):
        check(lib in info, "Depends names %s (dpkg-shlibdeps)" % lib)
    return deb


def test_version():
    p = run(["ckptfs", "--version"])
    check(p.stdout.strip().startswith("ckptfs %s (store format " % VERSION),
          "ckptfs --version says ckptfs %s (store format N)" % VERSION)
    check(shutil.which("ckptfs", path=BARE_ENV["PATH"]) == "/usr/bin/ckptfs",
          "ckptfs is /usr/bin/ckptfs")


SAVE = r"""
import hashlib, sys, torch
torch.manual_seed(7)
state = {"model": {"w%d" % i: torch.randn(256, 1024) for i in range(8)},
         "step": 1234, "opt": {"m": torch.randn(4096) * 1e-3}}
path, native = sys.argv[1], sys.argv[2]  # the same name in the mount and on a native disk
torch.save(state, path)
torch.save(state, native)
with open(path, "rb") as f, open(native, "rb") as g:
    data = f.read()
    assert data == g.read(), "the mount's bytes differ from the native file's"
back = torch.load(path)
assert back["step"] == 1234
for k, v in state["model"].items():
    assert torch.equal(back["model"][k], v), k
    assert back["model"][k].numpy().tobytes() == v.numpy().tobytes(), k
assert torch.equal(back["opt"]["m"], state["opt"]["m"])
print(hashlib.sha256(data).hexdigest())
"""

SNAPSHOT = r"""
import os, sys, torch
import ckptfs
mod = sys.modules["ckptfs.snapshot"]
print("file", ckptfs.__file__)
print("version", ckptfs.__version__)
from importlib.metadata import version
print("metadata", version("ckptfs"))
print("library", mod._find_library())
torch.manual_seed(3)
sd = {"layer.weight": torch.randn(512, 256), "layer.bias": torch.randn(512)}
h = ckptfs.snapshot(sd, sys.argv[1], rank=0, world_size=1)
h.wait()
back = ckptfs.load_sharded(sys.argv[1], 0, 1)
for k, v in sd.items():
    assert torch.equal(back[k], v), k
print("snapshot ok", sorted(os.listdir(sys.argv[1])))
"""

READ = r"""
import hashlib, sys, torch
with open(sys.argv[1], "rb") as f:
    print(hashlib.sha256(f.read()).hexdigest())
torch.load(sys.argv[1])
"""


def sha256(path):
    import hashlib
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def test_mount_torch_snapshot_umount(root):
    store, mnt = os.path.join(root, "store"), os.path.join(root, "mnt")
    os.makedirs(mnt)
    bad = run(["mount", "-t", "fuse.ckptfs", store, mnt, "-o", "cache_size=lots"],
              check_rc=False)
    check(bad.returncode != 0 and mount_entry(mnt) is None and "lots" in bad.stderr,
          "mount -o cache_size=lots fails, naming the option")
    run(["mount", "-t", "fuse.ckptfs", store, mnt, "-o",
         "create,cache_size=64M,inflight=32M,codec=zstd:3,seal_after=0,allow_other,nofail"])
    entry = mount_entry(mnt)
    check(entry is not None and entry[0] == "fuse.ckptfs" and "allow_other" in entry[2],
          "mount -t fuse.ckptfs mounted %s with allow_other: %s" % (mnt, entry))
    check("(cache 64 MiB, inflight 32 MiB, codec zstd:3," in log_tail(store),
          "the daemon runs with the -o settings (cache 64M, inflight 32M, zstd:3)")

    ckpt = os.path.join(mnt, "global_step1", "model.pt")
    os.makedirs(os.path.dirname(ckpt))
    native = os.path.join(root, "native", "model.pt")
    os.makedirs(os.path.dirname(native))
    digest = run([PYTHON, "-c", SAVE, ckpt, native]).stdout.split()[-1]
    check(sha256(ckpt) == digest, "torch.save into the mount, torch.load back bitwise")

    p = run([PYTHON, "-c", SNAPSHOT, os.path.join(mnt, "snap1")])
    out = dict(line.split(" ", 1) for line in p.stdout.splitlines())
    check(out["file"] == "/usr/lib/python3/dist-packages/ckptfs/__init__.py",
          "import ckptfs from /usr/bin/python3 without variables finds the installed package")
    check(out["version"] == VERSION and out["metadata"] == VERSION,
          "ckptfs.__version__ and its metadata are the binary's (%s)" % VERSION)
    check(out["library"].endswith("/libckptfs_snapshot.so") and
          out["library"].startswith("/usr/lib/"), "it loads the installed library " +
          out["library"])
    check(out.get("snapshot", "").startswith("ok"), "ckptfs.snapshot(...) saved, load_sharded read it back equal")

    pid = daemon_pid(mnt)
    run(["umount", mnt])
    check(mount_entry(mnt) is None, "umount " + mnt)
    wait_exit(pid)
    check("store %s closed" % store in log_tail(store), "after umount the daemon committed "
          "and closed the store")
    return store, mnt, digest


def test_fstab_mount(root, store, mnt, digest):
    fstab = os.path.join(root, "fstab")
    with open(fstab, "w") as f:
        f.write("# a temporary fstab (mount --fstab): /etc/fstab is not touched\n")
        # The source in fuse3's spelling, TYPE#SOURCE, which the helper accepts too.
        f.write("ckptfs#%s %s fuse.ckptfs cache_size=32M,codec=lz4,noauto,nofail,"
                "x-systemd.after=network-online.target 0 0\n" % (store, mnt))
    run(["mount", "--fstab", fstab, mnt])
    entry = mount_entry(mnt)
    check(entry is not None and entry[0] == "fuse.ckptfs" and entry[1] == "ckptfs:" + store,
          "mount MNT mounted the fstab line (source ckptfs#STORE) of %s" % store)
    check("(cache 32 MiB, inflight 256 MiB, codec lz4," in log_tail(store),
          "with the fstab line's options (cache 32M, lz4)")
    ckpt = os.path.join(mnt, "global_step1", "model.pt")
    p = run([PYTHON, "-c", READ, ckpt])
    check(p.stdout.split()[0] == digest,
          "what was saved before umount reads back bitwise after it (nothing lost)")
    check(os.path.exists(os.path.join(mnt, "snap1", "manifest.json")),
          "the snapshot version survived the umount")
    pid = daemon_pid(mnt)
    run(["ckptfs", "umount", mnt])
    check(mount_entry(mnt) is None and exited(pid),
          "ckptfs umount returns once the daemon has finished")


def test_man_and_completion():
    p = run(["man", "-P", "cat", "ckptfs"], env=dict(BARE_ENV, MANWIDTH="100"))
    check("MOUNT OPTIONS" in p.stdout and "cache_size=" in p.stdout and VERSION in p.stdout,
          "man ckptfs shows the page (version, mount options)")
    script = ("source /usr/share/bash-completion/completions/ckptfs; "
              "COMP_WORDS=(ckptfs mo); COMP_CWORD=1; _ckptfs; echo \"${COMPREPLY[*]}\"; "
              "COMP_WORDS=(ckptfs mount --cod); COMP_CWORD=2; _ckptfs; echo \"${COMPREPLY[*]}\"")
    out = run(["bash", "-c", script]).stdout.splitlines()
    check(out == ["mount", "--codec"], "bash completion completes subcommands and options")


def find_unit():
    for d in ("/usr/lib/systemd/system", "/lib/systemd/system"):
        path = os.path.join(d, "ckptfs@.service")
        if os.path.exists(path):
            return path
    raise Failure("ckptfs@.service not installed")


def unit_exec(unit, key):
    with open(unit) as f:
        for line in f:
            if line.startswith(key + "="):
                return line.split("=", 1)[1].strip()
    raise Failure("%s has no %s=" % (unit, key))


def test_systemd_unit(root):
    unit = find_unit()
    if shutil.which("systemd-analyze"):
        # An instance of the template, as systemctl would load it; its EnvironmentFile is the
        # user's and may be missing here, which verify does not check.
        inst = os.path.join(root, "ckptfs@tmp-ckptfs\\x2dunit.service")
        shutil.copy(unit, inst)
        p = run(["systemd-analyze", "verify", "--man=no", inst], check_rc=False)
        problems = [l for l in (p.stdout + p.stderr).splitlines()
                    if "ckptfs" in l and "Failed to" not in l.split(":", 1)[0]]
        check(p.returncode == 0 and not problems,
              "systemd-analyze verify ckptfs@.service: %s" % (p.stdout + p.stderr).strip())
    else:
        print("systemd-analyze not installed: unit not verified", flush=True)

    # No systemd runs here: run the unit's commands as systemd would for ckptfs@<mnt>.
    store, mnt = os.path.join(root, "unit-store"), os.path.join(root, "unit-mnt")
    conf = {"CKPTFS_STORE": store, "CKPTFS_OPTIONS": "create,cache_size=48M,codec=zstd"}
    check(unit_exec(unit, "Type") == "notify", "the unit is Type=notify")

    def expand(cmdline):
        words = []
        for w in cmdline.split():
            w = w.replace("%f", mnt)
            for k, v in conf.items():
                w = w.replace("${%s}" % k, v)
            words.append(w)
        return words

    run(expand(unit_exec(unit, "ExecStartPre")))
    check(os.path.isdir(mnt), "ExecStartPre made the mount point")
    sock_path = os.path.join(root, "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(sock_path)
    sock.settimeout(60)
    argv = expand(unit_exec(unit, "ExecStart"))
    check("--foreground" in argv, "ExecStart runs the daemon in the foreground: " + " ".join(argv))
    daemon = subprocess.Popen(argv, env=dict(BARE_ENV, NOTIFY_SOCKET=sock_path),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        msg = sock.recv(4096).decode()
        check("READY=1" in msg.split("\n"), "READY=1 on NOTIFY_SOCKET: %r" % msg)
        check(mount_entry(mnt) is not None and daemon.poll() is None,
              "the mount serves when READY=1 arrives, the daemon stays in the foreground")
        payload = os.urandom(3 << 20)
        with open(os.path.join(mnt, "f.bin"), "wb") as f:
            f.write(payload)
        daemon.send_signal(signal.SIGTERM)
        rc = daemon.wait(timeout=120)
        err = daemon.stderr.read()
        msg = sock.recv(4096).decode()
        check("STOPPING=1" in msg.split("\n"), "STOPPING=1 on SIGTERM")
        check(rc == 0, "SIGTERM stops the daemon cleanly (exit %d)%s" % (rc, "" if rc == 0 else
                                                                          ": " + err[-2000:]))
        check(mount_entry(mnt) is None, "and it unmounted")
        check("cache 48 MiB" in err and "codec zstd" in err, "with the conf file's options")
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
        sock.close()
    run(["ckptfs", "mount", store, mnt])
    with open(os.path.join(mnt, "f.bin"), "rb") as f:
        check(f.read() == payload, "the file written before SIGTERM reads back")
    run(["ckptfs", "umount", mnt])


def test_unit_under_systemd(root):
    """Where systemd runs (PID 1): the unit started and stopped by systemd itself."""
    store, mnt = os.path.join(root, "sd-store"), os.path.join(root, "sd-mnt")
    inst = run(["systemd-escape", "--path", mnt]).stdout.strip()
    unit = "ckptfs@%s.service" % inst
    made_etc = not os.path.isdir("/etc/ckptfs")
    conf = "/etc/ckptfs/%s.conf" % inst
    os.makedirs("/etc/ckptfs", exist_ok=True)
    try:
        with open(conf, "w") as f:
            f.write("CKPTFS_STORE=%s\nCKPTFS_OPTIONS=create,cache_size=32M\n" % store)
        run(["systemctl", "daemon-reload"])
        run(["systemctl", "start", unit])  # Type=notify: returns once READY=1 arrived
        check(mount_entry(mnt) is not None, "systemctl start %s returned with the mount "
              "serving" % unit)
        payload = os.urandom(1 << 20)
        with open(os.path.join(mnt, "f.bin"), "wb") as f:
            f.write(payload)
        run(["systemctl", "stop", unit])
        result = run(["systemctl", "show", "-p", "Result", "--value", unit]).stdout.strip()
        check(mount_entry(mnt) is None and result == "success",
              "systemctl stop unmounted cleanly (Result=%s)" % result)
        run(["ckptfs", "mount", store, mnt])
        with open(os.path.join(mnt, "f.bin"), "rb") as f:
            check(f.read() == payload, "the file written under systemd reads back")
        run(["ckptfs", "umount", mnt])
    finally:
        subprocess.run(["systemctl", "stop", unit], capture_output=True)
        subprocess.run(["systemctl", "reset-failed", unit], capture_output=True)
        os.remove(conf)
        if made_etc:
            os.rmdir("/etc/ckptfs")
        subprocess.run(["systemctl", "daemon-reload"], capture_output=True)


def test_pip(root):
    # pip builds in the source tree it is given: build from a copy (VERSION link resolved).
    src = os.path.join(root, "python-src")
    shutil.copytree(os.path.join(SOURCE, "python"), src, symlinks=False,
                    ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    target = os.path.join(root, "pip-target")
    env = dict(BARE_ENV, CKPTFS_SNAPSHOT_LIB=os.path.join(BUILD, "libckptfs_snapshot.so"),
               PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    run([PYTHON, "-m", "pip", "install", "--no-build-isolation", "--no-deps",
         "--break-system-packages", "--target", target, src], env=env)
    code = ("import sys, ckptfs; from importlib.metadata import version; "
            "print(ckptfs.__file__, ckptfs.__version__, version('ckptfs'), "
            "sys.modules['ckptfs.snapshot']._find_library())")
    out = run([PYTHON, "-c", code], env=dict(BARE_ENV, PYTHONPATH=target)).stdout.split()
    check(out[0].startswith(target) and out[1] == VERSION and out[2] == VERSION,
          "pip install ./python: version %s as the binary's" % out[2])
    check(out[3] == os.path.join(target, "ckptfs", "libckptfs_snapshot.so"),
          "the pip-installed package carries libckptfs_snapshot.so")


def cleanup_mounts(root):
    with open("/proc/self/mountinfo") as f:
        points = [l.split(" ")[4] for l in f if l.split(" ")[4].startswith(root)]
    for p in points:
        subprocess.run(["fusermount3", "-u", "-z", p], capture_output=True)


def main():
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        print("skipped: needs root and /dev/fuse")
        return 77
    for tool in ("dpkg", "cpack", "help2man", "dpkg-shlibdeps"):
        if not shutil.which(tool):
            print("FAIL: %s is missing (scripts/setup.sh installs it)" % tool)
            return 1
    os.makedirs(os.path.dirname(LOCK), exist_ok=True)
    lock = open(LOCK, "w")
    fcntl.flock(lock, fcntl.LOCK_EX)  # one run on this machine at a time (it installs)
    root = tempfile.mkdtemp(prefix="ckptfs-debtest-")
    package_installed = False
    footprint = before = None
    try:
        if installed():
            print("note: purging a ckptfs package left installed", flush=True)
            dpkg("--purge", PACKAGE)
        deb = build_deb(os.path.join(root, "out"))
        footprint = Footprint(deb)
        before = footprint.snapshot()
        package_installed = True
        dpkg("-i", deb)
        check(installed(), "dpkg -i installed the package")
        test_version()
        store, mnt, digest = test_mount_torch_snapshot_umount(root)
        test_fstab_mount(root, store, mnt, digest)
        test_man_and_completion()
        test_systemd_unit(root)
        if os.path.isdir("/run/systemd/system"):
            test_unit_under_systemd(root)
        else:
            print("no systemd running here: the unit's command was run directly", flush=True)
        test_pip(root)
        dpkg("--purge", PACKAGE)
        package_installed = False
        check(not installed(), "dpkg --purge removed the package")
        after = footprint.snapshot()
        left = {k: (before[k], after[k]) for k in before if before[k] != after[k]}
        check(not left, "no file left behind by the package: %s" % left)
        dirs = set(footprint.dirs)
        files_left = [p for p in footprint.paths if p not in dirs and os.path.lexists(p)]
        check(not files_left, "every file of the package is gone: %s" % files_left)
        print("PASS")
        return 0
    except Failure as e:
        print("FAIL:", e, flush=True)
        return 1
    finally:
        cleanup_mounts(root)
        if package_installed and installed():
            subprocess.run(["dpkg", "--purge", PACKAGE], capture_output=True)
        if before is not None:  # what a failed removal left of the package's own directories
            for d in reversed(footprint.dirs):
                if before[d] is None and os.path.isdir(d):
                    shutil.rmtree(d, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
