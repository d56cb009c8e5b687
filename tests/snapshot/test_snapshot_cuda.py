"""The snapshot engine on a real GPU, end to end: CUDA tensors of a training-like state dict go
through ckptfs.snapshot (python/ckptfs, libckptfs_snapshot.so built with -DCKPTFS_CUDA=ON) into
a real mount, and read back bitwise through the mount's files.

What it checks, on the device (docs/snapshot.md, "GPU"):
- the engine picks the CUDA backend for device tensors;
- every byte of the version equals the device tensor's bytes (fp32, bf16, int64, odd sizes
  that end inside a block, an empty tensor);
- after staged() the tensors may be overwritten at once: the version keeps what they held;
- a second snapshot after changing 10% of the tensors copies exactly the changed tensors'
  bytes off the device and counts every other block unchanged.

Needs root, FUSE and a python3 whose torch sees a CUDA device; exit 77 = skipped otherwise
(always on CI, which has no GPU). Run by scripts/gpu_check.sh.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tests", "fs"))
sys.path.insert(0, os.path.join(REPO, "python"))
import mounted  # noqa: E402

try:
    import torch  # noqa: E402
except ImportError:
    mounted.skip_all("needs torch and numpy")
if not torch.cuda.is_available():
    mounted.skip_all("needs a CUDA device (torch.cuda.is_available() is False)")
import ckptfs  # noqa: E402

BLOCK = 1 << 20


def host_bytes(t):
    """The tensor's bytes, copied to the host (bitwise, also of NaNs and bf16)."""
    t = t.detach().contiguous().cpu()
    return t.view(torch.uint8).numpy().tobytes() if t.numel() else b""


def host_copy(state):
    """{name: (shape, bytes)} of a state dict of device tensors."""
    return {n: (tuple(t.shape), host_bytes(t)) for n, t in state.items()}


def make_state(seed):
    """~600 MiB on the GPU: Adam-like fp32 triples, bf16 weights, integers, odd sizes."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    state = {}
    for i in range(8):
        n = (16 << 20) + 12345 * i  # 64 MiB of fp32 plus a tail inside a block
        state["model.layer%d.weight" % i] = torch.randn(n, device="cuda", generator=g)
        state["optim.layer%d.exp_avg" % i] = torch.randn(n, device="cuda", generator=g) * 1e-3
        state["optim.layer%d.exp_avg_sq" % i] = torch.rand(n, device="cuda", generator=g) * 1e-6
    for i in range(4):
        state["model.bf16.%d" % i] = torch.randn((1024, 4097), device="cuda",
                                                 generator=g).to(torch.bfloat16)
    state["model.positions"] = torch.arange(3 << 20, device="cuda", dtype=torch.int64)
    state["model.tiny"] = torch.randn(7, device="cuda", generator=g)
    state["model.empty"] = torch.empty(0, device="cuda")
    return state


def nblocks(t):
    return -(-t.numel() * t.element_size() // BLOCK)


class CudaSnapshotTest(mounted.MountedTestCase):
    mount_options = ["--seal-after", "0"]

    def assertVersionHolds(self, version, expected):
        path = self.m.path(version, "rank_0.safetensors")
        entries, _ = ckptfs.read_safetensors(path)
        self.assertEqual(sorted(entries), sorted(expected))
        with open(path, "rb") as f:
            data = f.read()
        for name, (want_shape, want) in expected.items():
            _, shape, off, n = entries[name]
            self.assertEqual(tuple(shape), want_shape, name)
            self.assertEqual(n, len(want), name)
            self.assertTrue(data[off:off + n] == want, "%s: bytes differ" % name)

    def test_device_tensors_round_trip_and_unchanged_blocks_are_not_copied(self):
        state = make_state(1)
        torch.cuda.synchronize()
        before = host_copy(state)
        h = ckptfs.snapshot(state, self.m.path("step1"), 0, 1)
        self.assertEqual(h.backend, "cuda")
        h.staged()
        # The tensors may be modified once staged: the version keeps the bytes they held.
        for t in state.values():
            if t.numel():
                t.zero_()
        torch.cuda.synchronize()
        first = h.wait().stats()
        total = sum(len(b) for _, b in before.values())
        self.assertEqual(first["bytes"], total)
        self.assertEqual(first["bytes_copied"], total)
        self.assertEqual(first["blocks_unchanged"], 0)
        self.assertVersionHolds("step1", before)

        # Second snapshot of the original state with 10% of the tensors changed.
        state = make_state(1)
        names = sorted(state)
        changed = [n for i, n in enumerate(names) if i % 10 == 3]
        for n in changed:
            state[n].add_(1)
        torch.cuda.synchronize()
        after = host_copy(state)
        second = ckptfs.snapshot(state, self.m.path("step2"), 0, 1).wait().stats()
        unchanged = [n for n in names if n not in changed]
        self.assertEqual(second["bytes_copied"], sum(len(after[n][1]) for n in changed))
        self.assertEqual(second["blocks_unchanged"], sum(nblocks(state[n]) for n in unchanged))
        self.assertVersionHolds("step2", after)
        # The first version is untouched by the second.
        self.assertVersionHolds("step1", before)
        print("GPU snapshot: first %.2f s staged / %.2f s total for %.0f MiB; second copied "
              "%.0f MiB of %.0f MiB" % (first["stage_seconds"], first["total_seconds"],
                                         total / 2**20, second["bytes_copied"] / 2**20,
                                         total / 2**20), file=sys.stderr)

    def test_two_devices_worth_of_ranks_in_one_process_publish_one_version(self):
        # Two ranks of one version from one process (the way a single-GPU job checks sharding):
        # the version appears once both committed, each rank file holds its shard.
        state = make_state(2)
        torch.cuda.synchronize()
        parts = [{n: state[n] for i, n in enumerate(sorted(state)) if i % 2 == r}
                 for r in range(2)]
        handles = [ckptfs.snapshot(parts[r], self.m.path("step3"), r, 2) for r in range(2)]
        for h in handles:
            h.wait()
        self.assertEqual(sorted(os.listdir(self.m.path("step3"))),
                         ["manifest.json", "rank_0.safetensors", "rank_1.safetensors"])
        for r in range(2):
            path = self.m.path("step3", "rank_%d.safetensors" % r)
            entries, _ = ckptfs.read_safetensors(path)
            with open(path, "rb") as f:
                data = f.read()
            self.assertEqual(sorted(entries), sorted(parts[r]))
            for name, t in parts[r].items():
                _, _, off, n = entries[name]
                self.assertTrue(data[off:off + n] == host_bytes(t), name)


if __name__ == "__main__":
    mounted.main()
