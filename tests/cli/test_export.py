"""diff, export and restore with real torch checkpoints, on a mounted store and an unmounted one;
no pickle code runs in ckptfs (the exported safetensors/npy files are read back with
safetensors/numpy, and compared with what torch saved)."""
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cli_common import json_of, mounted, new_dir, run  # noqa: E402

try:
    import numpy as np  # noqa: E402
    import torch  # noqa: E402
except ImportError:
    mounted.skip_all("needs python3-torch and numpy (run with Debian's /usr/bin/python3)")


def state(step):
    g = torch.Generator().manual_seed(0)
    s = {"model": {"embed.weight": torch.randn(300, 64, generator=g),
                   "layers": [{"w": torch.randn(64, 64, generator=g)} for _ in range(2)],
                   "head": torch.randn(64, 10, generator=g).to(torch.bfloat16)},
         "step": torch.tensor(step)}
    s["model"]["layers"][1]["w"][3, :16] += 0.5 * step  # 16 of 4096 elements change
    return s


def load_safetensors(path):
    """name -> (dtype string, shape, raw bytes), parsed by hand (no safetensors package)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        out[name] = (info["dtype"], info["shape"], data[a:b])
    return out


class ExportDiffRestore(unittest.TestCase):
    def setUp(self):
        self.m = mounted.Mount("export")
        self.addCleanup(self.m.close)
        self.m.mount(["--seal-after", "0"])
        for step in (1, 2):
            d = self.m.path("v%d" % step)
            os.mkdir(d)
            torch.save(state(step), os.path.join(d, "model.pt"))
            with open(os.path.join(d, "notes.txt"), "w") as f:
                f.write("same")
            if step == 2:
                with open(os.path.join(d, "extra.bin"), "wb") as f:
                    f.write(b"x" * 1000)
            self.assertEqual(run("seal", d).returncode, 0)

    def check_diff(self, doc):
        files = {f["path"]: f for f in doc["files"]}
        self.assertEqual(files["notes.txt"]["status"], "unchanged")
        self.assertEqual(files["extra.bin"]["status"], "added")
        self.assertEqual(files["model.pt"]["status"], "changed")
        tensors = {t["name"]: t for t in files["model.pt"]["tensors"]}
        self.assertEqual(tensors["model.embed.weight"]["status"], "unchanged")
        self.assertEqual(tensors["model.head"]["status"], "unchanged")
        w = tensors["model.layers.1.w"]
        self.assertEqual(w["status"], "changed")
        self.assertAlmostEqual(w["changed_fraction"], 16 / 4096)
        expected = float((state(2)["model"]["layers"][1]["w"] -
                          state(1)["model"]["layers"][1]["w"]).abs().max())
        self.assertAlmostEqual(w["max_abs_diff"], expected, places=5)
        self.assertEqual(tensors["step"]["status"], "changed")
        self.assertIsNone(tensors["step"]["max_abs_diff"])  # an integer tensor
        self.assertEqual(doc["summary"]["files"],
                         {"unchanged": 1, "changed": 1, "added": 1, "removed": 0})

    def test_diff_online_and_offline(self):
        online = json_of(self, "diff", self.m.mnt, "v1", "v2")
        self.check_diff(online)
        words = run("diff", self.m.mnt, "v1", "v2")
        self.assertIn("model.layers.1.w", words.stdout)
        self.assertNotIn("model.embed.weight", words.stdout)  # unchanged tensors are not listed
        self.assertEqual(run("diff", self.m.mnt, "v1", "nope").returncode, 1)
        self.m.umount()
        offline = json_of(self, "diff", self.m.store, "v1", "v2")
        self.assertEqual(offline["files"], online["files"])

    def check_safetensors(self, path, step, dtype=None):
        got = load_safetensors(path)
        flat = {"model.embed.weight": state(step)["model"]["embed.weight"],
                "model.layers.0.w": state(step)["model"]["layers"][0]["w"],
                "model.layers.1.w": state(step)["model"]["layers"][1]["w"],
                "model.head": state(step)["model"]["head"], "step": state(step)["step"]}
        self.assertEqual(sorted(got), sorted(flat))
        for name, t in flat.items():
            if dtype is not None and t.is_floating_point():
                t = t.to(dtype)
            st_dtype, shape, raw = got[name]
            self.assertEqual(shape, list(t.shape), name)
            self.assertEqual(raw, t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes(), name)

    def check_pt(self, path, step, dtype=None):
        """The exported file, loaded by torch.load, against what torch saved (flattened)."""
        got = torch.load(path)
        s = state(step)
        flat = {"model.embed.weight": s["model"]["embed.weight"],
                "model.layers.0.w": s["model"]["layers"][0]["w"],
                "model.layers.1.w": s["model"]["layers"][1]["w"],
                "model.head": s["model"]["head"], "step": s["step"]}
        self.assertEqual(sorted(got), sorted(flat))
        for name, t in flat.items():
            if dtype is not None and t.is_floating_point():
                t = t.to(dtype)
            self.assertEqual(got[name].dtype, t.dtype, name)
            self.assertTrue(torch.equal(got[name], t), name)

    def test_export_to_pt_is_torch_loadable_online_and_offline(self):
        out = new_dir("pt")
        doc = json_of(self, "export", self.m.path("v2", "model.pt"),
                      os.path.join(out, "online.pt"), "--to", "pt")
        self.assertEqual(doc["to"], "pt")
        self.assertEqual(doc["tensors"], 5)
        self.assertEqual(doc["bytes"], os.path.getsize(os.path.join(out, "online.pt")))
        self.check_pt(os.path.join(out, "online.pt"), 2)
        # A torch file stays one: exporting the export gives the same tensors.
        p = run("export", os.path.join(out, "online.pt"), os.path.join(out, "again.pt"),
                "--to", "pt")
        self.assertEqual(p.returncode, 1, "a path outside ckptfs is not a SOURCE")
        self.assertEqual(run("export", self.m.path("v2", "model.pt"), os.path.join(out, "online.pt"),
                             "--to", "pt").returncode, 1, "DEST exists")
        self.m.umount()
        p = run("export", os.path.join(self.m.store, "v1", "model.pt"),
                os.path.join(out, "offline.pt"), "--to", "pt", "--dtype", "fp16")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("(pt,", p.stdout)
        self.check_pt(os.path.join(out, "offline.pt"), 1, torch.float16)

    def test_export_online_and_offline(self):
        out = new_dir("out")
        doc = json_of(self, "export", self.m.path("v2", "model.pt"),
                      os.path.join(out, "online.safetensors"), "--to", "safetensors")
        self.assertEqual(doc["tensors"], 5)
        self.check_safetensors(os.path.join(out, "online.safetensors"), 2)
        p = run("export", self.m.path("v2", "model.pt"), os.path.join(out, "npy"), "--to", "npy")
        self.assertEqual(p.returncode, 0, p.stderr)
        w = np.load(os.path.join(out, "npy", "model.layers.1.w.npy"))
        self.assertTrue(np.array_equal(w, state(2)["model"]["layers"][1]["w"].numpy()))
        self.assertEqual(run("export", self.m.path("v2", "notes.txt"),
                             os.path.join(out, "x.safetensors"), "--to", "safetensors"
                             ).returncode, 1)
        self.m.umount()
        p = run("export", os.path.join(self.m.store, "v1", "model.pt"),
                os.path.join(out, "offline.safetensors"), "--to", "safetensors",
                "--dtype", "bf16")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.check_safetensors(os.path.join(out, "offline.safetensors"), 1, torch.bfloat16)

    def test_restore_online_and_offline(self):
        out = new_dir("restore")
        doc = json_of(self, "restore", self.m.mnt, "v2", os.path.join(out, "online"))
        self.assertEqual(doc["files"], 3)
        self.m.umount()
        doc = json_of(self, "restore", self.m.store, "v2", os.path.join(out, "offline"))
        self.assertEqual(doc["files"], 3)
        for side in ("online", "offline"):
            loaded = torch.load(os.path.join(out, side, "model.pt"))
            mounted.assert_same_objects(self, state(2), loaded)
            with open(os.path.join(out, side, "notes.txt")) as f:
                self.assertEqual(f.read(), "same")
        self.assertEqual(run("restore", self.m.store, "v2", os.path.join(out, "offline")
                             ).returncode, 1, "restore into an existing directory")


if __name__ == "__main__":
    mounted.main()
