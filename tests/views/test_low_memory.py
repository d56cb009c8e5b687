#!/usr/bin/python3
"""Loading a checkpoint larger than the loader's memory through the per-tensor views
(docs/views.md, "Memory").

Must-show: with `--cache-size 128M`, a process confined to a 512 MiB memory cgroup (the cgroup
v1 memory controller at /sys/fs/cgroup/memory; the test makes and removes its own group) loads
a 2 GiB checkpoint tensor by tensor through the views; the daemon's peak RSS stays <= cache +
in-flight budget + 64 MiB.
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
CGROUP_ROOT = "/sys/fs/cgroup/memory"
CACHE = 128 * MiB
INFLIGHT = 64 * MiB
OVERHEAD = 64 * MiB
LIMIT = 512 * MiB
TENSORS = 64
ROWS, COLS = 2048, 4096  # 32 MiB of float32 each: 2 GiB in all

if os.geteuid() != 0:
    mounted.skip_all("a memory cgroup needs root")
if not os.path.exists(os.path.join(CGROUP_ROOT, "memory.limit_in_bytes")):
    mounted.skip_all("needs the cgroup v1 memory controller at " + CGROUP_ROOT)

# The loader, run in the cgroup: every tensor of index.json, one at a time, mapped, copied
# out, hashed and dropped. Prints one JSON line per tensor, then its own peak RSS.
LOADER = r"""
import gc, hashlib, json, os, sys
import numpy as np
vdir = sys.argv[1]
with open(os.path.join(vdir, "index.json")) as f:
    index = json.load(f)
for entry in index["tensors"]:
    arr = np.load(os.path.join(vdir, entry["file"]), mmap_mode="r")
    copy = np.array(arr)
    print(json.dumps({"name": entry["name"], "dtype": str(copy.dtype),
                      "shape": list(copy.shape), "sha1": hashlib.sha1(copy.data).hexdigest()}),
          flush=True)
    del arr, copy
    gc.collect()
with open("/proc/self/status") as f:
    hwm = [l.split()[1] for l in f if l.startswith("VmHWM:")][0]
print(json.dumps({"vmhwm_kb": int(hwm)}), flush=True)
"""


def tensor_sha1(t):
    return hashlib.sha1(memoryview(t.contiguous().numpy()).cast("B")).hexdigest()


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

    def test_load_2gib_in_512mib_cgroup(self):
        d = self.version_dir()
        path = os.path.join(d, "model.pt")
        start = time.monotonic()
        torch.manual_seed(23)
        model = {"layers.%d.weight" % i: torch.randn(ROWS, COLS) for i in range(TENSORS)}
        expected = {n: ("float32", [ROWS, COLS], tensor_sha1(t)) for n, t in model.items()}
        total = sum(t.numel() * t.element_size() for t in model.values())
        torch.save(model, path)
        del model  # keep the checksums only: this process stays small too
        saved = time.monotonic()

        # A fresh daemon: its VmHWM counts from the mount on.
        self.remount(self.mount_options)
        pid = int(os.getxattr(self.mnt, "user.ckptfs.pid"))
        self.assertEqual(pid, self.m.pid)
        hwm_fresh = proc_status_kb(pid, "VmHWM")
        remounted = time.monotonic()

        group = self.make_cgroup()
        p = subprocess.run(
            ["/bin/sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', group,
             "/usr/bin/python3", "-c", LOADER, path + "@tensors"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600)
        done = time.monotonic()
        max_usage = int(cgroup_read(group, "memory.max_usage_in_bytes"))
        failcnt = int(cgroup_read(group, "memory.failcnt"))
        oom = dict(line.split() for line in (cgroup_read(group, "memory.oom_control")
                                             or "").splitlines())
        hwm = proc_status_kb(pid, "VmHWM")
        rss = proc_status_kb(pid, "VmRSS")
        lines = [json.loads(line) for line in p.stdout.splitlines() if line.strip()]
        child_hwm = lines[-1].get("vmhwm_kb") if lines else None
        loaded = {e["name"]: (e["dtype"], e["shape"], e["sha1"]) for e in lines if "name" in e}
        bound = CACHE + INFLIGHT + OVERHEAD
        print("low memory: %.0f MiB checkpoint (%d tensors), save %.1f s, remount %.1f s, load %.1f s; "
              "loader in a %d MiB cgroup: exit %d, peak RSS %s MiB, cgroup max usage %.0f MiB, "
              "failcnt %d, oom_kill %s; daemon (--cache-size 128M --inflight 64M) VmHWM %.0f MiB "
              "(%.0f MiB after mount), VmRSS %.0f MiB, bound %d MiB"
              % (total / MiB, TENSORS, saved - start, remounted - saved, done - remounted, LIMIT // MiB, p.returncode,
                 "%.0f" % (child_hwm / 1024) if child_hwm else "?", max_usage / MiB, failcnt,
                 oom.get("oom_kill", "?"), hwm / 1024, hwm_fresh / 1024, rss / 1024,
                 bound // MiB), file=sys.stderr)
        self.assertEqual(p.returncode, 0, "loader failed (OOM-killed if -9)\nstderr: %s"
                         % p.stderr[-4000:])
        self.assertEqual(oom.get("oom_kill", "0"), "0", "the cgroup's OOM killer ran")
        self.assertLessEqual(max_usage, LIMIT)
        self.assertEqual(sorted(loaded), sorted(expected))
        for name, want in expected.items():
            self.assertEqual(loaded[name], want, "%s differs" % name)
        self.assertLessEqual(hwm * 1024, bound, "daemon peak RSS %.0f MiB > %d MiB"
                             % (hwm / 1024, bound // MiB))


if __name__ == "__main__":
    mounted.main()
