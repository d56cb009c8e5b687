#!/usr/bin/env python3
"""A one-node Ceph 16.2 cluster with an S3 endpoint (radosgw), for tests and benchmarks.

Everything lives under one directory the caller names: configuration, keyrings, run dir and admin
sockets, logs, the monitor's store. The OSD keeps its objects in RAM (memstore, bounded by
`memstore device bytes`). Every daemon listens on 127.0.0.1 only, runs in the foreground (-f)
and is a child of this process, which stops and reaps it.

    from ceph_fixture import CephCluster
    with CephCluster("/tmp/s3-x") as ceph:      # start() ... stop(), however the block ends
        ceph.endpoint, ceph.access_key, ceph.secret_key, ceph.env()   # env(): AWS_* variables

As a command (the daemons then outlive it; `stop` reads their ids from DIR/daemons.json):

    tests/s3/ceph_fixture.py start DIR     # prints endpoint=..., access_key=..., secret_key=...
    tests/s3/ceph_fixture.py stop DIR

A fixture object owned by a test (owned=True, the default) also makes the kernel kill its daemons
if the test process dies without stopping them (PR_SET_PDEATHSIG), so a CTest timeout leaves no
daemon behind. Start-up takes ~4 s on 2 cores, mostly the OSD's first peering and radosgw
creating its pools; `paxos propose interval = 0.1` matters (the default 1 s makes it ~14 s).
"""
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid

DAEMONS = ("ceph-mon", "ceph-mgr", "ceph-osd", "radosgw")
# Stop order: the gateway first (it holds sessions to the OSD), then the OSD, then mgr and mon.
STOP_ORDER = ("rgw", "osd", "mgr", "mon")
MEMSTORE_BYTES = 1 << 30
START_TIMEOUT_S = 60.0


