#!/usr/bin/python3
"""Per-tensor views (docs/views.md): FILE@tensors/ beside every stored checkpoint file.

Must-shows: np.load of every per-tensor file equals the tensor torch.load gives from the
original (tied weights, offset and strided views into shared storages, bf16, optimizer
state); a .pt whose pickle is garbage has no views and reads as plain bytes; a selective load
of 10% of the tensors reads at most 2x their bytes from the store.
"""
import errno
import io
import json
import os
import sys
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from views_common import (bits_equal, escape, flatten, load_safetensors, mounted,  # noqa: E402
                          np, npy_to_torch, read_stats, save_safetensors, torch)


def sample_checkpoint():
    torch.manual_seed(7)
    emb = torch.randn(1000, 64)
    storage = torch.randn(4096)
    model = {
        "embed.weight": emb,
        "head.weight": emb,                       # tied: the same tensor twice
        "slice": storage[100:356],                # offset into a shared storage
        "rows": storage.view(64, 64)[3:9],        # offset, contiguous rows
        "cols": storage.view(64, 64)[:, 5:9],     # strided
        "transposed": torch.randn(33, 17).t(),    # strided (transposed)
        "expanded": torch.randn(5, 1).expand(5, 7),  # stride 0
        "half": torch.randn(31).half(),
        "bf16": torch.randn(3, 5).to(torch.bfloat16),
        "f64": torch.randn(9, dtype=torch.float64),
        "ids": torch.arange(50, dtype=torch.int64),
        "mask": torch.rand(17) > 0.5,
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 4),
    }
    lin = torch.nn.Linear(16, 8)
    opt = torch.optim.Adam(lin.parameters())
    lin(torch.randn(4, 16)).sum().backward()
    opt.step()
    return {"module": model, "optimizer_state_dict": opt.state_dict(), "step": 1}


class TensorViewTest(mounted.MountedTestCase):
    share_mount = True

    def check_view(self, path, expected):
        vdir = path + "@tensors"
        with open(os.path.join(vdir, "index.json")) as f:
            index = json.load(f)
        names = [t["name"] for t in index["tensors"]]
        self.assertEqual(sorted(names), sorted(expected), "index.json names")
        listed = sorted(os.listdir(vdir))
        self.assertEqual(listed, sorted(["index.json"] + [escape(n) + ".npy" for n in expected]))
        for entry in index["tensors"]:
            name = entry["name"]
            arr = np.load(os.path.join(vdir, entry["file"]), mmap_mode="r")
            self.assertEqual(list(arr.shape), entry["shape"], name)
            got = npy_to_torch(arr, entry["dtype"])
            want = expected[name]
            self.assertTrue(bits_equal(want.contiguous(), got), "%s differs" % name)
            self.assertEqual(entry["bytes"], want.numel() * want.element_size(), name)
            self.assertEqual(os.stat(os.path.join(vdir, entry["file"])).st_size,
                             entry["header_bytes"] + entry["bytes"], name)

    def test_torch_file_every_tensor(self):
        d = self.version_dir()
        ckpt = sample_checkpoint()
        path = os.path.join(d, "model.pt")
        torch.save(ckpt, path)
        expected = flatten(torch.load(path))
        self.assertIn("optimizer_state_dict.state.0.exp_avg", expected)
        self.check_view(path, expected)
        # Hidden: ls of the version is unchanged.
        self.assertEqual(os.listdir(d), ["model.pt"])
        # Read-only.
        vdir = path + "@tensors"
        self.assertErrno(errno.EROFS, open, os.path.join(vdir, "new.npy"), "wb")
        self.assertErrno(errno.EROFS, open, os.path.join(vdir, "index.json"), "r+b")
        self.assertErrno(errno.EROFS, os.unlink, os.path.join(vdir, "index.json"))
        self.assertErrno(errno.ENOENT, os.stat, os.path.join(vdir, "nope.npy"))

    def test_safetensors_file(self):
        d = self.version_dir()
        torch.manual_seed(3)
        tensors = {"a.weight": torch.randn(7, 9), "b/slash": torch.arange(10),
                   "c": torch.randn(4).to(torch.bfloat16), "d": torch.randn(2, 2).half()}
        path = os.path.join(d, "model.safetensors")
        save_safetensors(tensors, path)
        self.check_view(path, load_safetensors(path))

    def test_garbage_pickle_has_no_views(self):
        d = self.version_dir()
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
            z.writestr("archive/data.pkl", b"\x80\x02garbage, not a pickle" * 10)
            z.writestr("archive/data/0", os.urandom(4096))
            z.writestr("archive/version", b"3\n")
        path = os.path.join(d, "bad.pt")
        mounted.write_file(path, buf.getvalue())
        self.assertEqual(mounted.read_file(path), buf.getvalue())
        self.assertErrno(errno.ENOENT, os.listdir, path + "@tensors")
        self.assertFalse(os.path.exists(path + "@tensors"))
        # Not a checkpoint at all.
        other = os.path.join(d, "notes.txt")
        mounted.write_file(other, b"hello" * 100)
        self.assertFalse(os.path.exists(other + "@tensors"))

    def test_selective_load_reads_little(self):
        d = self.version_dir()
        torch.manual_seed(11)
        model = {"layers.%d.%s" % (i, n): torch.randn(256, 256)
                 for i in range(10) for n in ("q", "k", "v", "o")}
        path = os.path.join(d, "model.pt")
        torch.save(model, path)
        self.m.remount()  # a cold cache: every byte read comes from the packs
        chosen = ["layers.3.q", "layers.3.k", "layers.7.v", "layers.9.o"]  # 10%
        before = read_stats(self.mnt)
        for name in chosen:
            arr = np.load(os.path.join(path + "@tensors", name + ".npy"))
            self.assertTrue(np.array_equal(arr, model[name].numpy()))
        after = read_stats(self.mnt)
        read = after["pack_read_bytes"] - before["pack_read_bytes"]
        want = sum(model[n].numel() * 4 for n in chosen)
        print("selective load: %d tensor bytes, %d bytes read from packs (%.2fx)"
              % (want, read, read / want), file=sys.stderr)
        self.assertGreater(read, 0)
        self.assertLessEqual(read, 2 * want)


if __name__ == "__main__":
    mounted.main()
