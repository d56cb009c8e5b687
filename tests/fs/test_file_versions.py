#!/usr/bin/python3
"""File versions (docs/fs.md "File versions", issue 19): frameworks that write each checkpoint
as a new file in one directory get one version per file.

A real training loop (a small MLP + Adam, trained between saves) writes Lightning's checkpoint
dict (`epoch`, `global_step`, `pytorch-lightning_version`, `state_dict`, `optimizer_states`)
with torch.save as `lightning_logs/version_0/checkpoints/epoch=E-step=S.ckpt`, after the user
marked `lightning_logs` with `user.ckptfs.file_versions`; a second loop writes
`ckpt_{step}.pt` at the root of a mount whose root is marked. Then, with real cp/ls/rm and
torch: older checkpoints seal on their own once a newer one exists (EROFS on change, deletable
as Lightning's save_top_k does), the newest stays writable, the container directory is never
sealed, `ckptfs seal FILE` seals one, the precision view `FILE@bf16` and `FILE@tensors` read
right, `ckptfs.lazy_load(dtype=...)` works, `ckptfs log --json` lists every checkpoint as a
version of kind "file" with its step, and `ckptfs diff` compares two of them per tensor.
"""
import errno
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mounted  # noqa: E402

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None

SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MARK = "user.ckptfs.file_versions"


