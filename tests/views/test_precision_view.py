#!/usr/bin/python3
"""Precision views (docs/views.md): VERSION@bf16/, VERSION@fp16/, VERSION@fp32/.

Must-show: torch.load of the bf16 and fp16 views equals t.to(torch.bfloat16) / t.half()
bitwise, for a model file and an optimizer file; a safetensors file's views likewise; sizes are
known at stat; other files and integers pass unchanged; views are read-only and hidden.
"""
import errno
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from views_common import (bits_equal, flatten, load_safetensors, mounted,  # noqa: E402
                          save_safetensors, torch)

VIEWS = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def converted(t, dtype):
    return t.to(dtype) if t.is_floating_point() else t


def model_and_optimizer():
    torch.manual_seed(5)
    model = torch.nn.Sequential(torch.nn.Embedding(300, 48), torch.nn.Linear(48, 48),
                                torch.nn.LayerNorm(48), torch.nn.Linear(48, 300, bias=False))
    model[3].weight = model[0].weight  # tied
    opt = torch.optim.Adam(model.parameters())
    for _ in range(2):
        model(torch.randint(0, 300, (4, 7))).sum().backward()
        opt.step()
    sd = model.state_dict()
    sd["extra.half"] = torch.randn(10).half()
    sd["extra.bf16"] = torch.randn(10).to(torch.bfloat16)
    sd["extra.f64"] = torch.randn(10, dtype=torch.float64)
    sd["extra.ids"] = torch.arange(20)
    sd["extra.tiny"] = torch.tensor([1e-30, 7e-8, 65519.0, 70000.0, -1e9, 0.0, -0.0])
    sd["extra.slice"] = torch.randn(100)[10:30]
    sd["extra.t"] = torch.randn(6, 4).t()
    return {"module": sd, "step": 2}, {"optimizer_state_dict": opt.state_dict(), "step": 2}


class PrecisionViewTest(mounted.MountedTestCase):
    share_mount = True

    def check_torch(self, version, name, original):
        expected = flatten(original)
        for view, dtype in VIEWS.items():
            path = os.path.join(self.mnt, version + "@" + view, name)
            size = os.stat(path).st_size
            with open(path, "rb") as f:
                self.assertEqual(len(f.read()), size, "stat size of " + path)
            got = flatten(torch.load(path))
            self.assertEqual(sorted(got), sorted(expected), path)
            for key, t in expected.items():
                self.assertTrue(bits_equal(converted(t, dtype), got[key]),
                                "%s: %s differs" % (path, key))
            # The non-tensor parts are the same too.
            loaded = torch.load(path)
            self.assertEqual(loaded["step"], original["step"])

    def test_model_and_optimizer_files(self):
        d = self.version_dir("v1")
        model, optim = model_and_optimizer()
        torch.save(model, os.path.join(d, "model_states.pt"))
        torch.save(optim, os.path.join(d, "optim_states.pt"))
        os.mkdir(os.path.join(d, "sub"))
        torch.save(model, os.path.join(d, "sub", "nested.pt"))
        mounted.write_file(os.path.join(d, "notes.txt"), b"plain bytes\n")
        self.check_torch("v1", "model_states.pt", torch.load(os.path.join(d, "model_states.pt")))
        self.check_torch("v1", "optim_states.pt", torch.load(os.path.join(d, "optim_states.pt")))
        self.check_torch("v1", "sub/nested.pt", torch.load(os.path.join(d, "sub", "nested.pt")))
        # Other files pass unchanged; the view lists what the version lists; all hidden.
        self.assertEqual(mounted.read_file(self.m.path("v1@bf16", "notes.txt")), b"plain bytes\n")
        self.assertEqual(sorted(os.listdir(self.m.path("v1@bf16"))), sorted(os.listdir(d)))
        self.assertNotIn("v1@bf16", os.listdir(self.mnt))
        # A bf16 view shrinks the fp32 tensors.
        self.assertLess(os.stat(self.m.path("v1@bf16", "model_states.pt")).st_size,
                        0.6 * os.stat(os.path.join(d, "model_states.pt")).st_size)
        # Read-only.
        self.assertErrno(errno.EROFS, open, self.m.path("v1@bf16", "x.pt"), "wb")
        self.assertErrno(errno.EROFS, open, self.m.path("v1@bf16", "notes.txt"), "r+b")
        self.assertErrno(errno.EROFS, os.mkdir, self.m.path("v1@bf16", "dir"))
        self.assertErrno(errno.ENOENT, os.stat, self.m.path("nope@bf16"))
        # Per-tensor views inside a precision view are converted too.
        arr_dir = self.m.path("v1@bf16", "model_states.pt@tensors")
        self.assertIn("index.json", os.listdir(arr_dir))

    def test_views_follow_a_rewrite_at_once(self):
        # The kernel caches a view's attributes and pages like a file's; a rewrite of the real
        # file (larger, smaller, same size) must show in its view right away, not after the
        # attribute timeout (the daemon invalidates the view's inode at the commit).
        d = self.version_dir("v3")
        view = self.m.path("v3", "notes.txt@fp32")
        for data in (b"A" * 10, b"B" * 10, b"C" * 20, b"DD"):
            with open(os.path.join(d, "notes.txt"), "wb") as f:
                f.write(data)
            self.assertEqual(mounted.read_file(view), data)
            self.assertEqual(os.stat(view).st_size, len(data))

    def test_view_inodes_the_kernel_forgot_do_not_pile_up(self):
        # Every view name looked up is an inode of the daemon's. It keeps those the kernel holds
        # and a bounded number of the others (docs/views.md), so views looked up by the
        # thousands over a mount's life do not grow it: after the kernel drops its caches
        # (FORGET), a second round of new names takes the first round's place.
        d = self.version_dir("many_views")
        for i in range(800):
            with open(os.path.join(d, "f%d.bin" % i), "wb") as f:
                f.write(b"x")

        def look_up(first, last):
            for i in range(first, last):
                for suffix in ("@bf16", "@fp16", "@fp32"):
                    os.stat(os.path.join(d, "f%d.bin%s" % (i, suffix)))

        def view_inodes():
            with open(self.m.path(".ckptfs", "stats")) as f:
                return json.load(f)["daemon"]["view_inodes"]

        look_up(0, 400)
        self.assertGreaterEqual(view_inodes(), 1200)
        try:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("2\n")
        except OSError as e:
            self.skipTest("cannot drop the kernel's caches: %s" % e)
        time.sleep(1.2)  # the kernel's FORGETs arrive; the first round's inodes go idle
        look_up(400, 800)
        # Without FORGET both rounds stay (2400 and more); a FORGET that comes late leaves its
        # inode until a later sweep.
        self.assertLess(view_inodes(), 1800)

    def test_safetensors(self):
        d = self.version_dir("v2")
        torch.manual_seed(9)
        tensors = {"w": torch.randn(17, 5), "b": torch.randn(5), "h": torch.randn(8).half(),
                   "ids": torch.arange(12), "z": torch.randn(3, 3, dtype=torch.float64)}
        save_safetensors(tensors, os.path.join(d, "model.safetensors"))
        for view, dtype in VIEWS.items():
            got = load_safetensors(self.m.path("v2@" + view, "model.safetensors"))
            self.assertEqual(sorted(got), sorted(tensors))
            for k, t in tensors.items():
                self.assertTrue(bits_equal(converted(t, dtype), got[k]), "%s %s" % (view, k))


if __name__ == "__main__":
    mounted.main()
