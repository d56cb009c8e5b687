#!/usr/bin/python3
"""Power loss (issue 15): the store lives on powercut_fs (tests/powercut/powercut_fs.cc), a FUSE
passthrough that keeps written-but-unsynced data apart and drops it at a simulated power cut:
all of it (mode drop), or per file a random subset of the unsynced writes in their order, and
per directory its synced or its current names (mode subset).

Each round: powercut_fs serves the state the last cut left; ckptfs mounts the store on it; the
store must open and every file acknowledged in an earlier round must read back bitwise (and
every version whose seal was acknowledged must still be sealed); then the writer of
tests/fs/faults.py saves versions (fsync, `ckptfs sync`, `ckptfs seal`, rm -rf, gc, forget,
the background re-encoding into reverse deltas, snapshots through the snapshot engine) until the
power is cut in the round's target phase. Cuts that interrupted the re-encoder are counted (the
open of the store by verify says its re-encoding resumes).
Between rounds `ckptfs verify` of the surviving store must be clean. At the end the store is
mounted without the fixture, checked once more, unmounted and verified.

    CKPTFS_POWERCUT_ROUNDS=N (default: each phase once, the modes alternating)  CKPTFS_POWERCUT_SEED=S (default: from the clock)
scripts/faults.sh powercut ROUNDS runs the long form.
"""
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

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
import faults  # noqa: E402
import mounted  # noqa: E402
from mounted import MiB  # noqa: E402

POWERCUT_FS = os.path.abspath(os.environ.get("POWERCUT_FS") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "powercut_fs"))
ROUNDS = int(os.environ.get("CKPTFS_POWERCUT_ROUNDS", "0"))  # 0: one round per phase
SEED = int(os.environ.get("CKPTFS_POWERCUT_SEED", str(int(time.time()) % 100000)))
try:  # the snapshot phase needs torch and the ckptfs package (libckptfs_snapshot.so)
    import torch  # noqa: F401
    import ckptfs  # noqa: F401
    # scripts/sanitize.sh: an instrumented libckptfs_snapshot.so cannot load into python
    SNAPSHOTS = not os.environ.get("CKPTFS_FAULTS_NO_SNAPSHOT")
except Exception:  # noqa: BLE001 - any import failure only drops the snapshot phase
    SNAPSHOTS = False


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


class PowerCutTest(unittest.TestCase):
    def setUp(self):
        if not os.access(POWERCUT_FS, os.X_OK):
            raise AssertionError("no powercut_fs at %s (set POWERCUT_FS)" % POWERCUT_FS)
        self.base = tempfile.mkdtemp(prefix="powercut-", dir=mounted.root_dir())
        self.fixtures = []
        self.addCleanup(lambda: [f.close() for f in self.fixtures])

    def test_power_cuts_lose_nothing_acknowledged(self):
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
        phases = [p for p in faults.PHASES if SNAPSHOTS or p != "snapshot"]
        rounds = ROUNDS or len(phases)
        print("seed %d, %d rounds" % (SEED, rounds), file=sys.stderr)
        cuts, resumed = {}, 0
        for r in range(1, rounds + 1):
            where = "round %d (seed %d)" % (r, SEED)
            # Phases in turn, modes alternating; every second pass over the phases swaps the
            # modes, so each phase meets both.
            mode = ("drop", "subset")[(r + (r - 1) // len(phases)) % 2]
            nxt = os.path.join(self.base, "state-%d" % r)
            journal = os.path.join(self.base, "journal-%d" % r)
            fx = PowerCutFs(state, fixture_mnt, journal, nxt, mode, SEED * 1000 + r)
            self.fixtures.append(fx)
            m.store = os.path.join(fixture_mnt, "store")
            m.mount()
            totals["checked"] += faults.check_store(self, m.mnt, ack_path, where)
            # The cut lands in the round's target phase, 0-10 ms after the writer enters it.
            target = phases[(r - 1) % len(phases)]
            tail = faults.Tail(ack_path)
            w = multiprocessing.get_context("fork").Process(
                target=faults.writer, args=(m.mnt, ack_path, r, SEED * 1000 + r, SNAPSHOTS))
            w.start()
            if tail.wait_for(target, 20):
                time.sleep(rng.uniform(0, 0.01))
            phase = tail.poll()
            stats = fx.cut()
            pid = m.pid
            mounted.force_unmount(m.mnt, pid)
            m.pid = None
            w.join(60)
            if w.is_alive():
                w.kill()
                w.join()
                self.fail("%s: the writer hangs on the dead mount" % where)
            cuts[phase] = cuts.get(phase, 0) + 1
            store_bytes = sum(e.stat().st_size for e in os.scandir(os.path.join(nxt, "store",
                                                                            "packs")))
            print("%s, %s, cut in %s: store %.1f MiB of packs, %s"
                  % (where, mode, phase, store_bytes / MiB, json.dumps(stats)), file=sys.stderr)
            for k in ("unsynced_writes_lost", "unsynced_writes_kept"):
                totals[k] += stats[k]
            totals["rounds"] += 1
            shutil.rmtree(state)
            shutil.rmtree(journal)
            state = nxt
            resumed += faults.verify(self, os.path.join(state, "store"), where)

        # The last survivors, on the plain disk: mount, check, unmount, verify.
        m.store = os.path.join(state, "store")
        m.mount()
        totals["checked"] += faults.check_store(self, m.mnt, ack_path, "after the last cut")
        m.umount()
        faults.verify(self, m.store, "after the last cut")
        counts = faults.count_lines(ack_path)
        totals.update({"cuts_by_phase": cuts, "reencoding_interrupted": resumed,
                       "files_acknowledged": counts.get("A", 0),
                       "seals": counts.get("S", 0), "gcs": counts.get("G", 0),
                       "forgets": counts.get("P forget", 0),
                       "snapshots": counts.get("P snapshot", 0)})
        print("POWERCUT SUMMARY " + json.dumps(totals), file=sys.stderr)


if __name__ == "__main__":
    if not os.path.exists("/dev/fuse") or os.geteuid() != 0:
        mounted.skip_all("needs root and /dev/fuse")
    mounted.main()
