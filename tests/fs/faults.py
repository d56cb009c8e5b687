"""The workload and the bookkeeping of the fault tests (test_powercut.py, test_kill9.py).

A writer process saves versions through a ckptfs mount until the mount dies under it, going
through every phase a fault may hit, and logs to an acknowledgement file (on the plain disk):
    "P phase"       entering a phase (save, fsync, sync, seal, rm, gc, forget, snapshot,
                    reencode: a `ckptfs sync` waiting for the background re-encoder, right
                    after a new version of a safetensors file was fsync'ed)
    "A relpath sha" the file's content was acknowledged: its fsync, or a `ckptfs sync`,
                    `ckptfs seal` or a snapshot's wait() after its close, returned
    "S version"     the version's seal was acknowledged
    "D version"     the version may be gone (its removal started): no longer checked
    "G"             a `ckptfs gc` returned
After a fault, acknowledged() is what the store must still hold, bitwise.
"""
import hashlib
import json
import os
import random
import shutil
import subprocess
import time

import mounted
from mounted import MiB

PHASES = ("save", "fsync", "sync", "seal", "rm", "gc", "forget", "reencode", "snapshot")
KEEP_VERSIONS = 12  # retention: a long run's store stays small
REENCODE_RESUMES = "into reverse deltas resumes"  # engine/store/reencode.cc, in the daemon log


def payload(rng, base):
    """A checkpoint-like file: a slice of `base` (deduplicates across versions) with new bytes."""
    n = rng.randrange(64 << 10, 3 * MiB)
    data = bytearray(base[:n])
    for _ in range(rng.randrange(1, 4)):
        at = rng.randrange(0, n)
        fresh = rng.randbytes(min(n - at, rng.randrange(4096, 256 << 10)))
        data[at:at + len(fresh)] = fresh
    return bytes(data)


class Weights:
    """A training run's safetensors file: the same fp32 tensors, nudged a little each version.

    The store keeps a new version's pieces as deltas against the previous one, and its
    background re-encoder (engine/store/reencode.cc) then stores the new pieces whole and turns
    the previous version's around into deltas against them: the phase "reencode" hits that."""

    TENSORS, ELEMENTS = 4, 1 << 20  # 16 MiB a version

    def __init__(self, seed):
        import numpy as np
        self.np = np
        # One starting point for every round: a round's first version is a delta against the
        # store's latest one, so the re-encoder has work from the first "reencode" on.
        start = np.random.default_rng(0)
        self.w = [start.standard_normal(self.ELEMENTS, dtype=np.float32)
                  for _ in range(self.TENSORS)]
        self.g = np.random.default_rng(seed)
        self.versions = 0

    def next(self):
        """The next version's file (bytes): every tensor plus a small step."""
        self.versions += 1
        for w in self.w:
            w += self.np.float32(1e-3) * self.g.standard_normal(w.size, dtype=self.np.float32)
        header, at = {}, 0
        for i, w in enumerate(self.w):
            header["layers.%d.weight" % i] = {"dtype": "F32", "shape": [w.size],
                                              "data_offsets": [at, at + w.nbytes]}
            at += w.nbytes
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        return len(text).to_bytes(8, "little") + text + b"".join(w.tobytes() for w in self.w)


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


def count_lines(ack_path):
    """Lines of each kind (A, S, D, G) and entries into each phase ("P save": ...)."""
    counts = {}
    with open(ack_path) as f:
        for line in f:
            key = line.strip() if line.startswith("P ") else line[0]
            counts[key] = counts.get(key, 0) + 1
    return counts


class AckLog:
    """Appends lines to the acknowledgement file, while `mnt` is still the mount it was.

    Once the test detaches a dead mount (a lazy unmount), paths under it reach the empty
    directory beneath: a writer busy elsewhere at the fault (generating a payload) would then
    save, fsync and acknowledge files on the plain disk, which the next mount hides. So every
    line is written only while mnt is the filesystem it was at the start; otherwise the writer
    stops. (Found when the slow Weights payloads widened that window: an "acknowledged" file
    was missing at the next mount.)"""

    def __init__(self, path, mnt):
        self.f = open(path, "a")
        self.mnt, self.dev = mnt, os.stat(mnt).st_dev

    def __call__(self, kind, *fields):
        try:
            same = os.stat(self.mnt).st_dev == self.dev
        except OSError:
            same = False
        if not same:
            os._exit(0)
        self.f.write(" ".join([kind] + [str(f) for f in fields]) + "\n")
        self.f.flush()


