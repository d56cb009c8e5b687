#!/usr/bin/python3
"""Random POSIX operations against a reference directory (issue 15).

Several processes at once, each in its own subtree of one version directory of the mount, apply
a random sequence of operations (create, overwrite, append, pwrite past the end, truncate,
read, pread, stat, listdir, mkdir, rmdir, rename of files and directories, unlink, fsync,
symlink, readlink) to the mount and, one by one, the same operation to the same path under a
reference directory on the native disk. Every outcome must be the same: the bytes read, the
sizes and names seen, and for a failing call the errno (ENOENT, EEXIST, EISDIR, ENOTDIR,
ENOTEMPTY, EINVAL, ...). Paths come from a small namespace, so operations keep meeting files,
directories and missing names. Afterwards the whole tree must equal the reference, again after
a remount, and `ckptfs verify` must be clean.

CTest runs a short form (a fixed seed); `scripts/faults.sh random_ops OPS [SEED]` the long one:
CKPTFS_RANDOM_OPS_ROUNDS operations in all (default 6000), CKPTFS_RANDOM_OPS_PROCS processes
(default 4), CKPTFS_RANDOM_OPS_SEED (default: the time of day, printed). Prints one line
RANDOM_OPS SUMMARY {...}.
"""
import errno
import hashlib
import json
import multiprocessing
import os
import random
import stat
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import faults  # noqa: E402
import mounted  # noqa: E402

MiB = mounted.MiB
OPS = int(os.environ.get("CKPTFS_RANDOM_OPS_ROUNDS", "6000"))
PROCS = int(os.environ.get("CKPTFS_RANDOM_OPS_PROCS", "4"))
SEED = int(os.environ.get("CKPTFS_RANDOM_OPS_SEED", str(int(time.time()) % 100000)))

DIRS = ["", "a/", "b/", "a/c/", "b/d/"]
FILES = ["f0", "f1", "f2", "f3"]
NAMES = FILES + ["a", "b", "c", "d"]
DATA_OPS = ("write", "append", "pwrite", "truncate", "read", "pread", "fsync", "unlink")
# (operation, weight): writes and reads dominate, as in a checkpoint directory.
WEIGHTS = [("write", 14), ("append", 8), ("pwrite", 8), ("truncate", 6), ("read", 14),
           ("pread", 8), ("stat", 8), ("listdir", 6), ("mkdir", 6), ("rmdir", 4),
           ("rename", 8), ("unlink", 6), ("fsync", 2), ("symlink", 1), ("readlink", 1),
           ("makedirs", 4)]


def digest(b):
    return hashlib.blake2b(b, digest_size=16).hexdigest()


def outcome(fn):
    """("ok", value) or ("error", errno name): what a call did, comparable across trees."""
    try:
        return ("ok", fn())
    except OSError as e:
        return ("error", errno.errorcode.get(e.errno, str(e.errno)))


def kind(st):
    return "dir" if stat.S_ISDIR(st.st_mode) else "link" if stat.S_ISLNK(st.st_mode) else "file"


def payload(rng):
    n = rng.choice([0, 1, rng.randrange(1, 4096), rng.randrange(4096, 256 << 10),
                    rng.randrange(256 << 10, 2 * MiB) if rng.random() < 0.2 else 100])
    return rng.randbytes(n)


