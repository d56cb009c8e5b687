#!/usr/bin/python3
"""Single-byte flip sweeps of the packs and of the catalog (issue 15).

A store holds two versions (random and compressible files, so raw and lz4 records). Then, one
flip at a time (xor 0x10, undone before the next):
  - packs: offsets spread evenly over every pack (a random one in each stride). A flip inside
    a committed record must be found by `ckptfs verify` (exit 1), and its "damaged" list must
    name the version, file and byte range holding the record; `ckptfs restore` of every version
    must then fail or give the exact bytes, never other bytes. A flip outside every record (pack
    header, tail past the committed length) may go unnoticed, but the bytes must still restore.
  - catalog (LMDB data.mdb): offsets spread evenly over the file. verify may find the flip (exit
    1, or the store refusing to open), or not; either way restore gives the exact bytes or fails.
Silent corruption (exact bytes not restored yet no error) fails the test, as does a verify or
restore killed by a signal, and so does a store that does not verify clean once a flip is
undone: nothing may write to a store while it is damaged (a write on a damaged catalog, e.g. a
table created anew beside one whose name the flip changed, outlives the flip).

    CKPTFS_FLIPS_PACK=N (default 24)  CKPTFS_FLIPS_CATALOG=N (default 16)  CKPTFS_FLIPS_SEED=S
scripts/faults.sh flips N runs N of each.
"""
import json
import os
import random
import shutil
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mounted  # noqa: E402
from mounted import MiB  # noqa: E402

PACK_FLIPS = int(os.environ.get("CKPTFS_FLIPS_PACK", "24"))
CATALOG_FLIPS = int(os.environ.get("CKPTFS_FLIPS_CATALOG", "16"))
SEED = int(os.environ.get("CKPTFS_FLIPS_SEED", str(int(time.time()) % 100000)))
PACK_HEADER_BYTES = 32  # engine/store/record.h kPackHeaderBytes


def compressible(rng, n):
    """Bytes lz4 shrinks: 64-byte blocks of 16 random bytes and zeros."""
    out = bytearray(n)
    for at in range(0, n, 64):
        out[at:at + 16] = rng.randbytes(min(16, n - at))
    return bytes(out)


def flip(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x10]))