class Tail:
    """The phase the writer is in, from the new lines of its acknowledgement file."""

    def __init__(self, path):
        self.path, self.offset, self.phase = path, 0, None
        if os.path.exists(path):
            self.offset = os.path.getsize(path)

    def poll(self):
        if not os.path.exists(self.path):
            return self.phase
        with open(self.path) as f:
            f.seek(self.offset)
            text = f.read()
        cut = text.rfind("\n") + 1
        self.offset += len(text[:cut].encode())
        for line in text[:cut].splitlines():
            if line.startswith("P "):
                self.phase = line[2:]
        return self.phase

    def wait_for(self, phase, timeout):
        """Waits until the writer enters `phase` (True) or `timeout` passes (False)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.poll() == phase:
                return True
            time.sleep(0.002)
        return False


def _snapshot(mnt, name, rng, log):
    """One snapshot through the snapshot engine (the daemon adopts the rank's pack). Returns
    its files (relpath -> sha256) and whether its version is sealed, which is logged as soon as
    wait() returns (a snapshot's version is sealed at its commit), before the files are read
    back for their digests: a kill while they are read still finds the seal checked."""
    import torch  # imported by the parent before the fork
    import ckptfs
    from ckptfs import sharded
    g = torch.Generator().manual_seed(rng.randrange(1 << 30))
    state = {"w%d" % i: torch.randn(rng.randrange(1 << 14, 1 << 18), generator=g)
             for i in range(3)}
    local, info = sharded.split_state_dict(state, 0, 1)
    ckptfs.snapshot(local, os.path.join(mnt, name), 0, 1, info).wait()
    sealed = os.getxattr(os.path.join(mnt, name), "user.ckptfs.sealed") == b"1"
    if sealed:
        log("S", name)
    files = {}
    for dirpath, _, names in os.walk(os.path.join(mnt, name)):
        for n in names:
            path = os.path.join(dirpath, n)
            with open(path, "rb") as f:
                files[os.path.relpath(path, mnt)] = hashlib.sha256(f.read()).hexdigest()
    for rel, digest in sorted(files.items()):
        log("A", rel, digest)
    return files, sealed


def forget(mnt, log, known, sealed, keep):
    """`ckptfs forget --keep-last keep`, with a "D" line first for every version it removes.

    Which ones the store says (a dry run): it forgets every sealed version beyond the newest
    `keep`, and the store may hold sealed versions whose "S" line is missing (the kill landed
    between a seal's commit and its line: after `ckptfs seal` or a snapshot's wait()
    returned), with acknowledged files: a "D" for the sealed versions
    the log knows only would leave those files acknowledged (a kill9 failure, seed 40910).
    Nothing else changes the namespace meanwhile (no retention, no sealer: --seal-after 0).
    What is still there afterwards is acknowledged again."""
    plan = json.loads(mounted.ckptfs("forget", mnt, "--keep-last", keep, "--dry-run",
                                     "--json").stdout)
    going = sorted(v["name"] for v in plan["forgotten"])
    for v in going:
        log("D", v)
    mounted.ckptfs("forget", mnt, "--keep-last", keep)
    for v in going:
        if os.path.isdir(os.path.join(mnt, v)):
            for rel, digest in sorted(known.items()):
                if rel.startswith(v + "/"):
                    log("A", rel, digest)
            if v in sealed:
                log("S", v)
        else:
            sealed.discard(v)


def writer(mnt, ack_path, round_no, seed, snapshots):
    """Saves versions through `mnt` until the mount dies; never returns (os._exit)."""
    rng = random.Random(seed)
    base = rng.randbytes(3 * MiB)
    log = AckLog(ack_path, mnt)
    known, sealed = acknowledged(ack_path)
    made = sorted(n for n in os.listdir(mnt) if n.startswith("r"))  # earlier rounds' too
    parent = os.getppid()
    weights = Weights(seed)
    try:
        for i in range(100000):
            if os.getppid() != parent:
                break  # the test died: stop (its guard cleans up once this exits too)
            name = "r%03dv%03d" % (round_no, i)
            if snapshots and rng.random() < 0.15:
                log("P", "snapshot")
                files, snapshot_sealed = _snapshot(mnt, name, rng, log)
                known.update(files)
                if snapshot_sealed:
                    sealed.add(name)
                made.append(name)
                continue
            log("P", "save")
            vdir = os.path.join(mnt, name)
            os.mkdir(vdir)
            pending = []
            if rng.random() < 0.3:
                # A new version of the weights, acknowledged by its fsync; then `ckptfs sync`
                # waits for the re-encoder, which is busy with it and the version before.
                data = weights.next()
                rel, digest = name + "/weights.safetensors", hashlib.sha256(data).hexdigest()
                with open(os.path.join(vdir, "weights.safetensors"), "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                log("A", rel, digest)
                known[rel] = digest
                if weights.versions > 1:  # the first of a round may have no delta base left
                    log("P", "reencode")
                    mounted.ckptfs("sync", mnt)
                    log("P", "save")
            for fname in ("model.pt", "optim.pt", "extra.bin")[:rng.randrange(1, 4)]:
                data = payload(rng, base)
                rel, digest = name + "/" + fname, hashlib.sha256(data).hexdigest()
                with open(os.path.join(vdir, fname), "wb") as f:
                    for at in range(0, len(data), 256 << 10):
                        f.write(data[at:at + (256 << 10)])
                    if rng.random() < 0.5:
                        f.flush()
                        log("P", "fsync")
                        os.fsync(f.fileno())
                        log("A", rel, digest)
                        known[rel] = digest
                        log("P", "save")
                        continue
                pending.append((rel, digest))
            end = rng.random()
            if end < 0.4:
                log("P", "seal")
                mounted.ckptfs("seal", vdir)
                log("S", name)
                sealed.add(name)
            elif end < 0.8:
                log("P", "sync")
                mounted.ckptfs("sync", mnt)
            if end < 0.8:
                for rel, digest in pending:
                    log("A", rel, digest)
                    known[rel] = digest
            made.append(name)
            while len(made) > KEEP_VERSIONS or (len(made) > 3 and rng.random() < 0.2):
                victim = made.pop(rng.randrange(0, len(made) - 2))
                log("P", "rm")
                log("D", victim)
                shutil.rmtree(os.path.join(mnt, victim))
            if rng.random() < 0.1:
                log("P", "gc")
                mounted.ckptfs("gc", mnt)
                log("G")
            if rng.random() < 0.07 and sealed:
                log("P", "forget")
                forget(mnt, log, known, sealed, rng.randrange(2, 6))
                made = [v for v in made if os.path.isdir(os.path.join(mnt, v))]
    except (OSError, AssertionError, subprocess.TimeoutExpired, RuntimeError):
        pass  # the mount died under it (ckptfs.snapshot raises RuntimeError)
    os._exit(0)


def check_store(test, mnt, ack_path, where):
    """Every acknowledged file reads back bitwise; acknowledged seals hold. Returns the count."""
    files, sealed = acknowledged(ack_path)
    for rel, digest in sorted(files.items()):
        with open(os.path.join(mnt, rel), "rb") as f:
            got = hashlib.sha256(f.read()).hexdigest()
        test.assertEqual(got, digest, "%s: %s was acknowledged and reads back different"
                         % (where, rel))
    for name in sorted(sealed):
        test.assertEqual(os.getxattr(os.path.join(mnt, name), "user.ckptfs.sealed"), b"1",
                         "%s: %s was sealed" % (where, name))
    return len(files)


def wait_unlocked(store, timeout=60):
    """Waits until no process holds the store's lock (True), or timeout passes (False).

    After SIGKILL the daemon's main thread is soon a zombie (pid_alive() says gone), but the
    kernel may still be finishing its io_uring workers, which share its open files: the store's
    LOCK stays taken for a moment and `ckptfs verify` would answer Busy (1 round in ~70 of a
    long kill9 run)."""
    import fcntl
    deadline = time.monotonic() + timeout
    with open(os.path.join(store, "LOCK"), "rb") as f:
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(f, fcntl.LOCK_UN)
                return True
            except BlockingIOError:
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.05)


def verify(test, store, where):
    """`ckptfs verify` of the store must be clean. Returns whether opening the store resumed the
    re-encoder's queue: the fault interrupted re-encoding (its log line, on verify's stderr)."""
    p = mounted.ckptfs("--verbose", "verify", store, check=False)
    test.assertEqual(p.returncode, 0, "%s: verify of the store:\n%s%s"
                     % (where, p.stdout, p.stderr))
    test.assertIn("no problems", p.stdout)
    return REENCODE_RESUMES in p.stderr
