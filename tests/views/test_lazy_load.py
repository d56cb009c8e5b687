#!/usr/bin/python3
"""ckptfs.lazy_load and ckptfs.load_into (python/ckptfs/lazy.py, restore.py): a checkpoint
file's tensors, read at access from the per-tensor views (docs/views.md).

Must-shows: lazy_load of a torch.save'd model + Adam state equals torch.load bitwise for every
key (tied weights, bf16), mapped and as copies; lazy_load reads from the packs only the pickle
(for index.json), len, iteration and info nothing more, and one tensor's access at most 2x its
bytes; the mapping keeps no value (a dropped value is freed and unmapped) and values are
private; filter by callable and by glob list selects the right names; dtype="bf16" /
torch.float16 give t.to(...) bitwise (integers unchanged); get_slice equals numpy indexing and
reads no more records than the 1 MiB pieces its rows cover; load_into restores a module (tied
weights, prefix), a dict (dtype conversion), reports missing/unexpected keys and raises on
strict or a shape mismatch before copying anything; a safetensors file works; a plain file, a
garbage pickle and a path outside a mount raise clear errors. (The 512 MiB cgroup restores are
in test_low_memory.py.)
"""
import gc
import io
import os
import sys
import tempfile
import weakref
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from views_common import (bits_equal, flatten, load_safetensors, mounted,  # noqa: E402
                          np, read_stats, save_safetensors, torch)

import ckptfs  # noqa: E402  (python/, put on sys.path by views_common)


def model_and_optimizer():
    torch.manual_seed(13)
    model = torch.nn.Sequential(torch.nn.Embedding(200, 32), torch.nn.Linear(32, 32),
                                torch.nn.LayerNorm(32), torch.nn.Linear(32, 200, bias=False))
    model[3].weight = model[0].weight  # tied
    opt = torch.optim.Adam(model.parameters())
    for _ in range(2):
        model(torch.randint(0, 200, (4, 5))).sum().backward()
        opt.step()
    sd = model.state_dict()
    sd["extra.bf16"] = torch.randn(6, 3).to(torch.bfloat16)
    sd["extra.half"] = torch.randn(11).half()
    sd["extra.ids"] = torch.arange(20)
    sd["extra.scalar"] = torch.tensor(2.5)
    sd["extra.empty"] = torch.zeros(0, 4)
    sd["extra.bf16_scalar"] = torch.tensor(1.5, dtype=torch.bfloat16)
    return {"module": sd, "optimizer_state_dict": opt.state_dict(), "step": 2}


def layers(n=12, size=128):
    torch.manual_seed(17)
    return {"layers.%d.%s" % (i, p): torch.randn(size, size) for i in range(n) for p in "qkvo"}


# The store cuts a tensor's bytes into pieces of this size counted from its start, one chunk
# each (StoreOptions::tensor_piece_bytes, engine/store/store.h; stored as records of at most
# the piece and a 64-byte header: engine/store/record.h).
PIECE = 1 << 20
RECORD_HEADER = 64


def mappings_of(directory):
    """The memory mappings of this process of files under `directory` (/proc/self/maps)."""
    with open("/proc/self/maps") as f:
        return [line for line in f if directory in line]


def converted(t, dtype):
    return t.to(dtype) if t.is_floating_point() else t


