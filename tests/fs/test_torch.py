#!/usr/bin/python3
"""Must-show 1: real torch checkpoints in DeepSpeed's layout, saved through a ckptfs mount.

A small transformer (about 59 MB of fp32 weights) and its Adam optimizer are trained for a few
real steps; after each of three steps the model and optimizer states are saved as DeepSpeed
does (global_stepN/mp_rank_00_model_states.pt, global_stepN/zero_pp_rank_0_mp_rank_00_optim_
states.pt, then the top-level file `latest` holding "global_stepN"). torch.load from the mount
must give back the in-memory tensors bit for bit, before and after an unmount and remount.
"""
import copy
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mounted  # noqa: E402  (before torch: it starts the cleanup guard)

try:
    import torch  # noqa: E402
except ImportError:
    mounted.skip_all("needs python3-torch (run with Debian's /usr/bin/python3)")

VOCAB, D_MODEL, HEADS, FF, LAYERS = 4096, 512, 8, 2048, 4
SEQ, BATCH = 17, 2  # tiny batches: Debian's CPU torch is slow at matmuls


class TinyLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, D_MODEL)
        layer = torch.nn.TransformerEncoderLayer(D_MODEL, HEADS, FF, dropout=0.0,
                                                 batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, LAYERS)
        self.norm = torch.nn.LayerNorm(D_MODEL)
        self.register_buffer("step_count", torch.zeros((), dtype=torch.int64))

    def forward(self, tokens):
        h = self.encoder(self.embed(tokens))
        return self.norm(h) @ self.embed.weight.t()  # tied output head


def deepspeed_save(mnt, step, model, optimizer):
    """The files DeepSpeed's save_checkpoint writes for one data/model-parallel rank."""
    tag = "global_step%d" % step
    os.makedirs(os.path.join(mnt, tag), exist_ok=True)
    model_states = {
        "module": model.state_dict(),
        "buffer_names": ["step_count"],
        "optimizer": None,
        "lr_scheduler": None,
        "global_steps": step,
        "global_samples": step * BATCH,
        "dp_world_size": 1,
        "mp_world_size": 1,
        "ds_config": {"train_batch_size": BATCH, "zero_optimization": {"stage": 1}},
        "ds_version": "0.12.6",
    }
    torch.save(model_states, os.path.join(mnt, tag, "mp_rank_00_model_states.pt"))
    optim_states = {
        "optimizer_state_dict": optimizer.state_dict(),
        "ds_config": model_states["ds_config"],
        "ds_version": "0.12.6",
    }
    torch.save(optim_states, os.path.join(mnt, tag, "zero_pp_rank_0_mp_rank_00_optim_states.pt"))
    with open(os.path.join(mnt, "latest"), "w") as f:
        f.write(tag)
    # What was just saved, detached from the live (still training) tensors.
    return copy.deepcopy(model_states), copy.deepcopy(optim_states)


class DeepSpeedCheckpointTest(mounted.MountedTestCase):
    # Old versions seal themselves one second after the next exists: reading them back also
    # goes through the sealed (page cache kept across opens) path.
    mount_options = ["--seal-after", "1", "--cache-size", "128M"]

    def test_three_steps_read_back_bitwise(self):
        torch.manual_seed(1234)
        torch.set_num_threads(2)
        model = TinyLM()
        n_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        self.assertGreaterEqual(n_bytes, 50 * 10**6, "the model must hold >= 50 MB of fp32")
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

        saved = {}
        for step in range(1, 4):
            for _ in range(2):  # two real training steps between checkpoints
                tokens = torch.randint(0, VOCAB, (BATCH, SEQ))
                logits = model(tokens[:, :-1])
                loss = torch.nn.functional.cross_entropy(
                    logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                model.step_count += 1
            saved[step] = deepspeed_save(self.mnt, step, model, optimizer)

        self.assertEqual(sorted(os.listdir(self.mnt)),
                         ["global_step1", "global_step2", "global_step3", "latest"])
        # Weights did change between steps: the checkpoints are not all the same bytes.
        self.assertFalse(torch.equal(saved[1][0]["module"]["embed.weight"],
                                     saved[3][0]["module"]["embed.weight"]))
        self.check_all(saved)

        # The older versions seal themselves; the newest stays writable.
        self.assertTrue(mounted.wait_until(
            lambda: all(os.getxattr(self.m.path("global_step%d" % s), "user.ckptfs.sealed")
                        == b"1" for s in (1, 2)), 15), "global_step1/2 were not sealed")
        self.assertEqual(os.getxattr(self.m.path("global_step3"), "user.ckptfs.sealed"), b"0")

        self.remount()
        self.check_all(saved)
        self.m.umount()
        verify = mounted.ckptfs("verify", self.store)
        self.assertIn("no problems", verify.stdout)

    def check_all(self, saved):
        with open(os.path.join(self.mnt, "latest")) as f:
            self.assertEqual(f.read(), "global_step3")
        for step, (model_states, optim_states) in saved.items():
            d = os.path.join(self.mnt, "global_step%d" % step)
            t0 = time.monotonic()
            got_model = torch.load(os.path.join(d, "mp_rank_00_model_states.pt"))
            got_optim = torch.load(os.path.join(d, "zero_pp_rank_0_mp_rank_00_optim_states.pt"))
            mounted.assert_same_objects(self, model_states, got_model, "step %d model" % step)
            mounted.assert_same_objects(self, optim_states, got_optim, "step %d optim" % step)
            state = got_optim["optimizer_state_dict"]["state"]
            self.assertEqual(len(state), len(list(model_states["module"])) - 1)  # minus buffer
            self.assertTrue(all("exp_avg_sq" in s for s in state.values()))
            sizes = [os.stat(os.path.join(d, n)).st_size for n in sorted(os.listdir(d))]
            print("step %d: %s bytes read back in %.2fs" % (step, sizes, time.monotonic() - t0),
                  file=sys.stderr)


class ManySmallTensorsTest(mounted.MountedTestCase):
    """A checkpoint of thousands of tiny tensors is thousands of tiny chunks (format-aware
    cuts at every record): one read request spans more chunks than a reply can carry as an
    iovec each (fs/fuse_ops.cc OnRead), and must still read back bitwise from a fresh daemon."""

    def test_tiny_tensors_read_back_bitwise(self):
        import io
        state = {"t%d" % i: torch.full((3,), float(i)) for i in range(5000)}
        buf = io.BytesIO()
        torch.save(state, buf)
        path = os.path.join(self.mnt, "v1", "tiny.pt")
        os.makedirs(os.path.dirname(path))
        with open(path, "wb") as f:
            f.write(buf.getvalue())
            os.fsync(f.fileno())
        self.remount()  # a fresh daemon and an empty page cache: the reads reach the daemon
        with open(path, "rb") as f:
            self.assertEqual(f.read(), buf.getvalue())
        got = torch.load(path)
        self.assertEqual(len(got), len(state))
        self.assertTrue(all(torch.equal(got[k], v) for k, v in state.items()))


if __name__ == "__main__":
    mounted.main()
