#!/usr/bin/python3
"""The snapshot engine end to end (docs/snapshot.md), through a real mount and real processes:

1. Four processes snapshot four shards of a GPT-like model + Adam state into one version; it
   is invisible until the fourth commits, then reads bitwise through the mount.
2. A rank SIGKILLed midway: no version appears, the other ranks' wait() fails, and after gc the
   store holds what it held before (chunks, pack bytes, pack files); verify is clean.
3. A second snapshot with half the layers unchanged copies and stores only the changed blocks
   (the engine's counters, the store's growth); the CPU fingerprint equals a reference.
   Changed blocks are stored as deltas against the previous snapshot, and still read bitwise
   once that version is deleted and collected.
4. load_sharded for world size 4 -> 2 and 4 -> 3 gives the unsharded originals.

Run by /usr/bin/python3 as root (exit 77 = skipped without root, FUSE or torch).
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests", "fs"))
sys.path.insert(0, os.path.join(REPO, "python"))
import mounted  # noqa: E402

try:
    import numpy as np  # noqa: E402
    import torch  # noqa: E402
except ImportError:
    mounted.skip_all("needs python3-torch and numpy (run with Debian's /usr/bin/python3)")
import ckptfs  # noqa: E402
from ckptfs import sharded  # noqa: E402

VOCAB, D, LAYERS, SEQ = 2048, 256, 4, 16


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(D)
        self.attn = torch.nn.MultiheadAttention(D, 4, batch_first=True)
        self.ln2 = torch.nn.LayerNorm(D)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(D, 4 * D), torch.nn.GELU(),
                                       torch.nn.Linear(4 * D, D))

    def forward(self, x):
        h = self.ln1(x)
        mask = torch.triu(torch.ones(x.shape[1], x.shape[1], dtype=torch.bool), 1)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyGPT(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = torch.nn.Embedding(VOCAB, D)
        self.wpe = torch.nn.Embedding(SEQ, D)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f = torch.nn.LayerNorm(D)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for b in self.blocks:
            x = b(x)
        return self.ln_f(x) @ self.wte.weight.t()


def train_state(seed, steps=1, frozen_prefix=None):
    """Model + Adam state after `steps` real steps, flattened to {name: tensor}. With
    frozen_prefix, a second phase trains one more step with the blocks whose names start with
    it frozen (their params and moments stay as they were)."""
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    model = TinyGPT()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step():
        idx = torch.randint(0, VOCAB, (2, SEQ))
        loss = torch.nn.functional.cross_entropy(model(idx).reshape(-1, VOCAB), idx.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()

    for _ in range(steps):
        step()
    if frozen_prefix is not None:
        for name, p in model.named_parameters():
            p.requires_grad_(not any(name.startswith(f) for f in frozen_prefix))
        step()
    state = {"model." + k: v.clone() for k, v in model.state_dict().items()}
    names = {id(p): n for n, p in model.named_parameters()}
    for p, s in opt.state.items():
        for k, v in s.items():
            state["optim.%s.%s" % (names[id(p)], k)] = v.clone().reshape(-1) if v.dim() == 0 \
                else v.clone()
    return state


FROZEN = ["blocks.0.", "blocks.1.", "wpe."]  # half the layers (and a small embedding)


# ---- The worker process: one rank ---------------------------------------------------------------

def worker(args):
    mode, rank, world, version, mnt, seed = args[0], int(args[1]), int(args[2]), args[3], \
        args[4], int(args[5])
    state = train_state(seed)
    local, info = sharded.split_state_dict(state, rank, world)
    path = os.path.join(mnt, version)
    if mode == "die":
        # zstd:19 and a one-block ring make persist slow; the rank dies with its pack half written
        store = args[6]
        before = set(os.listdir(os.path.join(store, "packs")))
        big = {"big": torch.randn(16 << 20)}  # 64 MiB more
        local.update(big)
        h = ckptfs.snapshot(local, path, rank, world, info, codec="zstd:19", workers=1,
                            ring_bytes=2 << 20)
        deadline = time.time() + 60
        while time.time() < deadline:
            new = [p for p in set(os.listdir(os.path.join(store, "packs"))) - before]
            if new and os.path.getsize(os.path.join(store, "packs", new[0])) > (2 << 20):
                break
            time.sleep(0.01)
        print("DYING", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "twice":
        h1 = ckptfs.snapshot(local, path, rank, world, info).wait()
        print("FIRST " + json.dumps(h1.stats()), flush=True)
        state2 = train_state(seed, frozen_prefix=["model." + f for f in FROZEN] +
                             ["optim." + f for f in FROZEN])
        local2, info2 = sharded.split_state_dict(state2, rank, world)
        h2 = ckptfs.snapshot(local2, path + "-b", rank, world, info2).wait()
        print("SECOND " + json.dumps(h2.stats()), flush=True)
        return
    if mode == "steps":  # one step, then a second: every block changed a little
        h1 = ckptfs.snapshot(local, path, rank, world, info).wait()
        print("FIRST " + json.dumps(h1.stats()), flush=True)
        local2, info2 = sharded.split_state_dict(train_state(seed, steps=2), rank, world)
        h2 = ckptfs.snapshot(local2, path + "-b", rank, world, info2).wait()
        print("SECOND " + json.dumps(h2.stats()), flush=True)
        return
    h = ckptfs.snapshot(local, path, rank, world, info)
    h.staged()
    print("STAGED", flush=True)
    h.committed()
    print("COMMITTED", flush=True)
    try:
        h.wait()
    except ckptfs.SnapshotError as e:
        print("FAILED " + str(e), flush=True)
        return
    print("DONE " + json.dumps(h.stats()), flush=True)


# ---- The tests --------------------------------------------------------------------------------

def start_rank(mode, rank, world, version, mnt, seed, *extra):
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"))
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", mode,
                             str(rank), str(world), version, mnt, str(seed)] + list(extra),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def wait_line(test, proc, prefix, timeout=180):
    deadline = time.time() + timeout
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            test.fail("worker exited before %s: %s" % (prefix, proc.stderr.read()))
        if line.startswith(prefix):
            return line[len(prefix):].strip()
    test.fail("no %s within %d s" % (prefix, timeout))


def bits(t):
    """The tensor's bytes as a uint8 tensor (bitwise comparisons, also of NaNs)."""
    return torch.from_numpy(np.frombuffer(bytearray(t.contiguous().numpy().tobytes()),
                                          dtype=np.uint8))