def train_and_save(paths, seed=0):
    """Trains a small model, saving Lightning's checkpoint dict at each of `paths` in turn."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 256))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    states = []
    step = 0
    for i, path in enumerate(paths):
        for _ in range(5):
            x = torch.randn(32, 256)
            loss = (model(x) - x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
        state = {"epoch": 0, "global_step": step, "pytorch-lightning_version": "2.1.0",
                 "state_dict": {k: v.clone() for k, v in model.state_dict().items()},
                 "optimizer_states": [opt.state_dict()], "lr_schedulers": []}
        torch.save(state, path)
        states.append(state)
    return states


def log_json(target):
    out = mounted.ckptfs("log", target, "--json").stdout
    return json.loads(out)["versions"]


def sealed(path):
    return os.getxattr(path, "user.ckptfs.sealed") == b"1"


class FileVersionsTest(mounted.MountedTestCase):
    mount_options = ["--seal-after", "1"]

    def setUp(self):
        if torch is None:
            raise SystemExit(77)
        super().setUp()

    def assertErrno(self, err, fn, *args, **kwargs):
        with self.assertRaises(OSError) as cm:
            fn(*args, **kwargs)
        self.assertEqual(cm.exception.errno, err, repr(cm.exception))

    def test_lightning_layout(self):
        logs = self.m.path("lightning_logs")
        os.mkdir(logs)
        mounted.ckptfs("file-versions", logs)  # = setfattr -n user.ckptfs.file_versions -v 1
        ckpts = os.path.join(logs, "version_0", "checkpoints")
        os.makedirs(ckpts)
        # hparams.yaml beside the checkpoints, as Lightning writes it: an ordinary file.
        mounted.write_file(os.path.join(logs, "version_0", "hparams.yaml"), b"lr: 0.001\n")
        names = ["epoch=0-step=%d.ckpt" % (5 * (i + 1)) for i in range(4)]
        paths = [os.path.join(ckpts, n) for n in names]
        states = train_and_save(paths)
        self.assertEqual(sorted(os.listdir(ckpts)), sorted(names))
        # Older checkpoints seal on their own (--seal-after 1); the newest stays writable.
        self.assertTrue(mounted.wait_until(lambda: all(sealed(p) for p in paths[:-1]), 30),
                        [sealed(p) for p in paths])
        self.assertFalse(sealed(paths[-1]))
        for p in paths[:-1]:
            self.assertErrno(errno.EROFS, open, p, "r+b")
            self.assertErrno(errno.EROFS, open, p, "wb")
            self.assertErrno(errno.EROFS, os.truncate, p, 10)
            self.assertErrno(errno.EROFS, os.chmod, p, 0o600)
        # The container is not a version: new files and directories still go in.
        self.assertEqual(os.getxattr(logs, "user.ckptfs.sealed"), b"0")
        os.mkdir(self.m.path("other_dir"))  # a newer top-level directory does not seal it
        mounted.write_file(os.path.join(logs, "version_0", "events.out"), b"x" * 100)
        # Every checkpoint reads back as saved, through torch.
        for p, want in zip(paths, states):
            got = torch.load(p, weights_only=False)
            self.assertEqual(got["global_step"], want["global_step"])
            for k, v in want["state_dict"].items():
                self.assertTrue(torch.equal(got["state_dict"][k], v), k)
        # Explicit seal of the newest, then `ckptfs log` sees four sealed file versions.
        mounted.ckptfs("seal", paths[-1])
        self.assertTrue(sealed(paths[-1]))
        not_version = mounted.ckptfs("seal", os.path.join(logs, "version_0", "hparams.yaml"),
                                     check=False)
        self.assertEqual(not_version.returncode, 1, not_version.stderr)
        self.assertIn("is not a version", not_version.stderr)
        versions = log_json(self.mnt)
        files = [v for v in versions if v["kind"] == "file"]
        rel = [os.path.relpath(p, self.mnt) for p in paths]
        self.assertEqual([v["name"] for v in files], rel)  # creation order
        self.assertNotIn("lightning_logs", [v["name"] for v in versions])
        self.assertEqual([v["metadata"]["global_step"] for v in files], [5, 10, 15, 20])
        self.assertTrue(all(v["sealed"] and v["files"] == 1 for v in files))
        self.assertTrue(all(v["metadata"]["layout"] == "lightning" for v in files))
        # Deltas: every later checkpoint adds fewer bytes than the first (found by layout).
        for v in files[1:]:
            self.assertLess(v["added_bytes"], files[0]["added_bytes"], v)
        # Per-tensor diff of two file versions.
        diff = json.loads(mounted.ckptfs("diff", self.mnt, rel[0], rel[1], "--json").stdout)
        self.assertEqual(len(diff["files"]), 1)
        self.assertEqual(diff["files"][0]["status"], "changed")
        changed = {t["name"] for t in diff["files"][0]["tensors"] if t["status"] == "changed"}
        self.assertIn("state_dict.0.weight", changed)
        # Views of a file version: FILE@bf16 is a torch file, FILE@tensors its tensors.
        bf16 = torch.load(paths[1] + "@bf16", weights_only=False)
        for k, v in states[1]["state_dict"].items():
            self.assertEqual(bf16["state_dict"][k].dtype, torch.bfloat16)
            self.assertTrue(torch.equal(bf16["state_dict"][k], v.to(torch.bfloat16)), k)
        with open(os.path.join(paths[1] + "@tensors", "index.json")) as f:
            names_in_view = {t["name"] for t in json.load(f)["tensors"]}
        self.assertIn("state_dict.2.bias", names_in_view)
        sys.path.insert(0, os.path.join(SOURCE, "python"))
        import ckptfs  # noqa: E402
        lazy = ckptfs.lazy_load(paths[2], dtype="bf16")
        self.assertTrue(torch.equal(lazy["state_dict.0.weight"],
                                    states[2]["state_dict"]["0.weight"].to(torch.bfloat16)))
        # save_top_k: Lightning deletes older checkpoints; sealed ones go with plain rm.
        os.unlink(paths[0])
        subprocess.run(["rm", "-f", paths[1]], check=True)
        self.assertEqual(sorted(os.listdir(ckpts)), sorted(names[2:]))
        self.remount()
        self.assertTrue(sealed(paths[2]))
        self.assertEqual([v["name"] for v in log_json(self.mnt) if v["kind"] == "file"], rel[2:])

    def test_step_loop_at_a_marked_root(self):
        os.setxattr(self.mnt, MARK, b"1")
        paths = [self.m.path("ckpt_%d.pt" % s) for s in (100, 200, 300)]
        states = train_and_save(paths, seed=1)
        self.assertTrue(mounted.wait_until(lambda: sealed(paths[0]) and sealed(paths[1]), 30))
        self.assertFalse(sealed(paths[2]))
        self.assertErrno(errno.EROFS, open, paths[0], "ab")
        # cp of a sealed checkpoint makes a new, writable file version.
        copy = self.m.path("ckpt_400.pt")
        subprocess.run(["cp", paths[1], copy], check=True)
        self.assertFalse(sealed(copy))
        self.assertEqual(mounted.read_file(copy), mounted.read_file(paths[1]))
        files = [v for v in log_json(self.mnt) if v["kind"] == "file"]
        self.assertEqual([v["name"] for v in files],
                         ["ckpt_100.pt", "ckpt_200.pt", "ckpt_300.pt", "ckpt_400.pt"])
        self.assertFalse(files[-1]["sealed"])
        # The step the checkpoint itself records (its pickle's global_step: 5 optimizer steps
        # per save; the copy is the step-10 checkpoint) wins over the digits of the name.
        self.assertEqual([v["metadata"]["global_step"] for v in files], [5, 10, 15, 10])
        self.assertEqual([v["metadata"]["step_source"] for v in files],
                         ["ckpt_100.pt", "ckpt_200.pt", "ckpt_300.pt", "ckpt_400.pt"])
        self.assertEqual(files[0]["metadata"]["framework"], {"pytorch_lightning": "2.1.0"})
        got = torch.load(paths[2], weights_only=False)
        want = states[2]["state_dict"]["2.weight"]
        self.assertTrue(torch.equal(got["state_dict"]["2.weight"], want))
        sys.path.insert(0, os.path.join(SOURCE, "python"))
        import ckptfs  # noqa: E402
        lazy = ckptfs.lazy_load(paths[2], dtype="bf16")  # a file at the root: FILE@bf16@tensors
        self.assertTrue(torch.equal(lazy["state_dict.2.weight"], want.to(torch.bfloat16)))
        # restore (online) gives the file back; forget keeps the last two (the unsealed
        # newest is never removed).
        out = os.path.join(os.path.dirname(self.m.store), "restored")
        mounted.ckptfs("restore", self.mnt, "ckpt_200.pt", out)
        self.assertEqual(os.listdir(out), ["ckpt_200.pt"])
        self.assertEqual(mounted.read_file(os.path.join(out, "ckpt_200.pt")),
                         mounted.read_file(paths[1]))
        self.assertTrue(mounted.wait_until(lambda: sealed(paths[2]), 30))
        mounted.ckptfs("forget", self.mnt, "--keep-last", "2")
        self.assertEqual(sorted(f for f in os.listdir(self.mnt) if f.endswith(".pt")),
                         ["ckpt_300.pt", "ckpt_400.pt"])
        paths = paths[2:]
        # Unmarking the root: sealed files stay sealed, new checkpoint files are ordinary.
        os.removexattr(self.mnt, MARK)
        mounted.write_file(self.m.path("ckpt_500.pt"), b"plain")
        self.assertTrue(sealed(paths[0]))
        names = [v["name"] for v in log_json(self.mnt)]
        self.assertNotIn("ckpt_500.pt", names)
        # Offline, the store lists the same versions.
        self.m.umount()
        offline = [v["name"] for v in log_json(self.store)]
        self.assertEqual(offline, names)


if __name__ == "__main__":
    mounted.main()
