"""The store's life from the command line, on a mounted store (through the daemon) and on an
unmounted one (the command opens it), with real torch checkpoints: init, log, stats, verify,
status, forget (then gc), every --json document checked against tests/cli/schemas.json."""
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cli_common import json_of, mounted, new_dir, run, status_of  # noqa: E402

try:
    import torch  # noqa: E402
except ImportError:
    mounted.skip_all("needs python3-torch (run with Debian's /usr/bin/python3)")


def model_state(step):
    """A small model whose first layer changes at every step and the rest never."""
    g = torch.Generator().manual_seed(0)
    state = {"embed.weight": torch.randn(512, 256, generator=g),
             "layer.0.weight": torch.randn(256, 256, generator=g),
             "layer.1.weight": torch.randn(256, 256, generator=g),
             "head.bias": torch.zeros(256)}
    state["embed.weight"][step % 512] += float(step)
    return state


def save_version(mnt, name, step):
    d = os.path.join(mnt, name)
    os.mkdir(d)
    torch.save(model_state(step), os.path.join(d, "model.pt"))
    with open(os.path.join(d, "trainer_state.json"), "w") as f:
        json.dump({"global_step": step, "epoch": 0.5}, f)
    return d


class Lifecycle(unittest.TestCase):
    def setUp(self):
        self.m = mounted.Mount("life")
        self.addCleanup(self.m.close)
        p = run("init", self.m.store, "--codec", "lz4")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.m.mount(["--seal-after", "0"])

    def save_steps(self, steps):
        for step in steps:
            d = save_version(self.m.mnt, "global_step%d" % step, step)
            self.assertEqual(run("seal", d).returncode, 0)

    def test_log_online_and_offline_agree(self):
        # A slow re-encoder (fs/mount.cc's test switch holds each re-encoding 1.5 s): log still
        # reports the final encoding, not however far the re-encoder got.
        self.m.umount()
        os.environ["CKPTFS_TEST_REENCODE_PAUSE_MS"] = "1500"
        self.addCleanup(os.environ.pop, "CKPTFS_TEST_REENCODE_PAUSE_MS", None)
        self.m.mount(["--seal-after", "0"])
        self.save_steps([100, 200, 300])
        online = json_of(self, "log", self.m.mnt)
        self.assertEqual(online["mount"], os.path.realpath(self.m.mnt))
        versions = online["versions"]
        self.assertEqual([v["name"] for v in versions],
                         ["global_step100", "global_step200", "global_step300"])
        self.assertEqual([v["seq"] for v in versions], sorted(v["seq"] for v in versions))
        for v, step in zip(versions, (100, 200, 300)):
            d = self.m.path(v["name"])
            self.assertTrue(v["sealed"])
            self.assertEqual(v["files"], 2)
            self.assertEqual(v["logical_bytes"], sum(os.path.getsize(os.path.join(d, f))
                                                     for f in os.listdir(d)))
            self.assertEqual(v["metadata"]["global_step"], step)
            self.assertEqual(v["metadata"]["step_source"], "trainer_state.json")
            self.assertEqual(v["metadata"]["layout"], "huggingface")
            self.assertEqual(v["formats"], {"torch": 1})
        # The first version adds everything; the later ones one changed row's chunks (and
        # their small files), so much less.
        first, second = versions[0]["added_bytes"], versions[1]["added_bytes"]
        self.assertGreater(first, 0)
        self.assertLess(second, first / 4, "a version that changed one row added %d of %d"
                        % (second, first))
        self.assertEqual(len({v["manifest_digest"] for v in versions}), 3)
        one = json_of(self, "log", self.m.mnt, "global_step200")
        self.assertEqual(len(one["versions"]), 1)
        files = {f["path"]: f for f in one["versions"][0]["file_list"]}
        self.assertEqual(files["model.pt"]["format"], "torch")
        self.assertEqual(files["model.pt"]["tensors"], 4)
        self.assertIsNone(files["trainer_state.json"]["format"])
        words = run("log", self.m.mnt)
        self.assertEqual(words.returncode, 0, words.stderr)
        self.assertIn("global_step300", words.stdout)
        self.assertEqual(run("log", self.m.mnt, "nope").returncode, 1)
        with open(os.path.join(self.m.store, "ckptfs.log")) as f:
            self.assertIn("sealed version global_step200", f.read())  # by name, not inode

        self.m.umount()
        offline = json_of(self, "log", self.m.store)
        self.assertIsNone(offline["mount"])
        self.assertEqual(offline["versions"], online["versions"])

    def test_log_reads_step_and_framework_inside_torch_checkpoints(self):
        # Names that say nothing; the checkpoints' own top-level entries do (read by the
        # restricted unpickler: a class in the pickle would not run, and is not needed).
        lightning = {"epoch": 3, "global_step": 1234, "pytorch-lightning_version": "2.1.0",
                     "state_dict": model_state(1), "callbacks": {}}
        deepspeed = {"module": model_state(2), "ds_version": "0.12.3", "global_steps": 77,
                     "dp_world_size": 1}
        plain = {"model": model_state(3), "step": 5}
        for name, obj, file in (("run_a", lightning, "last.pt"),
                                ("run_b", deepspeed, "mp_rank_00_model_states.pt"),
                                ("run_c", plain, "weights.pt")):
            os.mkdir(self.m.path(name))
            torch.save(obj, self.m.path(name, file))
            self.assertEqual(run("seal", self.m.path(name)).returncode, 0)
        online = {v["name"]: v["metadata"] for v in json_of(self, "log", self.m.mnt)["versions"]}
        self.assertEqual(online["run_a"], {"layout": "lightning", "global_step": 1234,
                                           "step_source": "last.pt", "epoch": 3,
                                           "framework": {"pytorch_lightning": "2.1.0"}})
        self.assertEqual(online["run_b"], {"layout": "deepspeed", "global_step": 77,
                                           "step_source": "mp_rank_00_model_states.pt",
                                           "epoch": None, "framework": {"deepspeed": "0.12.3"}})
        self.assertEqual(online["run_c"], {"layout": None, "global_step": None,
                                           "step_source": None, "epoch": None,
                                           "framework": {}})
        words = run("log", self.m.mnt, "run_a").stdout
        self.assertIn("step      1234 (from last.pt)", words)
        self.assertIn("framework pytorch_lightning 2.1.0", words)
        self.m.umount()
        offline = {v["name"]: v["metadata"] for v in json_of(self, "log", self.m.store)["versions"]}
        self.assertEqual(offline, online)

    def test_a_copy_has_the_same_digest(self):
        self.save_steps([1])
        src = self.m.path("global_step1")
        dst = self.m.path("copy")
        os.mkdir(dst)
        for f in os.listdir(src):
            with open(os.path.join(src, f), "rb") as a, open(os.path.join(dst, f), "wb") as b:
                b.write(a.read())
        self.assertEqual(run("sync", self.m.mnt).returncode, 0)  # commits the closed files
        versions = {v["name"]: v for v in json_of(self, "log", self.m.mnt)["versions"]}
        self.assertEqual(versions["copy"]["manifest_digest"],
                         versions["global_step1"]["manifest_digest"])
        self.assertEqual(versions["copy"]["added_bytes"], 0)
        self.assertFalse(versions["copy"]["sealed"])
        self.assertEqual(versions["copy"]["metadata"]["step_source"], "trainer_state.json")

    def test_stats_verify_gc_in_one_format_online_and_offline(self):
        self.save_steps([1, 2])
        # Settled and compact first: the re-encoder compresses behind the writer (unmounting
        # waits for it) and leaves the raw records it replaced as holes in the packs, which a gc
        # rewrites; the gc below then finds nothing to change either side.
        run("sync", self.m.mnt)
        run("gc", self.m.mnt)
        online = {c: json_of(self, c, self.m.mnt) for c in ("stats", "verify", "gc")}
        self.assertTrue(online["verify"]["ok"])
        self.assertGreater(online["verify"]["chunks_checked"], 0)
        words_online = run("stats", self.m.mnt).stdout
        self.m.umount()
        offline = {c: json_of(self, c, self.m.store) for c in ("stats", "verify", "gc")}
        for key in ("contents", "logical_bytes", "chunks", "pack_bytes"):
            self.assertEqual(online["stats"][key], offline["stats"][key], key)
        self.assertEqual(online["verify"]["chunks_checked"], offline["verify"]["chunks_checked"])
        words_offline = run("stats", self.m.store).stdout
        labels = lambda text: [line.rsplit(" ", 1)[0].strip() for line in text.splitlines()]  # noqa
        # Online adds what only a daemon counts (bytes through it, latency, CPU) after them.
        self.assertEqual(labels(words_online)[:len(labels(words_offline))],
                         labels(words_offline))
        self.assertIn("write latency", words_online)
        self.assertNotIn("write latency", words_offline)
        self.assertIsNotNone(online["stats"]["daemon"])
        self.assertIsNone(offline["stats"]["daemon"])
        self.assertIn("logical bytes", words_offline)

    def test_status_lists_the_mount_and_its_daemon(self):
        mine = [status_of(self, self.m.mnt)]
        self.assertEqual(mine[0]["store"], os.path.realpath(self.m.store))
        self.assertEqual(mine[0]["daemon"]["pid"], self.m.pid)
        self.assertEqual(mine[0]["daemon"]["codec"], "lz4")  # init's, read from the store
        self.assertFalse(mine[0]["read_only"])
        words = run("status")
        self.assertIn(os.path.realpath(self.m.mnt), words.stdout)
        self.assertIn("daemon pid %d" % self.m.pid, words.stdout)

    def test_forget_online_then_offline(self):
        steps = [1, 2, 3, 4, 5]
        self.save_steps(steps)
        os.mkdir(self.m.path("open"))  # not sealed: kept whatever the rules say
        dry = json_of(self, "forget", self.m.mnt, "--keep-last", "2", "--dry-run")
        self.assertTrue(dry["dry_run"])
        self.assertIsNone(dry["gc"])
        self.assertEqual(len(os.listdir(self.m.mnt)), 6)
        doc = json_of(self, "forget", self.m.mnt, "--keep-last", "2", "--keep-every", "3")
        # Creation order: 1 2 3 4 5 open. Last 2: 5, open; every 3rd from the oldest: 1, 4.
        self.assertEqual([v["name"] for v in doc["forgotten"]],
                         ["global_step2", "global_step3"])
        reasons = {v["name"]: v["reason"] for v in doc["kept"]}
        self.assertEqual(reasons, {"global_step1": "every 3", "global_step4": "every 3",
                                   "global_step5": "last 2", "open": "last 2"})
        self.assertIsNotNone(doc["gc"])
        self.assertEqual(sorted(os.listdir(self.m.mnt)),
                         ["global_step1", "global_step4", "global_step5", "open"])
        loaded = torch.load(self.m.path("global_step5", "model.pt"))
        mounted.assert_same_objects(self, model_state(5), loaded)
        self.m.umount()
        doc = json_of(self, "forget", self.m.store, "--keep-last", "1")
        self.assertEqual([v["name"] for v in doc["forgotten"]],
                         ["global_step1", "global_step4", "global_step5"])
        self.assertEqual(json_of(self, "verify", self.m.store)["ok"], True)
        self.m.mount()
        self.assertEqual(os.listdir(self.m.mnt), ["open"])
        self.assertEqual(run("forget", self.m.mnt).returncode, 2, "--keep-last is required")


if __name__ == "__main__":
    mounted.main()