def mount_stats(mnt):
    # Settled first (`ckptfs sync`): what was written through the mount is compressed by the
    # background re-encoder, which changes the pack bytes after the write returned.
    os.setxattr(mnt, "user.ckptfs.sync", b"")
    out = os.getxattr(mnt, "user.ckptfs.stats").decode()
    return {k: int(v) for k, v in (line.split() for line in out.splitlines())}


class SnapshotTest(mounted.MountedTestCase):
    mount_options = ["--seal-after", "0"]

    def setUp(self):
        super().setUp()
        self.addCleanup(self.reap)
        self.procs = []

    def reap(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
            p.stdout.close()
            p.stderr.close()

    def rank(self, *args):
        p = start_rank(*args)
        self.procs.append(p)
        return p

    def assertSameTensor(self, a, b, where):
        self.assertEqual((a.dtype, tuple(a.shape)), (b.dtype, tuple(b.shape)), where)
        self.assertTrue(torch.equal(bits(a), bits(b)), where + ": bytes differ")

    def test_four_ranks_publish_one_version_atomically_and_reshard(self):
        version = "global_step100"
        state = train_state(1)
        ranks = [self.rank("normal", r, 4, version, self.mnt, 1) for r in range(3)]
        for p in ranks:
            wait_line(self, p, "COMMITTED")
        time.sleep(0.5)
        self.assertNotIn(version, os.listdir(self.mnt), "visible before the fourth rank")
        self.assertFalse(os.path.exists(self.m.path(version)))
        ranks.append(self.rank("normal", 3, 4, version, self.mnt, 1))
        for p in ranks:
            wait_line(self, p, "DONE")
            self.assertEqual(p.wait(timeout=60), 0)
        self.assertEqual(sorted(os.listdir(self.m.path(version))),
                         ["manifest.json"] + ["rank_%d.safetensors" % r for r in range(4)])
        self.assertEqual(os.getxattr(self.m.path(version), "user.ckptfs.sealed"), b"1")
        # Bitwise through the mount: each rank's file holds exactly its shard.
        for r in range(4):
            local, _ = sharded.split_state_dict(state, r, 4)
            path = self.m.path(version, "rank_%d.safetensors" % r)
            entries, meta = ckptfs.read_safetensors(path)
            self.assertEqual(sorted(entries), sorted(local))
            with open(path, "rb") as f:
                data = f.read()
            for name, t in local.items():
                dtype, shape, off, n = entries[name]
                self.assertEqual(shape, tuple(t.shape), name)
                self.assertEqual(data[off:off + n], bits(t).numpy().tobytes(), name)
            # Also through the views (docs/views.md): per-tensor files and a precision view.
            lazy = ckptfs.lazy_load(path)
            self.assertEqual(sorted(lazy), sorted(local))
            half = ckptfs.lazy_load(path, dtype="fp16")
            for name, t in local.items():
                self.assertSameTensor(lazy[name], t, "view of " + name)
                want = t.half() if t.is_floating_point() else t
                self.assertSameTensor(half[name], want, "fp16 view of " + name)
        # Must-show 4: resharding 4 -> 2 and 4 -> 3 (and 4 -> 1) gives the originals.
        for world in (2, 3, 1):
            parts = [ckptfs.load_sharded(self.m.path(version), r, world) for r in range(world)]
            for name, t in state.items():
                if t.dim() == 0:
                    continue
                for r in range(world):
                    expected, _ = sharded.split_state_dict({name: t}, r, world)
                    self.assertSameTensor(parts[r][name], expected[name],
                                          "%s rank %d/%d" % (name, r, world))
                whole = torch.cat([parts[r][name] for r in range(world)], 0)
                self.assertSameTensor(whole, t, "%s world %d" % (name, world))

    def test_non_tensor_values_are_kept(self):
        torch.manual_seed(2)
        w, m = torch.randn(8, 4), torch.randn(8, 4)
        state = {"model": {"w": w},
                 "optimizer": {"state": {0: {"step": 3, "exp_avg": m}},
                               "param_groups": [{"lr": 0.1, "betas": (0.9, 0.999),
                                                 "params": [0]}]},
                 "step": 7, "name": "run-1", "tensors_in_a_list": [w, 5]}
        ckptfs.snapshot(state, self.m.path("extras"), 0, 1).wait()
        got = ckptfs.load_sharded(self.m.path("extras"), 0, 1)
        self.assertSameTensor(got["model.w"], w, "model.w")
        self.assertSameTensor(got["optimizer.state.0.exp_avg"], m, "exp_avg")
        self.assertSameTensor(got["tensors_in_a_list.0"], w, "list element")
        self.assertEqual(got["optimizer.state.0.step"], 3)
        self.assertEqual(got["optimizer.param_groups"],
                         [{"lr": 0.1, "betas": [0.9, 0.999], "params": [0]}])
        self.assertEqual((got["step"], got["name"], got["tensors_in_a_list.1"]), (7, "run-1", 5))
        # Values JSON cannot hold are refused with a clear error; nothing is pickled.
        with self.assertRaises(ckptfs.SnapshotError) as cm:
            ckptfs.snapshot({"w": w, "odd": object()}, self.m.path("odd"), 0, 1)
        self.assertIn("non-tensor", str(cm.exception))
        self.assertFalse(os.path.exists(self.m.path("odd")))

    def test_a_rank_killed_midway_leaves_no_version_and_gc_leaves_no_orphans(self):
        v1 = "global_step1"
        ranks = [self.rank("normal", r, 4, v1, self.mnt, 1) for r in range(4)]
        for p in ranks:
            wait_line(self, p, "DONE")
        # Compact first: the raw records the re-encoder replaced are holes a gc rewrites away.
        mounted.ckptfs("gc", self.mnt)
        before = mount_stats(self.mnt)
        packs_before = sorted(os.listdir(os.path.join(self.store, "packs")))
        v2 = "global_step2"
        ranks = [self.rank("normal", r, 4, v2, self.mnt, 2) for r in range(3)]
        for p in ranks:
            wait_line(self, p, "COMMITTED")
        dying = self.rank("die", 3, 4, v2, self.mnt, 2, self.store)
        wait_line(self, dying, "DYING")
        self.assertEqual(dying.wait(timeout=60), -signal.SIGKILL)
        for p in ranks:
            msg = wait_line(self, p, "FAILED")
            self.assertIn("abandoned", msg)
            self.assertEqual(p.wait(timeout=60), 0)
        self.assertNotIn(v2, os.listdir(self.mnt))
        mounted.ckptfs("gc", self.mnt)
        after = mount_stats(self.mnt)
        self.assertEqual(after["chunks"], before["chunks"])
        self.assertEqual(after["pack_bytes"], before["pack_bytes"])
        self.assertEqual(sorted(os.listdir(os.path.join(self.store, "packs"))), packs_before)
        self.m.umount()
        report = mounted.ckptfs("verify", self.store)  # exits 1 on any problem
        self.assertIn("no problems", report.stdout)

    def test_a_version_whose_ranks_never_all_arrive_is_abandoned_after_the_timeout(self):
        self.remount(["--seal-after", "0", "--snapshot-timeout", "3"])
        before = mount_stats(self.mnt)
        packs_before = sorted(os.listdir(os.path.join(self.store, "packs")))
        # Two of three ranks commit; the third never starts.
        ranks = [self.rank("normal", r, 3, "global_step5", self.mnt, 5) for r in range(2)]
        for p in ranks:
            wait_line(self, p, "COMMITTED")
        for p in ranks:
            msg = wait_line(self, p, "FAILED", timeout=60)
            self.assertIn("abandoned", msg)
            self.assertIn("2 of 3 ranks committed", msg)
            self.assertEqual(p.wait(timeout=60), 0)
        self.assertNotIn("global_step5", os.listdir(self.mnt))
        mounted.ckptfs("gc", self.mnt)
        after = mount_stats(self.mnt)
        self.assertEqual(after["chunks"], before["chunks"])
        self.assertEqual(sorted(os.listdir(os.path.join(self.store, "packs"))), packs_before)

    def test_unchanged_layers_are_neither_copied_nor_stored(self):
        before = mount_stats(self.mnt)
        p = self.rank("twice", 0, 1, "step1", self.mnt, 3)
        first = json.loads(wait_line(self, p, "FIRST"))
        mid = mount_stats(self.mnt)
        second = json.loads(wait_line(self, p, "SECOND"))
        self.assertEqual(p.wait(timeout=60), 0)
        after = mount_stats(self.mnt)
        s1 = train_state(3)
        s2 = train_state(3, frozen_prefix=["model." + f for f in FROZEN] +
                         ["optim." + f for f in FROZEN])
        changed = [n for n in s1 if not torch.equal(bits(s1[n]), bits(s2[n]))]
        unchanged = [n for n in s1 if n not in changed]
        block = 1 << 20
        nblocks = lambda names: sum(-(-s1[n].numel() * s1[n].element_size() // block)
                                    for n in names)
        nbytes = lambda names: sum(s1[n].numel() * s1[n].element_size() for n in names)
        self.assertGreater(nbytes(unchanged), 0.3 * nbytes(list(s1)))
        self.assertEqual(first["blocks_unchanged"], 0)
        self.assertEqual(first["bytes_copied"], nbytes(list(s1)))
        self.assertEqual(second["blocks_unchanged"], nblocks(unchanged))
        self.assertEqual(second["bytes_copied"], nbytes(changed))
        self.assertEqual(second["records_written"] + second["chunks_deduped"],
                         nblocks(changed) + 1)  # + the header
        # What the store grew by is each snapshot's records (unchanged blocks cost no bytes),
        # plus the rank's pack header and the daemon's record of manifest.json.
        for grown, stats, version in ((after["pack_bytes"] - mid["pack_bytes"], second, "step1-b"),
                                      (mid["pack_bytes"] - before["pack_bytes"], first, "step1")):
            extra = grown - stats["record_bytes"]
            manifest = os.path.getsize(self.m.path(version, "manifest.json"))
            self.assertTrue(32 < extra <= 32 + 64 + manifest + 64,
                            "%s: %d bytes beyond its records" % (version, extra))
        self.assertLess(second["record_bytes"], 0.7 * first["record_bytes"])
        # The second version reads back as the second state.
        entries, _ = ckptfs.read_safetensors(self.m.path("step1-b", "rank_0.safetensors"))
        with open(self.m.path("step1-b", "rank_0.safetensors"), "rb") as f:
            data = f.read()
        for name, t in s2.items():
            _, _, off, n = entries[name]
            self.assertEqual(data[off:off + n], bits(t).numpy().tobytes(), name)

    def test_changed_blocks_are_deltas_that_outlive_their_base(self):
        p = self.rank("steps", 0, 1, "step1", self.mnt, 4)
        first = json.loads(wait_line(self, p, "FIRST"))
        second = json.loads(wait_line(self, p, "SECOND"))
        self.assertEqual(p.wait(timeout=60), 0)
        s2 = train_state(4, steps=2)
        self.assertEqual(first["records_delta"], 0)
        self.assertGreater(second["records_delta"], 0)
        self.assertEqual(second["delta_bases_unreadable"], 0)
        print("\ndeltas: %d of %d records; stored %.3f of the first snapshot's bytes"
              % (second["records_delta"], second["records_written"],
                 second["record_bytes"] / first["record_bytes"]), file=sys.stderr)

        def check(where):
            entries, _ = ckptfs.read_safetensors(self.m.path("step1-b", "rank_0.safetensors"))
            with open(self.m.path("step1-b", "rank_0.safetensors"), "rb") as f:
                data = f.read()
            for name, t in s2.items():
                _, _, off, n = entries[name]
                self.assertEqual(data[off:off + n], bits(t).numpy().tobytes(), where + name)
        check("")
        # The base version goes and is collected: the deltas keep (or gc rebuilds) their bases.
        shutil.rmtree(self.m.path("step1"))
        mounted.ckptfs("gc", self.mnt)
        self.m.remount()  # nothing from the cache
        check("after gc: ")
        self.m.umount()
        report = mounted.ckptfs("verify", self.store)
        self.assertIn("no problems", report.stdout)

    def test_cpu_fingerprint_equals_a_straightforward_reference(self):
        def reference(b):
            M = (1 << 64) - 1

            def mix(x):
                x ^= x >> 33
                x = (x * 0xFF51AFD7ED558CCD) & M
                x ^= x >> 33
                x = (x * 0xC4CEB9FE1A85EC53) & M
                return x ^ (x >> 33)
            b = bytes(b)
            padded = b + bytes(-len(b) % 8)
            lo = hi = 0
            for i in range(len(padded) // 8):
                w = int.from_bytes(padded[8 * i:8 * i + 8], "little")
                lo = (lo + mix(w ^ ((i * 0x9E3779B97F4A7C15 + 0x243F6A8885A308D3) & M))) & M
                hi = (hi + mix(w ^ ((i * 0xC2B2AE3D27D4EB4F + 0x13198A2E03707344) & M))) & M
            n = len(b)
            return mix(lo ^ n), mix((hi + n * 0x9E3779B97F4A7C15) & M)
        rng = np.random.default_rng(5)
        for n in (0, 1, 7, 8, 13, 1000, 65537):
            data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
            self.assertEqual(ckptfs.fingerprint(data), reference(data), n)
        t = torch.randn(1000)
        self.assertEqual(ckptfs.fingerprint(t.numpy()), reference(t.numpy().tobytes()))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2:])
    else:
        mounted.main()
