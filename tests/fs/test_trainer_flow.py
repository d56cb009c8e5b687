#!/usr/bin/python3
"""Must-show 2: the Hugging Face Trainer's checkpoint flow on a ckptfs mount.

Each save writes tmp-checkpoint-N/ (model weights, optimizer, scheduler, RNG state,
trainer_state.json), os.rename()s it to checkpoint-N, then rotates: only the newest two
checkpoints stay, older ones go with shutil.rmtree (save_total_limit=2). After unmounting,
`ckptfs gc` must give back the deleted checkpoints' space: the store's pack bytes fall.
"""
import copy
import json
import os
import random
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mounted  # noqa: E402

try:
    import torch  # noqa: E402
except ImportError:
    mounted.skip_all("needs python3-torch (run with Debian's /usr/bin/python3)")

SAVE_STEPS, N_SAVES, KEEP = 10, 6, 2


def make_model():
    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(512, 1536), torch.nn.GELU(),
                               torch.nn.Linear(1536, 768), torch.nn.GELU(),
                               torch.nn.Linear(768, 512))


def save_checkpoint(mnt, step, model, optimizer, scheduler, log_history):
    """What Trainer._save_checkpoint writes, into tmp-checkpoint-N, then renamed."""
    final = os.path.join(mnt, "checkpoint-%d" % step)
    tmp = os.path.join(mnt, "tmp-checkpoint-%d" % step)
    os.makedirs(tmp)
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump({"architectures": ["MLP"], "hidden_size": 1536}, f)
    torch.save(model.state_dict(), os.path.join(tmp, "pytorch_model.bin"))
    torch.save(optimizer.state_dict(), os.path.join(tmp, "optimizer.pt"))
    torch.save(scheduler.state_dict(), os.path.join(tmp, "scheduler.pt"))
    torch.save({"python": random.getstate(), "cpu": torch.random.get_rng_state()},
               os.path.join(tmp, "rng_state.pth"))
    state = {"global_step": step, "log_history": list(log_history), "best_metric": None}
    with open(os.path.join(tmp, "trainer_state.json"), "w") as f:
        json.dump(state, f, indent=2)
    os.rename(tmp, final)
    return {
        "pytorch_model.bin": copy.deepcopy(model.state_dict()),
        "optimizer.pt": copy.deepcopy(optimizer.state_dict()),
        "scheduler.pt": copy.deepcopy(scheduler.state_dict()),
        "trainer_state.json": state,
    }


def rotate_checkpoints(mnt, keep):
    """Trainer._rotate_checkpoints: delete all but the newest `keep` checkpoint-N dirs."""
    ckpts = sorted((d for d in os.listdir(mnt) if d.startswith("checkpoint-")),
                   key=lambda d: int(d.split("-")[1]))
    for old in ckpts[:-keep]:
        shutil.rmtree(os.path.join(mnt, old))


class TrainerFlowTest(mounted.MountedTestCase):
    # Old checkpoints seal themselves after a second, as they would in a long run: rotation
    # deletes sealed versions.
    mount_options = ["--seal-after", "1"]

    def test_save_rename_rotate_then_gc(self):
        torch.set_num_threads(2)
        model = make_model()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, 1.0, 0.1, SAVE_STEPS * N_SAVES)
        log_history = []
        expected = {}
        for step in range(1, SAVE_STEPS * N_SAVES + 1):
            x = torch.randn(4, 512)
            loss = (model(x) - x).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
            if step % SAVE_STEPS == 0:
                log_history.append({"step": step, "loss": round(loss.item(), 6)})
                expected[step] = save_checkpoint(self.mnt, step, model, optimizer, scheduler,
                                                 log_history)
                rotate_checkpoints(self.mnt, KEEP)
                self.assertEqual(len([d for d in os.listdir(self.mnt)]), min(len(expected), KEEP))

        kept = [SAVE_STEPS * (N_SAVES - 1), SAVE_STEPS * N_SAVES]
        self.assertEqual(sorted(os.listdir(self.mnt)), ["checkpoint-%d" % s for s in kept])
        self.check_checkpoints(expected, kept)

        self.m.umount()
        before = self.m.stats()
        gc = mounted.ckptfs("gc", self.store)
        after = self.m.stats()
        print("gc: %s\nbefore %s\nafter  %s" % (gc.stdout.strip(), before, after),
              file=sys.stderr)
        self.assertLess(after["pack bytes"], before["pack bytes"])
        # The two live checkpoints hold about a third of what was written.
        self.assertLess(after["pack bytes"], 0.6 * before["pack bytes"])
        self.assertGreaterEqual(after["pack bytes"], after["record bytes"])
        self.assertEqual(after["logical bytes"], before["logical bytes"])  # gc keeps live data
        self.assertIn("dropped", gc.stdout)
        self.assertIn("no problems", mounted.ckptfs("verify", self.store).stdout)

        # The checkpoints that stayed read back bitwise from the compacted store.
        self.m.mount()
        self.assertEqual(sorted(os.listdir(self.mnt)), ["checkpoint-%d" % s for s in kept])
        self.check_checkpoints(expected, kept)

    def check_checkpoints(self, expected, kept):
        for step in kept:
            d = os.path.join(self.mnt, "checkpoint-%d" % step)
            self.assertEqual(sorted(os.listdir(d)),
                             ["config.json", "optimizer.pt", "pytorch_model.bin", "rng_state.pth",
                              "scheduler.pt", "trainer_state.json"])
            for name, want in expected[step].items():
                path = os.path.join(d, name)
                if name.endswith(".json"):
                    with open(path) as f:
                        self.assertEqual(json.load(f), want, path)
                else:
                    mounted.assert_same_objects(self, want, torch.load(path), path)


if __name__ == "__main__":
    mounted.main()