def spread(rng, size, n, start=0):
    """n offsets in [start, size): one at random in each of n equal strides."""
    stride = max(1, (size - start) // n)
    return [min(size - 1, start + i * stride + rng.randrange(stride)) for i in range(n)]


class FlipTest(unittest.TestCase):
    def setUp(self):
        self.rng = random.Random(SEED)
        # Pieces compressed as they are written, so that every byte of a pack past its header
        # belongs to a live record (compressed behind the writer, the raw records the
        # re-encoder replaced leave dead ranges until gc rewrites the pack: a flip there
        # rightly goes unnoticed, and this test could not tell it from a missed one).
        self.m = mounted.Mount("flips", ["--seal-after", "0", "--compress-at-write"])
        self.addCleanup(self.m.close)
        self.m.mount()
        self.files = {}  # "version/file" -> bytes
        for v, seed in (("v1", 1), ("v2", 2)):
            os.mkdir(self.m.path(v))
            r = random.Random(SEED * 10 + seed)
            for name, data in (("model.pt", r.randbytes(5 * MiB + 17)),
                               ("optim.pt", compressible(r, 3 * MiB))):
                mounted.write_file(self.m.path(v, name), data)
                self.files[v + "/" + name] = data
        self.m.umount()
        self.store = self.m.store
        self.scratch = tempfile.mkdtemp(prefix="flips-", dir=mounted.root_dir())
        p = mounted.ckptfs("verify", "--json", self.store)
        self.assertTrue(json.loads(p.stdout)["ok"])

    def verify(self, where=""):
        p = mounted.ckptfs("verify", "--json", self.store, check=False)
        self.assertGreaterEqual(p.returncode, 0,
                                "%s: verify killed by a signal: %s" % (where, p.stderr))
        try:
            return p.returncode, json.loads(p.stdout)
        except ValueError:
            return p.returncode, None  # the store did not open: an error message, exit 1

    def assertClean(self, where):
        rc, report = self.verify()
        self.assertEqual(rc, 0, "%s: the store is damaged once the flip is undone: %s"
                         % (where, report and report["problems"][:3]))

    def restore_all(self):
        """version -> True (exact bytes), False (restore failed). Fails on wrong bytes."""
        out = {}
        for v in ("v1", "v2"):
            dest = os.path.join(self.scratch, v)
            shutil.rmtree(dest, ignore_errors=True)
            p = mounted.ckptfs("restore", self.store, v, dest, check=False)
            self.assertGreaterEqual(p.returncode, 0, "restore killed by a signal: " + p.stderr)
            if p.returncode != 0:
                out[v] = False
                continue
            names = sorted(os.path.relpath(os.path.join(d, f), dest)
                           for d, _, fs in os.walk(dest) for f in fs)
            expected = sorted(rel[len(v) + 1:] for rel in self.files if rel.startswith(v + "/"))
            self.assertEqual(names, expected, "SILENT corruption: %s restored other names" % v)
            for rel, data in self.files.items():
                if rel.startswith(v + "/"):
                    got = mounted.read_file(os.path.join(dest, rel[len(v) + 1:]))
                    self.assertEqual(got, data, "SILENT corruption: %s restored other bytes" % rel)
            out[v] = True
        return out

    def test_flip_sweeps(self):
        print("seed %d: %d pack flips, %d catalog flips" % (SEED, PACK_FLIPS, CATALOG_FLIPS),
              file=sys.stderr)
        packs = sorted(os.path.join(self.store, "packs", n)
                       for n in os.listdir(os.path.join(self.store, "packs")))
        total = sum(os.path.getsize(p) for p in packs)
        counts = {"pack_flips": 0, "pack_detected": 0, "pack_named": 0, "pack_unnoticed": 0,
                  "catalog_flips": 0, "catalog_detected": 0, "catalog_unnoticed": 0}
        for p in packs:
            size = os.path.getsize(p)
            n = max(1, round(PACK_FLIPS * size / total))
            for at in spread(self.rng, size, n):
                flip(p, at)
                try:
                    rc, report = self.verify("%s offset %d" % (os.path.basename(p), at))
                    restored = self.restore_all()
                finally:
                    flip(p, at)
                counts["pack_flips"] += 1
                where = "%s offset %d" % (os.path.basename(p), at)
                self.assertClean(where)
                if rc == 0:
                    # Unnoticed: only outside every record, and every version restored exactly.
                    counts["pack_unnoticed"] += 1
                    self.assertTrue(all(restored.values()), where + ": restore failed, verify clean")
                    self.assertLess(at, PACK_HEADER_BYTES,
                                    where + ": a flip inside the records went unnoticed")
                    continue
                counts["pack_detected"] += 1
                self.assertIsNotNone(report, where)
                named = report.get("damaged", [])
                self.assertTrue(named, where + ": verify names no file: %s" % report["problems"])
                for d in named:
                    self.assertIn(d["file"], self.files, where)
                    self.assertEqual(d["version"], d["file"].split("/")[0], where)
                    self.assertLessEqual(d["offset"] + d["length"], len(self.files[d["file"]]))
                    self.assertIn(os.path.basename(p)[:-len(".pack")], d["problem"], where)
                    self.assertFalse(restored[d["version"]],
                                     where + ": %s restored despite the damage" % d["file"])
                counts["pack_named"] += 1
        catalog = os.path.join(self.store, "catalog", "data.mdb")
        self.assertTrue(os.path.exists(catalog), catalog)
        for at in spread(self.rng, os.path.getsize(catalog), CATALOG_FLIPS):
            flip(catalog, at)
            try:
                rc, _ = self.verify("catalog offset %d" % at)
                self.restore_all()  # fails the test on wrong bytes
            finally:
                flip(catalog, at)
            # Nothing may have written to the store while its catalog was corrupt: undone, the
            # flip leaves the store as clean as before.
            self.assertClean("catalog offset %d" % at)
            counts["catalog_flips"] += 1
            counts["catalog_detected" if rc != 0 else "catalog_unnoticed"] += 1
        self.assertClean("every flip")
        print("FLIPS SUMMARY " + json.dumps(counts), file=sys.stderr)

    def test_flipped_file_size_is_an_error(self):
        # Found by the sweep (seed 8): a flip in a file's size in its inode row (5 MiB + 17 ->
        # 4 MiB + 17) restored the shorter file with exit 0 and verify clean. Every place the
        # catalog holds that size (inode rows; stale copies in free pages) is flipped in turn.
        catalog = os.path.join(self.store, "catalog", "data.mdb")
        with open(catalog, "rb") as f:
            data = f.read()
        size = (5 * MiB + 17).to_bytes(8, "little")  # engine/namespace/inode.cc: PutLE
        at = data.find(size)
        refused = detected = 0
        while at >= 0:
            flip(catalog, at + 2)
            try:
                rc, _ = self.verify("catalog offset %d" % (at + 2))
                restored = self.restore_all()  # fails the test on wrong bytes
            finally:
                flip(catalog, at + 2)
            refused += not all(restored.values())
            detected += rc != 0
            self.assertClean("catalog offset %d" % (at + 2))
            at = data.find(size, at + 1)
        self.assertGreater(refused, 0, "no flip reached a live inode row")
        self.assertEqual(detected, refused, "verify and restore disagree")

    def test_flipped_file_name_is_an_error(self):
        # Found by the sweep (seed 31): a flip in a file name (a directory entry's key) restored
        # the file under the changed name with exit 0 and verify clean. Namespace rows carry a
        # checksum now: every place the catalog holds the name is flipped in turn.
        catalog = os.path.join(self.store, "catalog", "data.mdb")
        with open(catalog, "rb") as f:
            data = f.read()
        at = data.find(b"model.pt")
        refused = detected = 0
        while at >= 0:
            flip(catalog, at + 6)  # "model.pt" -> "model.`t"
            try:
                rc, report = self.verify("catalog offset %d" % (at + 6))
                restored = self.restore_all()  # fails the test on other names or bytes
            finally:
                flip(catalog, at + 6)
            if not all(restored.values()):
                refused += 1
                self.assertTrue(report and any("model.`t" in p for p in report["problems"]),
                                "verify does not name the damaged row: %s" % report)
            detected += rc != 0
            self.assertClean("catalog offset %d" % (at + 6))
            at = data.find(b"model.pt", at + 1)
        self.assertGreater(refused, 0, "no flip reached a live directory entry")
        self.assertEqual(detected, refused, "verify and restore disagree")


if __name__ == "__main__":
    mounted.main()
