#!/usr/bin/python3
"""Must-show 6: four processes save four rank files into one version at once (as the ranks of
a data-parallel job do) while two other processes read files written before; every byte read
and every byte written back must be right."""
import hashlib
import multiprocessing
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mounted  # noqa: E402

MiB = 1 << 20
RANKS, READERS = 4, 2
RANK_BYTES = 28 * MiB + 4321
OLD_BYTES = 24 * MiB


def payload(seed, n):
    return random.Random(seed).randbytes(n)


def sha(b):
    return hashlib.sha256(b).hexdigest()


def write_rank(path, rank, barrier):
    """Writes like torch.save: many writes of assorted sizes; rank 3 also patches its header
    afterwards (the staging path), the others stream."""
    data = payload(1000 + rank, RANK_BYTES)
    barrier.wait()
    with open(path, "wb") as f:
        pos, sizes = 0, [64, 4096, MiB, 3 * MiB + 7, 512 * 1024]
        i = 0
        while pos < len(data):
            n = sizes[i % len(sizes)]
            f.write(data[pos:pos + n])
            pos += n
            i += 1
        if rank == 3:
            f.seek(0)
            f.write(data[:4096])
        os.fsync(f.fileno())
    return sha(data)


def read_old(paths, want, barrier, done):
    """Reads the already-written files again and again until the writers are done."""
    barrier.wait()
    rounds = 0
    while True:
        for p in paths:
            with open(p, "rb") as f:
                got = f.read()
            if sha(got) != want[p]:
                return "%s: read %d bytes that differ from what was written" % (p, len(got))
        rounds += 1
        if done.is_set():
            return rounds


def run_in_process(fn, args, results, key):
    try:
        results[key] = fn(*args)
    except BaseException as e:  # reported by the parent
        results[key] = "error: %r" % (e,)


class ConcurrentRanksTest(mounted.MountedTestCase):
    def test_four_writers_two_readers(self):
        ctx = multiprocessing.get_context("fork")  # no torch here: fork is safe and quick
        old_dir = self.version_dir("global_step1")
        new_dir = self.version_dir("global_step2")
        old = {}
        for i in range(READERS):
            p = os.path.join(old_dir, "zero_pp_rank_%d_mp_rank_00_optim_states.pt" % i)
            data = payload(500 + i, OLD_BYTES)
            with open(p, "wb") as f:
                f.write(data)
            old[p] = sha(data)
        mounted.ckptfs("sync", self.mnt)
        if hasattr(os, "posix_fadvise"):  # make the readers go to the daemon, not the cache
            for p in old:
                with open(p, "rb") as f:
                    os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)

        manager = ctx.Manager()
        results = manager.dict()
        barrier = ctx.Barrier(RANKS + READERS)
        done = ctx.Event()
        paths = [os.path.join(new_dir, "zero_pp_rank_%d_mp_rank_00_optim_states.pt" % r)
                 for r in range(RANKS)]
        writers = [ctx.Process(target=run_in_process,
                               args=(write_rank, (paths[r], r, barrier), results, "w%d" % r))
                   for r in range(RANKS)]
        readers = [ctx.Process(target=run_in_process,
                               args=(read_old, (list(old) if i == 0 else list(old)[::-1], old,
                                                barrier, done), results, "r%d" % i))
                   for i in range(READERS)]
        t0 = time.monotonic()
        try:
            for p in writers + readers:
                p.start()
            for p in writers:
                p.join(240)
            done.set()
            for p in readers:
                p.join(240)
        finally:
            for p in writers + readers:
                if p.is_alive():
                    p.kill()
                    p.join()
        elapsed = time.monotonic() - t0
        results = dict(results)
        manager.shutdown()
        print("writers and readers took %.1fs: %s" % (elapsed, results), file=sys.stderr)

        for r in range(RANKS):
            self.assertEqual(results.get("w%d" % r), sha(payload(1000 + r, RANK_BYTES)),
                             "writer %d" % r)
        for i in range(READERS):
            self.assertIsInstance(results.get("r%d" % i), int, "reader %d: %s"
                                  % (i, results.get("r%d" % i)))
            self.assertGreaterEqual(results["r%d" % i], 1)

        def check():
            for r, p in enumerate(paths):
                self.assertEqual(os.stat(p).st_size, RANK_BYTES, p)
                with open(p, "rb") as f:
                    self.assertEqual(sha(f.read()), results["w%d" % r], p)
            for p, want in old.items():
                with open(p, "rb") as f:
                    self.assertEqual(sha(f.read()), want, p)

        check()
        self.remount()
        check()
        self.m.umount()
        self.assertIn("no problems", mounted.ckptfs("verify", self.store).stdout)


def request_threads(pid):
    """The daemon's libfuse request threads (unnamed: they keep the process's name) by id."""
    out = set()
    for tid in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/comm" % (pid, tid)) as f:
                if f.read().strip() == "ckptfs":
                    out.add(int(tid))
        except FileNotFoundError:  # exited meanwhile
            pass
    return out


class RequestThreadsTest(mounted.MountedTestCase):
    def test_request_threads_serve_many_requests(self):
        """libfuse's request threads are a pool: a thread serves request after request. (Built
        against the pre-3.12 loop API with a 3.12 config, libfuse read the config's version tag
        as clone_fd and its clone_fd as max_idle_threads = 0: every request started a thread,
        which cloned /dev/fuse, and ended it; a quarter of the daemon's CPU on saves.)"""
        path = os.path.join(self.version_dir(), "file.bin")
        data = payload(7, 64 * MiB)
        with open(path, "wb") as f:
            f.write(data)
        mounted.ckptfs("sync", self.mnt)
        pid = self.m.pid

        def read_cold():
            with open(path, "rb") as f:
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
                got = bytearray()
                while True:  # 1 MiB reads: one FUSE request each, the page cache dropped
                    b = f.read(MiB)
                    if not b:
                        break
                    got += b
            self.assertEqual(sha(bytes(got)), sha(data))

        read_cold()
        before = request_threads(pid)
        self.assertTrue(before, "no request threads found")
        read_cold()
        after = request_threads(pid)
        self.assertLessEqual(before, after,
                             "request threads ended after serving requests: %s before, %s after"
                             % (sorted(before), sorted(after)))


if __name__ == "__main__":
    mounted.main()
