#!/usr/bin/python3
"""Restoring a checkpoint larger than the loader's memory through the per-tensor views
(docs/views.md, "Memory" and "Lazy loading from Python").

One 2 GiB torch.save checkpoint of 8 tensors of 256 MiB (each generated from its own seed, so
the checker keeps only their digests), written once for the class. Each loader runs as a child
of a 512 MiB memory cgroup (the cgroup v1 memory controller at /sys/fs/cgroup/memory; every
test makes and removes its own group, whatever happens).

Must-shows:
- ckptfs.lazy_load iterated over the whole checkpoint, one tensor at a time, in the cgroup:
  every value (memory-mapped, the default) equals the saved tensor by SHA-1, then three
  (768 MiB) as copies (mmap=False): the mapping holds no tensor it returned, so nothing is
  OOM-killed (lazy_load used to keep every value, as an in-memory copy: killed at the second).
  With `--cache-size 128M`, the daemon's peak RSS stays <= cache + in-flight budget + 64 MiB
  (not checked when ckptfs is a sanitizer build: the sanitizer's own memory counts in its RSS).
- ckptfs.load_into a model whose own parameters fill most of the cgroup (256 MiB fp32 +
  128 MiB bf16, set to NaN first; with torch's own ~115 MiB the loader's anonymous memory is
  ~500 MiB of the 512 before it reads anything): both tensors restored, converted to the
  parameter's dtype, equal by digest; the file's other 6 tensors reported as unexpected. A
  copy of one tensor beside the model (load_state_dict of a loaded dict) could not fit.
"""
import hashlib
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from views_common import mounted, torch  # noqa: E402

MiB = mounted.MiB
PYTHON_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python")
CGROUP_ROOT = "/sys/fs/cgroup/memory"
CACHE = 128 * MiB
INFLIGHT = 64 * MiB
OVERHEAD = 64 * MiB
LIMIT = 512 * MiB
TENSORS = 8
ROWS, COLS = 8192, 8192  # 256 MiB of float32 each: 2 GiB in all
COPIES = 3  # tensors the lazy_load child also reads with mmap=False: 768 MiB > LIMIT

if os.geteuid() != 0:
    mounted.skip_all("a memory cgroup needs root")
if not os.path.exists(os.path.join(CGROUP_ROOT, "memory.limit_in_bytes")):
    mounted.skip_all("needs the cgroup v1 memory controller at " + CGROUP_ROOT)

# Shared by the children: the digest of a tensor's bytes (bf16 as its bits), the peak RSS.
CHILD_COMMON = r"""
import gc, hashlib, json, os, sys
sys.path.insert(0, sys.argv[2])
import torch
import ckptfs

def digest(t):
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return hashlib.sha1(memoryview(t.numpy()).cast("B")).hexdigest()

def emit(**kw):
    print(json.dumps(kw), flush=True)

def status_kb(key):
    with open("/proc/self/status") as f:
        return [int(l.split()[1]) for l in f if l.startswith(key + ":")][0]
"""

# Every tensor through ckptfs.lazy_load (mapped), then COPIES of them as copies; one at a time.
LAZY_LOADER = CHILD_COMMON + r"""
path, copies = sys.argv[1], int(sys.argv[3])
sd = ckptfs.lazy_load(path)
for name in sd:
    t = sd[name]
    emit(mode="mmap", name=name, dtype=str(t.dtype), shape=list(t.shape), sha1=digest(t))
    del t
sd = ckptfs.lazy_load(path, mmap=False)
for name in list(sd)[:copies]:
    t = sd[name]
    emit(mode="copy", name=name, dtype=str(t.dtype), shape=list(t.shape), sha1=digest(t))
    del t
    gc.collect()
emit(vmhwm_kb=status_kb("VmHWM"))
"""

# A model of layers.0 (float32) and layers.1 (bfloat16) filled with NaN, then load_into.
LOAD_INTO = CHILD_COMMON + r"""
path, rows, cols = sys.argv[1], int(sys.argv[3]), int(sys.argv[4])

class Layer(torch.nn.Module):
    def __init__(self, dtype):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.full((rows, cols), float("nan"), dtype=dtype))

model = torch.nn.Module()
model.layers = torch.nn.ModuleList([Layer(torch.float32), Layer(torch.bfloat16)])
emit(model_anon_kb=status_kb("RssAnon"), model_bytes=sum(
    p.numel() * p.element_size() for p in model.parameters()))
result = ckptfs.load_into(model, path, strict=False)
emit(missing=result.missing_keys, unexpected=result.unexpected_keys)
for name, p in model.named_parameters():
    emit(name=name, dtype=str(p.dtype), sha1=digest(p.detach()))
emit(vmhwm_kb=status_kb("VmHWM"))
"""