def installed():
    """True when the Ceph daemons and tools this fixture runs are on PATH."""
    return all(shutil.which(b) for b in DAEMONS + ("ceph", "ceph-authtool", "monmaptool",
                                                   "radosgw-admin"))


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_listening(port):
    """True when something on this machine listens on TCP `port` (from /proc/net/tcp{,6})."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    cols = line.split()
                    if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                        return True
        except OSError:
            pass
    return False


CEPH_PROGRAMS = DAEMONS + ("ceph", "radosgw-admin", "ceph-authtool", "monmaptool")


def processes_under(directory):
    """Pids of live Ceph processes (daemons and tools) whose command line names `directory`."""
    needle = os.path.realpath(directory).encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open("/proc/%s/cmdline" % entry, "rb") as f:
                cmdline = f.read()
            with open("/proc/%s/stat" % entry) as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        argv = cmdline.split(b"\0")
        programs = [os.path.basename(a).decode(errors="replace") for a in argv[:2]]
        if needle in cmdline and state != "Z" and any(p in CEPH_PROGRAMS for p in programs):
            pids.append(int(entry))
    return pids


def _die_with_parent():
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    os.setpgrp()


class CephCluster:
    def __init__(self, directory, owned=True, memstore_bytes=MEMSTORE_BYTES):
        self.dir = os.path.realpath(directory)
        self.owned = owned
        self.memstore_bytes = memstore_bytes
        self.conf = os.path.join(self.dir, "ceph.conf")
        self.procs = {}  # role -> Popen (this process's children)
        self.endpoint = self.access_key = self.secret_key = None
        self.mon_port = self.rgw_port = None

    # ---------------------------------------------------------------- public
    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def env(self):
        """The variables an S3 client (ours, boto3, the aws command) reads."""
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key,
                "AWS_ENDPOINT_URL": self.endpoint, "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_REGION": "us-east-1"}

    def start(self):
        if os.path.exists(self.dir) and os.listdir(self.dir):
            raise RuntimeError("%s is not empty: a fixture starts from nothing" % self.dir)
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def stop(self):
        """Stops every daemon (radosgw, OSD, mgr, mon), reaps it, and waits until its ports close.
        Safe to call twice and after a failed start."""
        for role in STOP_ORDER:
            proc = self.procs.pop(role, None)
            if proc is not None:
                _terminate(proc)
        for pid_role in _read_pids(self.dir):
            _kill_foreign(*pid_role, directory=self.dir)
        for pid in processes_under(self.dir):  # e.g. a ceph command a failed start left
            _kill_foreign(pid, "stray", directory=self.dir)
        for port in (self.rgw_port, self.mon_port):
            if port:
                _wait(lambda p=port: not port_listening(p), 10, "port %d to close" % port)
        try:
            os.unlink(os.path.join(self.dir, "daemons.json"))
        except OSError:
            pass

    # ---------------------------------------------------------------- start-up
    def _start(self):
        for sub in ("run", "log", "mon/a", "mgr/x", "osd/0", "rgw"):
            os.makedirs(os.path.join(self.dir, sub), exist_ok=True)
        self.mon_port, self.rgw_port = free_port(), free_port()
        fsid = str(uuid.uuid4())
        self._write_conf(fsid)
        keyring = os.path.join(self.dir, "keyring")
        self._tool("ceph-authtool", "--create-keyring", keyring, "--gen-key", "-n", "mon.",
                   "--cap", "mon", "allow *")
        self._tool("ceph-authtool", keyring, "--gen-key", "-n", "client.admin",
                   "--cap", "mon", "allow *", "--cap", "osd", "allow *",
                   "--cap", "mgr", "allow *", "--cap", "mds", "allow *")
        monmap = os.path.join(self.dir, "monmap")
        self._tool("monmaptool", "--create", "--fsid", fsid,
                   "--addv", "a", "[v2:127.0.0.1:%d]" % self.mon_port, monmap)
        self._tool("ceph-mon", "-c", self.conf, "--mkfs", "-i", "a", "--monmap", monmap,
                   "--keyring", keyring)
        self._spawn("mon", "ceph-mon", "-f", "-c", self.conf, "-i", "a")

        osd_uuid = str(uuid.uuid4())
        osd_key = self._tool("ceph-authtool", "--gen-print-key").strip()
        secrets = os.path.join(self.dir, "osd/0/secrets.json")
        with open(secrets, "w") as f:
            json.dump({"cephx_secret": osd_key}, f)
        osd_id = self._ceph("osd", "new", osd_uuid, "-i", secrets).strip()
        if osd_id != "0":
            raise RuntimeError("ceph osd new gave id %r, expected 0" % osd_id)
        self._tool("ceph-authtool", "--create-keyring", os.path.join(self.dir, "osd/0/keyring"),
                   "-n", "osd.0", "--add-key", osd_key)
        self._tool("ceph-osd", "-c", self.conf, "-i", "0", "--mkfs", "--osd-uuid", osd_uuid)
        self._spawn("osd", "ceph-osd", "-f", "-c", self.conf, "-i", "0")

        self._ceph("auth", "get-or-create", "mgr.x", "mon", "allow profile mgr", "osd",
                   "allow *", "mds", "allow *", "-o", os.path.join(self.dir, "mgr/x/keyring"))
        self._spawn("mgr", "ceph-mgr", "-f", "-c", self.conf, "-i", "x")

        self._ceph("auth", "get-or-create", "client.rgw", "mon", "allow rw", "osd", "allow rwx",
                   "mgr", "allow rw", "-o", os.path.join(self.dir, "rgw/keyring"))
        self._spawn("rgw", "radosgw", "-f", "-c", self.conf, "-n", "client.rgw",
                    "--keyring", os.path.join(self.dir, "rgw/keyring"))
        self.endpoint = "http://127.0.0.1:%d" % self.rgw_port
        _wait(self._rgw_answers, START_TIMEOUT_S, "radosgw to answer on %s" % self.endpoint,
              self._check_alive)

        self.access_key = "CKPTFS" + uuid.uuid4().hex[:14].upper()
        self.secret_key = uuid.uuid4().hex + uuid.uuid4().hex[:8]
        self._tool("radosgw-admin", "-c", self.conf, "-n", "client.admin", "user", "create",
                   "--uid", "ckptfs", "--display-name", "ckptfs tests",
                   "--access-key", self.access_key, "--secret-key", self.secret_key)
        with open(os.path.join(self.dir, "s3.json"), "w") as f:
            json.dump({"endpoint": self.endpoint, "access_key": self.access_key,
                       "secret_key": self.secret_key}, f)

    def _write_conf(self, fsid):
        d = self.dir
        with open(self.conf, "w") as f:
            f.write(f"""[global]
fsid = {fsid}
mon host = [v2:127.0.0.1:{self.mon_port}]
public addr = 127.0.0.1
ms bind msgr1 = false
ms bind ipv6 = false
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
keyring = {d}/keyring
run dir = {d}/run
admin socket = {d}/run/$name.asok
log file = {d}/log/$name.log
log to stderr = false
err to stderr = true
mon cluster log file = {d}/log/cluster.log
crash dir = {d}/run/crash
exporter sock dir = {d}/run
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false

[mon]
mon data = {d}/mon/$id
paxos propose interval = 0.1
mon data avail warn = 1
mon data avail crit = 0
mon osd full ratio = 0.97

[mgr]
mgr data = {d}/mgr/$id
keyring = {d}/mgr/$id/keyring

[osd]
osd data = {d}/osd/$id
keyring = {d}/osd/$id/keyring
osd objectstore = memstore
memstore device bytes = {self.memstore_bytes}
osd crush update on start = true

