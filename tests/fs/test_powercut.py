#!/usr/bin/python3
"""Power loss (issue 15): the store lives on powercut_fs (tests/powercut/powercut_fs.cc), a FUSE
passthrough that keeps written-but-unsynced data apart and drops it at a simulated power cut:
all of it (mode drop), or per file a random subset of the unsynced writes in their order, and
per directory its synced or its current names (mode subset).

Each round: powercut_fs serves the state the last cut left; ckptfs mounts the store on it; the
store must open and every file acknowledged in an earlier round must read back bitwise (and
every version whose seal was acknowledged must still be sealed); then a writer saves versions
(files fsynced, or closed and then `ckptfs sync` or `ckptfs seal`, some versions removed with
rm -rf (retention of about 12 versions), an occasional `ckptfs gc`) until the power is cut at a random moment. Between rounds
`ckptfs verify` of the surviving store must be clean. At the end the store is mounted without
the fixture, checked once more, unmounted and verified.

    CKPTFS_POWERCUT_ROUNDS=N (default 8)  CKPTFS_POWERCUT_SEED=S (default: from the clock)
scripts/powercut.sh ROUNDS runs the long form.
"""
import hashlib
import json
import multiprocessing
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mounted  # noqa: E402
from mounted import MiB  # noqa: E402

POWERCUT_FS = os.path.abspath(os.environ.get("POWERCUT_FS") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "powercut_fs"))
ROUNDS = int(os.environ.get("CKPTFS_POWERCUT_ROUNDS", "8"))
SEED = int(os.environ.get("CKPTFS_POWERCUT_SEED", str(int(time.time()) % 100000)))
KEEP_VERSIONS = 12


def fixture_mounted(path):
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            if (right.split(" ")[0] == "fuse.powercut"
                    and left.split(" ")[4] == os.path.realpath(path)):
                return True
    return False


class PowerCutFs:
    """One powercut_fs process serving `live` at `mnt`; cut() leaves the survivors in `out`."""

    def __init__(self, live, mnt, journal, out, mode, seed):
        self.mnt, self.out = mnt, out
        self.log = open(journal + ".log", "w")
        self.proc = subprocess.Popen(
            [POWERCUT_FS, live, mnt, "--journal", journal, "--out", out, "--mode", mode,
             "--seed", str(seed)], stdout=subprocess.PIPE, stderr=self.log, text=True)
        if not mounted.wait_until(lambda: fixture_mounted(mnt) or self.proc.poll() is not None,
                                  30):
            raise AssertionError("powercut_fs did not mount " + mnt)
        if self.proc.poll() is not None:
            raise AssertionError("powercut_fs exited %d" % self.proc.returncode)

    def cut(self):
        """The power cut: returns powercut_fs's summary (what was kept and lost)."""
        self.proc.send_signal(signal.SIGUSR1)
        out, _ = self.proc.communicate(timeout=120)
        self.close()
        if self.proc.returncode != 0:
            raise AssertionError("powercut_fs exited %d at the cut" % self.proc.returncode)
        return json.loads(out.strip().splitlines()[-1])

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if fixture_mounted(self.mnt):
            mounted.run(["fusermount3", "-u", "-z", self.mnt], check=False, timeout=60)
        self.log.close()


def payload(rng, base):
    """A checkpoint-like file: a slice of `base` (deduplicates across versions) with new bytes."""
    n = rng.randrange(64 << 10, 3 * MiB)
    data = bytearray(base[:n])
    for _ in range(rng.randrange(1, 4)):
        at = rng.randrange(0, n)
        fresh = rng.randbytes(min(n - at, rng.randrange(4096, 256 << 10)))
        data[at:at + len(fresh)] = fresh
    return bytes(data)


def ack(log, kind, *fields):
    log.write(" ".join([kind] + [str(f) for f in fields]) + "\n")
    log.flush()


def writer(mnt, ack_path, round_no, seed):
    """Saves versions until the mount dies; writes what was acknowledged to `ack_path`.

    Lines: "A relpath sha256" (the file's content was acknowledged: its fsync, or a
    `ckptfs sync` or `ckptfs seal` after its close, returned), "S version" (sealed),
    "D version" (removal started: no longer checked), "G" (a `ckptfs gc` finished)."""
    rng = random.Random(seed)
    base = rng.randbytes(3 * MiB)
    log = open(ack_path, "a")
    made = sorted(n for n in os.listdir(mnt) if n.startswith("r"))  # earlier rounds' too
    try:
        for i in range(10000):
            name = "r%03dv%03d" % (round_no, i)
            vdir = os.path.join(mnt, name)
            os.mkdir(vdir)
            pending = []
            for fname in ("model.pt", "optim.pt", "extra.bin")[:rng.randrange(1, 4)]:
                data = payload(rng, base)
                path = os.path.join(vdir, fname)
                with open(path, "wb") as f:
                    for at in range(0, len(data), 256 << 10):
                        f.write(data[at:at + (256 << 10)])
                    if rng.random() < 0.5:
                        f.flush()
                        os.fsync(f.fileno())
                        ack(log, "A", name + "/" + fname, hashlib.sha256(data).hexdigest())
                        continue
                pending.append((name + "/" + fname, hashlib.sha256(data).hexdigest()))
            end = rng.random()
            if end < 0.4:
                mounted.ckptfs("seal", vdir)
                for rel, digest in pending:
                    ack(log, "A", rel, digest)
                ack(log, "S", name)
            elif end < 0.8:
                mounted.ckptfs("sync", mnt)
                for rel, digest in pending:
                    ack(log, "A", rel, digest)
            made.append(name)
            # Retention keeps about KEEP_VERSIONS versions, so a long run's store stays small.
            while len(made) > KEEP_VERSIONS or (len(made) > 3 and rng.random() < 0.2):
                victim = made.pop(rng.randrange(0, len(made) - 2))
                ack(log, "D", victim)
                shutil.rmtree(os.path.join(mnt, victim))
            if rng.random() < 0.1:
                mounted.ckptfs("gc", mnt)
                ack(log, "G")
    except (OSError, AssertionError, subprocess.TimeoutExpired):
        pass  # the power went out under it
    log.close()
    os._exit(0)