class LazyLoadTest(mounted.MountedTestCase):
    share_mount = True

    def assertSameTensors(self, expected, got):
        self.assertEqual(sorted(got), sorted(expected))
        for name, want in expected.items():
            self.assertIsInstance(got[name], torch.Tensor, name)
            self.assertTrue(bits_equal(want.contiguous(), got[name]), "%s differs" % name)

    def test_torch_state_dict_bitwise(self):
        d = self.version_dir()
        path = os.path.join(d, "model.pt")
        torch.save(model_and_optimizer(), path)
        expected = flatten(torch.load(path))
        self.assertIn("optimizer_state_dict.state.0.exp_avg_sq", expected)
        sd = ckptfs.lazy_load(path)
        self.assertEqual(len(sd), len(expected))
        self.assertEqual(sd.format, "torch")
        self.assertSameTensors(expected, sd)
        self.assertSameTensors(expected, ckptfs.lazy_load(path, mmap=False))
        # Tied: both names, equal but independent copies.
        self.assertTrue(torch.equal(sd["module.0.weight"], sd["module.3.weight"]))
        self.assertEqual(sd.info("module.extra.bf16")["dtype"], "bfloat16")
        self.assertEqual(sd.info("module.0.weight")["shape"], [200, 32])
        self.assertEqual(sd.nbytes("module.0.weight"), 200 * 32 * 4)
        self.assertEqual(sd.nbytes(), sum(t.numel() * t.element_size() for t in expected.values()))
        self.assertEqual(sd.load_all().keys(), sd.keys())
        # A read-only Mapping; unknown names are KeyErrors.
        with self.assertRaises(TypeError):
            sd["module.0.weight"] = torch.zeros(1)
        with self.assertRaises(KeyError):
            sd["no.such.tensor"]
        self.assertNotIn("no.such.tensor", sd)

    def test_no_tensor_read_before_access(self):
        d = self.version_dir()
        model = layers()
        path = os.path.join(d, "model.pt")
        torch.save(model, path)
        with zipfile.ZipFile(path) as z:  # what precedes the first tensor's bytes
            pickle_end = min(i.header_offset for i in z.infolist() if "/data/" in i.filename)
        self.m.remount()  # a cold cache: every byte read comes from the packs
        before = read_stats(self.mnt)
        sd = ckptfs.lazy_load(path)
        opened = read_stats(self.mnt)
        names = list(sd)
        self.assertEqual(len(sd), len(model))
        self.assertIn("layers.5.q", sd)
        self.assertEqual(sd.info("layers.5.q")["shape"], [128, 128])
        self.assertEqual(sd.nbytes(), sum(t.numel() * 4 for t in model.values()))
        after = read_stats(self.mnt)
        # index.json needs the pickle (read once, by the view), but no tensor's bytes.
        index_read = opened["pack_read_bytes"] - before["pack_read_bytes"]
        print("lazy_load: %d bytes read from packs (the pickle: %d bytes of the file)"
              % (index_read, pickle_end), file=sys.stderr)
        self.assertLessEqual(index_read, pickle_end)
        self.assertEqual(after["pack_read_bytes"], opened["pack_read_bytes"],
                         "len, iteration, in, info read from the packs")
        self.assertEqual(sorted(names), sorted(model))
        self.assertEqual(sd.loaded(), [])
        t = sd["layers.5.q"]
        self.assertTrue(torch.equal(t, model["layers.5.q"]))
        read = read_stats(self.mnt)["pack_read_bytes"] - after["pack_read_bytes"]
        want = sd.nbytes("layers.5.q")
        print("one tensor: %d bytes, %d bytes read from packs (%.2fx)"
              % (want, read, read / want), file=sys.stderr)
        self.assertGreater(read, 0)
        self.assertLessEqual(read, 2 * want)
        self.assertEqual(sd.loaded(), ["layers.5.q"])
        again = sd["layers.5.q"]  # a new value (sd keeps none), mapped from the page cache
        self.assertIsNot(again, t)
        self.assertTrue(torch.equal(again, t))

    def test_filter(self):
        d = self.version_dir()
        model = layers(n=12, size=8)
        model["head.weight"] = torch.randn(3, 8)
        path = os.path.join(d, "model.pt")
        torch.save(model, path)
        # A callable: skip layer 11 (and only it: not layers.1).
        sd = ckptfs.lazy_load(path, filter=lambda n: not n.startswith("layers.11."))
        self.assertEqual(sorted(sd), sorted(n for n in model if not n.startswith("layers.11.")))
        self.assertIn("layers.1.q", sd)
        with self.assertRaises(KeyError) as cm:
            sd["layers.11.q"]
        self.assertIn("filter", str(cm.exception))
        # Names and glob patterns.
        sd = ckptfs.lazy_load(path, filter=["layers.1.*", "layers.1[01].q", "head.weight"])
        self.assertEqual(sorted(sd), sorted(["layers.1.q", "layers.1.k", "layers.1.v",
                                             "layers.1.o", "layers.10.q", "layers.11.q",
                                             "head.weight"]))
        self.assertSameTensors({n: model[n] for n in sd}, sd)
        self.assertEqual(list(ckptfs.lazy_load(path, filter="*.o")),
                         ["layers.%d.o" % i for i in range(12)])  # index.json order
        self.assertEqual(len(ckptfs.lazy_load(path, filter=[])), 0)

    def test_dtype(self):
        d = self.version_dir()
        os.mkdir(os.path.join(d, "sub"))
        path = os.path.join(d, "sub", "model.pt")
        torch.save(model_and_optimizer(), path)
        expected = flatten(torch.load(path))
        for dtype, want in (("bf16", torch.bfloat16), (torch.float16, torch.float16),
                            ("float32", torch.float32)):
            sd = ckptfs.lazy_load(path, dtype=dtype)
            self.assertIn("@", sd.view_dir)
            self.assertSameTensors({n: converted(t, want) for n, t in expected.items()}, sd)
            self.assertEqual(sd["module.extra.ids"].dtype, torch.int64)
        # The precision view's own path works too, with and without dtype.
        bf16_path = os.path.join(self.mnt, os.path.basename(d) + "@bf16", "sub", "model.pt")
        self.assertEqual(ckptfs.lazy_load(bf16_path).view_dir,
                         ckptfs.lazy_load(path, dtype="bfloat16").view_dir)
        half = ckptfs.lazy_load(bf16_path, dtype="half", filter=["module.1.weight"])
        self.assertTrue(bits_equal(half["module.1.weight"],
                                   expected["module.1.weight"].half()))
        with self.assertRaises(ValueError) as cm:
            ckptfs.lazy_load(path, dtype=torch.int8)
        self.assertIn("bf16", str(cm.exception))

    def test_safetensors_file(self):
        d = self.version_dir()
        torch.manual_seed(3)
        tensors = {"a.weight": torch.randn(7, 9), "b/slash": torch.arange(10),
                   "c": torch.randn(4).to(torch.bfloat16), "d": torch.randn(2, 2).half()}
        path = os.path.join(d, "model.safetensors")
        save_safetensors(tensors, path)
        sd = ckptfs.lazy_load(path)
        self.assertEqual(sd.format, "safetensors")
        self.assertSameTensors(load_safetensors(path), sd)
        sd = ckptfs.lazy_load(path, dtype="fp16", filter=["a.*", "b/slash"])
        self.assertSameTensors({"a.weight": tensors["a.weight"].half(),
                                "b/slash": tensors["b/slash"]}, sd)

    def test_holds_no_value(self):
        d = self.version_dir()
        path = os.path.join(d, "model.pt")
        model = layers(n=2, size=64)
        model["tied"] = model["layers.0.q"]
        torch.save(model, path)
        for mmap in (True, False):
            sd = ckptfs.lazy_load(path, mmap=mmap)
            self.assertEqual(sd.mmap, mmap)
            t = sd["layers.0.q"]
            tied = sd["tied"]
            self.assertEqual(bool(mappings_of(sd.view_dir)), mmap)
            # Values are private: a write changes neither the file nor a tied name's value
            # nor the next value.
            t.add_(1)
            self.assertTrue(torch.equal(tied, model["layers.0.q"]))
            self.assertTrue(torch.equal(sd["layers.0.q"], model["layers.0.q"]))
            self.assertTrue(torch.equal(t, model["layers.0.q"] + 1))
            # Dropped by the caller, gone: sd keeps no value (and no mapping).
            ref = weakref.ref(t)
            del t, tied
            gc.collect()
            self.assertIsNone(ref())
            self.assertEqual(mappings_of(sd.view_dir), [], "mmap=%s" % mmap)
            self.assertEqual(sd.loaded(), ["layers.0.q", "tied"])
            # safe_open's spellings.
            with ckptfs.lazy_load(path, mmap=mmap) as f:
                self.assertEqual(list(f.keys()), list(model))
                self.assertTrue(torch.equal(f.get_tensor("layers.1.k"), model["layers.1.k"]))
        self.assertEqual(mappings_of(sd.view_dir), [])

    def test_get_slice(self):
        d = self.version_dir()
        torch.manual_seed(5)
        tensors = {"w": torch.randn(37, 5, 3), "b": torch.randn(9, 4).to(torch.bfloat16),
                   "s": torch.tensor(3.5), "ids": torch.arange(12), "e": torch.zeros(0, 3)}
        path = os.path.join(d, "model.pt")
        torch.save(tensors, path)
        sd = ckptfs.lazy_load(path)
        sl = sd.get_slice("w")
        self.assertEqual((sl.get_shape(), sl.get_dtype(), len(sl)), ([37, 5, 3], "float32", 37))
        w = tensors["w"].numpy()
        for index in (slice(3, 9), 4, -1, (slice(2, 30, 7), slice(1, 4)), (5, 2, 1),
                      slice(None, None, -3), slice(30, 2, -5), slice(9, 3), slice(-5, None),
                      (slice(None), 2), Ellipsis, (Ellipsis, 1), (), slice(0, 100)):
            got = sl[index]
            want = np.asarray(w[index])
            self.assertIsInstance(got, torch.Tensor, index)
            self.assertEqual(tuple(got.shape), want.shape, index)
            self.assertTrue(np.array_equal(got.numpy(), want), index)
            self.assertTrue(got.is_contiguous(), index)
        with self.assertRaises(IndexError):
            sl[37]
        self.assertTrue(bits_equal(sd.get_slice("b")[2:5], tensors["b"][2:5]))
        self.assertTrue(bits_equal(sd.get_slice("b")[-1], tensors["b"][-1]))
        self.assertTrue(bits_equal(sd.get_slice("s")[()], tensors["s"]))
        self.assertTrue(torch.equal(sd.get_slice("ids")[3:7], torch.arange(3, 7)))
        self.assertEqual(tuple(sd.get_slice("e")[0:0].shape), (0, 3))
        self.assertTrue(bits_equal(ckptfs.lazy_load(path, dtype="bf16").get_slice("w")[1:3],
                                   tensors["w"][1:3].to(torch.bfloat16)))
        with self.assertRaises(KeyError):
            sd.get_slice("nope")

    def test_get_slice_reads_only_its_rows(self):
        d = self.version_dir()
        torch.manual_seed(7)
        w = torch.randn(2048, 2048)  # 16 MiB, rows of 8 KiB: 128 rows a piece
        path = os.path.join(d, "model.pt")
        torch.save({"w": w, "other": torch.randn(256, 1024)}, path)
        row = 2048 * 4
        self.m.remount()  # a cold cache: every byte read comes from the packs
        sd = ckptfs.lazy_load(path)
        for a, b in ((300, 500), (0, 100), (1000, 1001), (1900, 2048)):
            before = read_stats(self.mnt)
            rows = sd.get_slice("w")[a:b]
            after = read_stats(self.mnt)
            self.assertTrue(torch.equal(rows, w[a:b]), (a, b))
            pieces = (b * row - 1) // PIECE - a * row // PIECE + 1
            reads = after["pack_reads"] - before["pack_reads"]
            read = after["pack_read_bytes"] - before["pack_read_bytes"]
            print("get_slice[%d:%d]: %d bytes of rows in %d pieces, %d records read (%d bytes)"
                  % (a, b, (b - a) * row, pieces, reads, read), file=sys.stderr)
            # Each slice is a fresh range of pieces here (none read before): all its pieces
            # are read, and nothing else.
            self.assertGreater(reads, 0, (a, b))
            self.assertLessEqual(reads, pieces, (a, b))
            self.assertLessEqual(read, pieces * (PIECE + RECORD_HEADER), (a, b))

    def test_load_into(self):
        d = self.version_dir()
        path = os.path.join(d, "model.pt")
        torch.save(model_and_optimizer(), path)
        expected = flatten(torch.load(path))
        torch.manual_seed(99)
        fresh = torch.nn.Sequential(torch.nn.Embedding(200, 32), torch.nn.Linear(32, 32),
                                    torch.nn.LayerNorm(32), torch.nn.Linear(32, 200, bias=False))
        fresh[3].weight = fresh[0].weight
        # The file holds {"module": model + extras, "optimizer_state_dict": ..., "step"}.
        result = ckptfs.load_into(fresh, path, prefix="module.", strict=False)
        self.assertEqual(result.missing_keys, [])
        self.assertEqual(sorted(result.unexpected_keys),
                         sorted(n[len("module."):] for n in expected
                                if n.startswith("module.extra.")))
        for name, t in fresh.state_dict().items():
            self.assertTrue(bits_equal(t, expected["module." + name]), name)
        self.assertIs(fresh[3].weight, fresh[0].weight)
        # strict (the default): the same keys as an error; nothing is copied.
        target = {"0.weight": torch.zeros(200, 32), "1.bias": torch.zeros(32),
                  "absent": torch.zeros(2)}
        with self.assertRaises(RuntimeError) as cm:
            ckptfs.load_into(target, path, prefix="module.")
        self.assertIn('Missing key(s) in state_dict: "absent".', str(cm.exception))
        self.assertIn('"extra.ids"', str(cm.exception))
        self.assertEqual(float(target["0.weight"].abs().sum()), 0.0)
        # A dict of tensors, converted to its dtypes (as load_state_dict does).
        target = {"0.weight": torch.zeros(200, 32, dtype=torch.bfloat16),
                  "extra.ids": torch.zeros(20, dtype=torch.int32)}
        result = ckptfs.load_into(target, path, prefix="module.", strict=False)
        self.assertTrue(bits_equal(target["0.weight"],
                                   expected["module.0.weight"].to(torch.bfloat16)))
        self.assertTrue(torch.equal(target["extra.ids"], torch.arange(20, dtype=torch.int32)))
        self.assertEqual(result.missing_keys, [])
        # dtype=: read through the precision view.
        target = {"1.weight": torch.zeros(32, 32)}
        ckptfs.load_into(target, path, prefix="module.", strict=False, dtype="fp16")
        self.assertTrue(torch.equal(target["1.weight"],
                                    expected["module.1.weight"].half().float()))
        # A shape that differs is an error even when not strict, before anything is copied.
        target = {"0.weight": torch.zeros(200, 32), "1.weight": torch.zeros(31, 32)}
        with self.assertRaises(RuntimeError) as cm:
            ckptfs.load_into(target, path, prefix="module.", strict=False)
        self.assertIn("size mismatch for 1.weight", str(cm.exception))
        self.assertEqual(float(target["0.weight"].abs().sum()), 0.0)
        if torch.cuda.is_available():  # no GPU in CI; the same copy_ on a CUDA destination
            cuda = {"0.weight": torch.zeros(200, 32, device="cuda")}
            ckptfs.load_into(cuda, path, prefix="module.", strict=False)
            self.assertTrue(torch.equal(cuda["0.weight"].cpu(), expected["module.0.weight"]))
        with self.assertRaises(TypeError):
            ckptfs.load_into([torch.zeros(1)], path)

    def test_clear_errors(self):
        d = self.version_dir()
        text = os.path.join(d, "notes.txt")
        mounted.write_file(text, b"hello\n" * 100)
        with self.assertRaises(FileNotFoundError) as cm:
            ckptfs.lazy_load(text)
        self.assertIn("no per-tensor view", str(cm.exception))
        # A .pt whose pickle is garbage has no views either.
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
            z.writestr("archive/data.pkl", b"\x80\x02garbage, not a pickle" * 10)
            z.writestr("archive/version", b"3\n")
        bad = os.path.join(d, "bad.pt")
        mounted.write_file(bad, buf.getvalue())
        with self.assertRaises(FileNotFoundError) as cm:
            ckptfs.lazy_load(bad, dtype="bf16")
        self.assertIn("torch.load", str(cm.exception))
        with self.assertRaises(FileNotFoundError) as cm:
            ckptfs.lazy_load(os.path.join(d, "missing.pt"))
        self.assertIn("no such", str(cm.exception))
        # Not a file inside a version.
        with self.assertRaises(ValueError) as cm:
            ckptfs.lazy_load(d)
        self.assertIn("version directory", str(cm.exception))
        # Outside any ckptfs mount (a real checkpoint, on the local disk).
        outside = tempfile.mkdtemp(dir=mounted.root_dir())
        torch.save({"w": torch.zeros(3)}, os.path.join(outside, "model.pt"))
        with self.assertRaises(ValueError) as cm:
            ckptfs.lazy_load(os.path.join(outside, "model.pt"))
        self.assertIn("not inside a ckptfs mount", str(cm.exception))


if __name__ == "__main__":
    mounted.main()