def make_op(rng):
    """One random operation: a function of the tree's root, the same for both trees."""
    op = rng.choices([w[0] for w in WEIGHTS], [w[1] for w in WEIGHTS])[0]
    # Data operations mostly meet files; the namespace ones any name.
    names = FILES if op in DATA_OPS and rng.random() < 0.9 else NAMES
    path = rng.choice(DIRS) + rng.choice(names)
    other = rng.choice(DIRS) + rng.choice(NAMES)
    data = payload(rng) if op in ("write", "append", "pwrite") else b""
    offset = rng.randrange(0, 3 * MiB) if rng.random() < 0.3 else rng.randrange(0, 64 << 10)
    length = rng.randrange(0, 512 << 10)
    dirpath = rng.choice(DIRS[1:])

    def write(root, mode):
        with open(os.path.join(root, path), mode) as f:
            f.write(data)
        return None

    def pwrite(root):
        fd = os.open(os.path.join(root, path), os.O_WRONLY)
        try:
            return os.pwrite(fd, data, offset)
        finally:
            os.close(fd)

    def read(root):
        with open(os.path.join(root, path), "rb") as f:
            return digest(f.read())

    def pread(root):
        fd = os.open(os.path.join(root, path), os.O_RDONLY)
        try:
            return digest(os.pread(fd, length, offset))
        finally:
            os.close(fd)

    def lstat(root):
        st = os.lstat(os.path.join(root, path))
        return (kind(st), st.st_size if kind(st) == "file" else None)

    def fsync(root):
        fd = os.open(os.path.join(root, path), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def listdir(root):
        return sorted(os.listdir(os.path.join(root, os.path.dirname(path))))

    ops = {
        "write": lambda r: write(r, "wb"),
        "append": lambda r: write(r, "ab"),
        "pwrite": pwrite,
        "truncate": lambda r: os.truncate(os.path.join(r, path), offset),
        "read": read,
        "pread": pread,
        "stat": lstat,
        "listdir": listdir,
        "mkdir": lambda r: os.mkdir(os.path.join(r, path)),
        "rmdir": lambda r: os.rmdir(os.path.join(r, path)),
        "rename": lambda r: os.rename(os.path.join(r, path), os.path.join(r, other)),
        "unlink": lambda r: os.unlink(os.path.join(r, path)),
        "fsync": fsync,
        "symlink": lambda r: os.symlink("target-" + other, os.path.join(r, path)),
        "readlink": lambda r: os.readlink(os.path.join(r, path)),
        # mkdir -p of a directory of the namespace (renames and rmdirs take them away).
        "makedirs": lambda r: os.makedirs(os.path.join(r, dirpath), exist_ok=True),
    }
    describe = "%s %s" % (op, path)
    if op == "makedirs":
        describe = "makedirs " + dirpath
    elif op == "rename":
        describe += " -> " + other
    elif op in ("write", "append", "pwrite"):
        describe += " (%d bytes%s)" % (len(data), " at %d" % offset if op == "pwrite" else "")
    elif op in ("truncate", "pread"):
        describe += " (offset %d)" % offset
    return op, describe, ops[op]


def worker(k, mnt_root, ref_root, n, seed, results):
    rng = random.Random(seed * 1000 + k)
    mine, ref = os.path.join(mnt_root, "p%d" % k), os.path.join(ref_root, "p%d" % k)
    for root in (mine, ref):  # the directories of the namespace, which operations may remove
        for d in DIRS[1:]:
            os.makedirs(os.path.join(root, d))
    counts, errors, mismatches = {}, {}, []
    done = 0
    for i in range(n):
        done = i + 1
        op, describe, fn = make_op(rng)
        got, want = outcome(lambda: fn(mine)), outcome(lambda: fn(ref))
        counts[op] = counts.get(op, 0) + 1
        if want[0] == "error":
            errors[want[1]] = errors.get(want[1], 0) + 1
        if got != want:
            mismatches.append("process %d op %d: %s: mount %r, reference %r"
                              % (k, i, describe, got, want))
            if len(mismatches) >= 20:
                break
    results.put({"process": k, "ops": done, "counts": counts, "errors": errors,
                 "mismatches": mismatches})


def tree(root):
    """{relative path: (kind, content digest or link target)} of everything under root."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            rel = os.path.relpath(p, root)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", None)
            else:
                with open(p, "rb") as f:
                    out[rel] = ("file", digest(f.read()))
    return out


class RandomOpsTest(mounted.MountedTestCase):
    def test_random_operations_match_a_reference_directory(self):
        print("random ops: %d operations, %d processes, seed %d" % (OPS, PROCS, SEED),
              file=sys.stderr)
        version = self.version_dir("random_ops")
        ref = os.path.join(mounted.root_dir(), "reference")
        os.mkdir(ref)
        results = multiprocessing.Queue()
        per = [OPS // PROCS + (1 if k < OPS % PROCS else 0) for k in range(PROCS)]
        started = time.monotonic()
        procs = [multiprocessing.Process(target=worker,
                                         args=(k, version, ref, per[k], SEED, results))
                 for k in range(PROCS)]
        for p in procs:
            p.start()
        reports = [results.get(timeout=3600) for _ in procs]
        for p in procs:
            p.join()
        seconds = time.monotonic() - started
        mismatches = [m for r in reports for m in r["mismatches"]]
        counts, errors = {}, {}
        for r in reports:
            for op, c in r["counts"].items():
                counts[op] = counts.get(op, 0) + c
            for name, c in r["errors"].items():
                errors[name] = errors.get(name, 0) + c
        self.assertEqual(mismatches, [])
        self.assertEqual(sum(p.exitcode for p in procs), 0)

        expected = tree(ref)
        self.assertEqual(tree(version), expected, "the mount's tree after the operations")
        self.remount()
        self.assertEqual(tree(self.m.path("random_ops")), expected, "after a remount")
        self.m.umount()
        faults.verify(self, self.store, "after the random operations")
        self.m.mount()
        summary = {"seed": SEED, "processes": PROCS, "ops": sum(r["ops"] for r in reports),
                   "failing_calls_compared": sum(errors.values()), "errnos": errors,
                   "mismatches": len(mismatches), "entries_at_end": len(expected),
                   "seconds": round(seconds, 1), "counts": counts}
        print("RANDOM_OPS SUMMARY " + json.dumps(summary, sort_keys=True), file=sys.stderr)


if __name__ == "__main__":
    mounted.main()