def count_lines(ack_path):
    """How many lines of each kind the writers logged (A, S, D, G)."""
    counts = {}
    with open(ack_path) as f:
        for line in f:
            counts[line[0]] = counts.get(line[0], 0) + 1
    return counts


def acknowledged(ack_path):
    """relpath -> sha256 of every acknowledged file not removed since; the sealed versions."""
    files, sealed = {}, set()
    if not os.path.exists(ack_path):
        return files, sealed
    with open(ack_path) as f:
        for line in f:
            kind, _, rest = line.strip().partition(" ")
            if kind == "A":
                rel, digest = rest.split(" ")
                files[rel] = digest
            elif kind == "S":
                sealed.add(rest)
            elif kind == "D":
                files = {r: d for r, d in files.items() if not r.startswith(rest + "/")}
                sealed.discard(rest)
    return files, sealed


class PowerCutTest(unittest.TestCase):
    def setUp(self):
        if not os.access(POWERCUT_FS, os.X_OK):
            raise AssertionError("no powercut_fs at %s (set POWERCUT_FS)" % POWERCUT_FS)
        self.base = tempfile.mkdtemp(prefix="powercut-", dir=mounted.root_dir())
        self.fixtures = []
        self.addCleanup(lambda: [f.close() for f in self.fixtures])

    def check_store(self, m, ack_path, where):
        files, sealed = acknowledged(ack_path)
        for rel, digest in sorted(files.items()):
            with open(m.path(rel), "rb") as f:
                got = hashlib.sha256(f.read()).hexdigest()
            self.assertEqual(got, digest, "%s: %s was acknowledged and reads back different"
                             % (where, rel))
        for name in sorted(sealed):
            self.assertEqual(os.getxattr(m.path(name), "user.ckptfs.sealed"), b"1",
                             "%s: %s was sealed" % (where, name))
        return len(files)

    def verify(self, store, where):
        p = mounted.ckptfs("verify", store, check=False)
        self.assertEqual(p.returncode, 0, "%s: verify of the surviving store:\n%s%s"
                         % (where, p.stdout, p.stderr))
        self.assertIn("no problems", p.stdout)

    def test_power_cuts_lose_nothing_acknowledged(self):
        print("seed %d, %d rounds" % (SEED, ROUNDS), file=sys.stderr)
        ack_path = os.path.join(self.base, "acknowledged")
        state = os.path.join(self.base, "state-0")
        os.mkdir(state)
        # The store is made on the plain disk: the rounds start from a durable store.
        m = mounted.Mount("powercut", ["--seal-after", "0"])
        self.addCleanup(m.close)
        m.store = os.path.join(state, "store")
        m.mount()
        m.umount()
        fixture_mnt = os.path.join(self.base, "disk")
        os.mkdir(fixture_mnt)
        totals = {"rounds": 0, "checked": 0, "unsynced_writes_lost": 0,
                  "unsynced_writes_kept": 0}
        rng = random.Random(SEED)
        for r in range(1, ROUNDS + 1):
            where = "round %d (seed %d)" % (r, SEED)
            mode = ("drop", "subset")[r % 2]
            nxt = os.path.join(self.base, "state-%d" % r)
            journal = os.path.join(self.base, "journal-%d" % r)
            fx = PowerCutFs(state, fixture_mnt, journal, nxt, mode, SEED * 1000 + r)
            self.fixtures.append(fx)
            m.store = os.path.join(fixture_mnt, "store")
            m.mount()
            totals["checked"] += self.check_store(m, ack_path, where)
            ctx = multiprocessing.get_context("fork")
            w = ctx.Process(target=writer, args=(m.mnt, ack_path, r, SEED * 1000 + r))
            w.start()
            time.sleep(rng.uniform(0.2, 3.0))
            stats = fx.cut()
            pid = m.pid
            mounted.force_unmount(m.mnt, pid)
            m.pid = None
            w.join(60)
            if w.is_alive():
                w.kill()
                w.join()
                self.fail("%s: the writer hangs on the dead mount" % where)
            store_bytes = sum(e.stat().st_size for e in os.scandir(os.path.join(nxt, "store",
                                                                            "packs")))
            print("%s, %s: store %.1f MiB of packs, %s"
                  % (where, mode, store_bytes / MiB, json.dumps(stats)), file=sys.stderr)
            for k in ("unsynced_writes_lost", "unsynced_writes_kept"):
                totals[k] += stats[k]
            totals["rounds"] += 1
            shutil.rmtree(state)
            shutil.rmtree(journal)
            state = nxt
            self.verify(os.path.join(state, "store"), where)

        # The last survivors, on the plain disk: mount, check, unmount, verify.
        m.store = os.path.join(state, "store")
        m.mount()
        totals["checked"] += self.check_store(m, ack_path, "after the last cut")
        m.umount()
        self.verify(m.store, "after the last cut")
        counts = count_lines(ack_path)
        totals.update({"files_acknowledged": counts.get("A", 0),
                       "seals": counts.get("S", 0), "version_removals": counts.get("D", 0),
                       "gcs": counts.get("G", 0)})
        print("POWERCUT SUMMARY " + json.dumps(totals), file=sys.stderr)


if __name__ == "__main__":
    if not os.path.exists("/dev/fuse") or os.geteuid() != 0:
        mounted.skip_all("needs root and /dev/fuse")
    mounted.main()