[client.rgw]
rgw frontends = beast endpoint=127.0.0.1:{self.rgw_port} tcp_nodelay=1
rgw data = {d}/rgw
rgw dns name = 127.0.0.1
rgw enable usage log = false
rgw gc obj min wait = 10
rgw gc processor period = 10
""")

    def _tool(self, *argv):
        out = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             timeout=60, start_new_session=True)
        if out.returncode != 0:
            raise RuntimeError("%s failed (%d): %s" % (" ".join(argv[:3]), out.returncode,
                                                       out.stderr.strip()[-2000:]))
        return out.stdout

    def _ceph(self, *argv):
        return self._tool("ceph", "-c", self.conf, "-n", "client.admin",
                          "--connect-timeout", "30", *argv)

    def _spawn(self, role, *argv):
        log = open(os.path.join(self.dir, "log", role + ".out"), "ab")
        self.procs[role] = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent if self.owned else os.setpgrp)
        log.close()
        with open(os.path.join(self.dir, "daemons.json"), "w") as f:
            json.dump({r: p.pid for r, p in self.procs.items()}, f)

    def _check_alive(self):
        for role, proc in self.procs.items():
            if proc.poll() is not None:
                raise RuntimeError("ceph %s exited with %d during start-up; see %s" % (
                    role, proc.returncode, os.path.join(self.dir, "log")))

    def _rgw_answers(self):
        try:
            with urllib.request.urlopen(self.endpoint + "/", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False


def _wait(predicate, timeout, what, check=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if check:
            check()
        time.sleep(0.05)
    raise RuntimeError("timed out after %.0f s waiting for %s" % (timeout, what))


def _terminate(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _read_pids(directory):
    try:
        with open(os.path.join(directory, "daemons.json")) as f:
            pids = json.load(f)
    except (OSError, ValueError):
        return []
    return [(pids[r], r) for r in STOP_ORDER if r in pids]


def _kill_foreign(pid, role, directory):
    """Stops `pid` (not our child) if its command line still names `directory`."""
    del role
    if pid not in processes_under(directory):
        return
    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if pid not in processes_under(directory):
                return
            time.sleep(0.05)


def _supervise(cluster, ready_fd):
    """The command's harness: starts the cluster, reports on `ready_fd`, then owns and reaps the
    daemons until SIGTERM (sent by `stop`), when it stops them in order and exits."""
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        cluster.start()
        report = {"endpoint": cluster.endpoint, "access_key": cluster.access_key,
                  "secret_key": cluster.secret_key}
    except Exception as e:  # reported to the parent, which prints it
        report = {"error": str(e)}
    os.write(ready_fd, json.dumps(report).encode())
    os.close(ready_fd)
    if "error" in report:
        return 1
    with open(os.path.join(cluster.dir, "supervisor.pid"), "w") as f:
        f.write(str(os.getpid()))
    while not stopping and all(p.poll() is None for p in cluster.procs.values()):
        time.sleep(0.2)
    cluster.stop()
    return 0


def _start_command(directory):
    os.makedirs(directory, exist_ok=True)
    cluster = CephCluster(directory, owned=True)
    t0 = time.monotonic()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os._exit(_supervise(cluster, write_fd))
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as f:
        text = f.read()
    report = json.loads(text) if text else {"error": "the supervisor died during start-up"}
    if "error" in report:
        os.waitpid(pid, 0)
        print("ceph_fixture: %s" % report["error"], file=sys.stderr)
        return 1
    for key in ("endpoint", "access_key", "secret_key"):
        print("%s=%s" % (key, report[key]))
    print("started in %.1f s (stop: %s stop %s)" % (time.monotonic() - t0, sys.argv[0],
                                                    directory), file=sys.stderr)
    return 0


def _stop_command(directory):
    directory = os.path.realpath(directory)
    try:
        with open(os.path.join(directory, "supervisor.pid")) as f:
            supervisor = int(f.read())
        os.kill(supervisor, signal.SIGTERM)
        _wait(lambda: not _alive(supervisor), 30, "the fixture's supervisor to stop")
    except (OSError, ValueError):
        pass
    cluster = CephCluster(directory, owned=False)
    try:
        with open(os.path.join(directory, "s3.json")) as f:
            cluster.rgw_port = int(json.load(f)["endpoint"].rsplit(":", 1)[1])
    except (OSError, ValueError, KeyError):
        pass
    cluster.stop()  # whatever the supervisor left (it was killed, say)
    return 0


def _alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def main(argv):
    if len(argv) != 3 or argv[1] not in ("start", "stop"):
        print("usage: ceph_fixture.py start|stop DIR", file=sys.stderr)
        return 2
    if argv[1] == "stop":
        return _stop_command(argv[2])
    if not installed():
        print("ceph is not installed (scripts/setup.sh installs ceph-mon ceph-mgr ceph-osd "
              "radosgw ceph-common)", file=sys.stderr)
        return 77
    return _start_command(argv[2])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