def tensor(i):
    """Tensor i of the checkpoint: standard normal, from seed 1000 + i."""
    return torch.randn(ROWS, COLS, generator=torch.Generator().manual_seed(1000 + i))


def sha1(t):
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return hashlib.sha1(memoryview(t.numpy()).cast("B")).hexdigest()


def proc_status_kb(pid, key):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise AssertionError("no %s in /proc/%d/status" % (key, pid))


def cgroup_read(group, name):
    try:
        with open(os.path.join(group, name)) as f:
            return f.read()
    except OSError:
        return None


def cgroup_write(group, name, value):
    with open(os.path.join(group, name), "w") as f:
        f.write(str(value))


def remove_cgroup(group):
    """Moves whatever still runs in `group` to the root group, then removes the group."""
    if not os.path.isdir(group):
        return
    for _ in range(100):
        pids = (cgroup_read(group, "cgroup.procs") or "").split()
        for pid in pids:
            try:
                cgroup_write(CGROUP_ROOT, "cgroup.procs", pid)
            except OSError:
                pass
        try:
            os.rmdir(group)
            return
        except OSError:
            time.sleep(0.1)
    os.rmdir(group)  # raise: the group could not be removed


class LowMemoryTest(mounted.MountedTestCase):
    mount_options = ["--seal-after", "0", "--cache-size", "128M", "--inflight", "64M"]
    share_mount = True

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        d = cls.m.path("v1")
        os.mkdir(d)
        cls.path = os.path.join(d, "model.pt")
        start = time.monotonic()
        model = {"layers.%d.weight" % i: tensor(i) for i in range(TENSORS)}
        # The checker keeps digests only (and layer 1 as bf16, for load_into).
        cls.expected = {n: sha1(t) for n, t in model.items()}
        cls.expected_bf16 = sha1(model["layers.1.weight"].to(torch.bfloat16))
        cls.total = sum(t.numel() * t.element_size() for t in model.values())
        torch.save(model, cls.path)
        del model
        print("low memory: %.0f MiB checkpoint (%d tensors of %d MiB) saved in %.1f s"
              % (cls.total / MiB, TENSORS, ROWS * COLS * 4 // MiB, time.monotonic() - start),
              file=sys.stderr)

    def make_cgroup(self):
        group = os.path.join(CGROUP_ROOT, "ckptfs-test-%d" % os.getpid())
        remove_cgroup(group)  # a leftover of an earlier run of this pid
        os.mkdir(group)
        self.addCleanup(remove_cgroup, group)
        cgroup_write(group, "memory.limit_in_bytes", LIMIT)
        try:
            cgroup_write(group, "memory.memsw.limit_in_bytes", LIMIT)
        except OSError:
            pass  # no swap accounting
        self.assertEqual(int(cgroup_read(group, "memory.limit_in_bytes")), LIMIT)
        return group

    def run_in_cgroup(self, script, *args):
        """Runs `script` under /usr/bin/python3 in a new 512 MiB cgroup; returns (exit code,
        stderr, the JSON lines it printed, the cgroup's max usage, failcnt, oom_kill)."""
        group = self.make_cgroup()
        p = subprocess.run(
            ["/bin/sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', group,
             "/usr/bin/python3", "-c", script, self.path, PYTHON_DIR] + [str(a) for a in args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=900)
        max_usage = int(cgroup_read(group, "memory.max_usage_in_bytes"))
        failcnt = int(cgroup_read(group, "memory.failcnt"))
        oom = dict(line.split() for line in (cgroup_read(group, "memory.oom_control")
                                             or "").splitlines())
        lines = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
        return p.returncode, p.stderr, lines, max_usage, failcnt, oom.get("oom_kill", "?")

    def assertFitted(self, rc, stderr, max_usage, oom_kill):
        self.assertEqual(rc, 0, "loader failed (OOM-killed if -9)\nstderr: %s" % stderr[-4000:])
        self.assertIn(oom_kill, ("0", "?"), "the cgroup's OOM killer ran")
        self.assertLessEqual(max_usage, LIMIT)

    def test_lazy_load_2gib_in_512mib_cgroup(self):
        # A fresh daemon: its VmHWM counts from the mount on.
        self.remount(self.mount_options)
        pid = int(os.getxattr(self.mnt, "user.ckptfs.pid"))
        self.assertEqual(pid, self.m.pid)
        hwm_fresh = proc_status_kb(pid, "VmHWM")
        start = time.monotonic()
        rc, stderr, lines, max_usage, failcnt, oom_kill = self.run_in_cgroup(LAZY_LOADER, COPIES)
        done = time.monotonic()
        hwm = proc_status_kb(pid, "VmHWM")
        rss = proc_status_kb(pid, "VmRSS")
        child_hwm = lines[-1].get("vmhwm_kb") if lines else None
        bound = CACHE + INFLIGHT + OVERHEAD
        print("lazy_load: %.0f MiB mapped + %d MiB copied in %.1f s; loader in a %d MiB "
              "cgroup: exit %d, peak RSS %s MiB, cgroup max usage %.0f MiB, failcnt %d, "
              "oom_kill %s; daemon (--cache-size 128M --inflight 64M) VmHWM %.0f MiB "
              "(%.0f MiB after mount), VmRSS %.0f MiB, bound %d MiB"
              % (self.total / MiB, COPIES * ROWS * COLS * 4 // MiB, done - start,
                 LIMIT // MiB, rc, "%.0f" % (child_hwm / 1024) if child_hwm else "?",
                 max_usage / MiB, failcnt, oom_kill, hwm / 1024, hwm_fresh / 1024,
                 rss / 1024, bound // MiB), file=sys.stderr)
        self.assertFitted(rc, stderr, max_usage, oom_kill)
        names = sorted(self.expected)
        for mode, count in (("mmap", TENSORS), ("copy", COPIES)):
            got = {e["name"]: e for e in lines if e.get("mode") == mode}
            self.assertEqual(sorted(got), names[:count], mode)
            for name, e in got.items():
                self.assertEqual((e["dtype"], e["shape"]), ("torch.float32", [ROWS, COLS]))
                self.assertEqual(e["sha1"], self.expected[name], "%s (%s) differs" % (name, mode))
        sanitizer = mounted.sanitizer()
        if sanitizer:
            # The sanitizer's shadow memory and quarantine are the daemon's RSS too: the bound
            # is about ckptfs's own memory, so it is checked in ordinary builds only.
            print("daemon peak RSS not checked: ckptfs is built with the %s sanitizer"
                  % sanitizer, file=sys.stderr)
        else:
            self.assertLessEqual(hwm * 1024, bound, "daemon peak RSS %.0f MiB > %d MiB"
                                 % (hwm / 1024, bound // MiB))

    def test_load_into_model_filling_the_cgroup(self):
        start = time.monotonic()
        rc, stderr, lines, max_usage, failcnt, oom_kill = self.run_in_cgroup(LOAD_INTO, ROWS,
                                                                             COLS)
        done = time.monotonic()
        info = {k: v for e in lines for k, v in e.items() if k not in ("name", "dtype", "sha1")}
        params = {e["name"]: (e["dtype"], e["sha1"]) for e in lines if "sha1" in e}
        print("load_into: model of %s MiB (loader's anonymous memory %s MiB with it) restored "
              "in %.1f s; %d MiB cgroup: exit %d, peak RSS %s MiB, max usage %.0f MiB, "
              "failcnt %d, oom_kill %s"
              % (info.get("model_bytes", 0) // MiB, info.get("model_anon_kb", 0) // 1024,
                 done - start, LIMIT // MiB, rc, info.get("vmhwm_kb", 0) // 1024,
                 max_usage / MiB, failcnt, oom_kill), file=sys.stderr)
        self.assertFitted(rc, stderr, max_usage, oom_kill)
        self.assertEqual(info["model_bytes"], ROWS * COLS * (4 + 2))
        self.assertEqual(info["missing"], [])
        self.assertEqual(info["unexpected"], ["layers.%d.weight" % i for i in range(2, TENSORS)])
        self.assertEqual(params, {
            "layers.0.weight": ("torch.float32", self.expected["layers.0.weight"]),
            "layers.1.weight": ("torch.bfloat16", self.expected_bf16)})


if __name__ == "__main__":
    mounted.main()
