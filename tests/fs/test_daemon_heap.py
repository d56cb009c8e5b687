#!/usr/bin/python3
"""The daemon's heap in transparent huge pages (fs/daemon_heap.h, docs/fs.md "Huge pages").

- `ckptfs mount` runs again with GLIBC_TUNABLES=glibc.malloc.hugetlb=1, so the daemon starts
  with it (its /proc/PID/environ) and, where the kernel's THP mode lets a process ask for huge
  pages (madvise or always), a save and a read through the mount leave its heap in huge pages
  (AnonHugePages of its [heap] mappings). The process keeps its name (comm: ps, pgrep).
- Once the daemon went quiet and trimmed its heap, the heap is advised against huge pages
  (VmFlags "nh": khugepaged would fill the trimmed holes again); reads through the daemon advise
  them again ("hg") and collapse the heap into huge pages (>= 90% of its resident bytes).
- A GLIBC_TUNABLES that already names glibc.malloc.hugetlb is the user's choice and is kept:
  with glibc.malloc.hugetlb=0 the daemon runs with exactly that
  value and, where THP is madvise, without huge pages.
"""
import io
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mounted  # noqa: E402

MiB = 1 << 20


def thp_mode():
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return f.read().split("[")[1].split("]")[0]
    except (OSError, IndexError):
        return "never"


def daemon_tunables(pid):
    with open(f"/proc/{pid}/environ", "rb") as f:
        env = dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)
    value = env.get(b"GLIBC_TUNABLES")
    return value.decode() if value is not None else None


def payload(size):
    return b"".join(mounted.data(min(64 * MiB, size - i), seed=7 + i)
                    for i in range(0, size, 64 * MiB))


def heap_mappings(pid):
    """One dict per [heap] mapping of the process (smaps): its VmFlags ("hg": huge pages
    advised, "nh": advised against) and its AnonHugePages and Rss in bytes."""
    out = []
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and ":" not in head[0]:
                out.append(dict(flags=set(), huge=0, rss=0, heap=line.rstrip().endswith("[heap]")))
            elif line.startswith("VmFlags:"):
                out[-1]["flags"] = set(head[1:])
            elif line.startswith("AnonHugePages:"):
                out[-1]["huge"] = int(head[1]) * 1024
            elif line.startswith("Rss:"):
                out[-1]["rss"] = int(head[1]) * 1024
    return [m for m in out if m["heap"]]


def heap_vm_flags(pid):
    return [m["flags"] for m in heap_mappings(pid)]


def heap_huge_and_resident(pid):
    """Bytes of the heap in huge pages (AnonHugePages) and resident (Rss)."""
    heap = heap_mappings(pid)
    return sum(m["huge"] for m in heap), sum(m["rss"] for m in heap)


class DaemonHeapTest(mounted.MountedTestCase):

    def setUp(self):
        pass  # each test mounts with its own environment

    def mount_with_tunables(self, name, tunables):
        """A mount whose `ckptfs mount` runs with GLIBC_TUNABLES=tunables (None: unset)."""
        before = os.environ.pop("GLIBC_TUNABLES", None)
        if tunables is not None:
            os.environ["GLIBC_TUNABLES"] = tunables
        try:
            return self.new_mount(name=name)
        finally:
            os.environ.pop("GLIBC_TUNABLES", None)
            if before is not None:
                os.environ["GLIBC_TUNABLES"] = before

    def save_and_read(self, m, size=64 * MiB):
        path = os.path.join(m.mnt, "v1")
        os.mkdir(path)
        data = payload(size)
        mounted.write_file(os.path.join(path, "model.pt"), data)
        mounted.ckptfs("sync", m.mnt)
        self.assertEqual(mounted.read_file(os.path.join(path, "model.pt")), data)

    def test_the_daemon_asks_for_huge_pages(self):
        m = self.mount_with_tunables("huge", None)
        self.assertEqual(daemon_tunables(m.pid), "glibc.malloc.hugetlb=1")
        # Run again from its own path, not /proc/self/exe: ps and pgrep still say ckptfs.
        with open(f"/proc/{m.pid}/comm") as f:
            self.assertEqual(f.read().strip(), os.path.basename(mounted.CKPTFS)[:15])
        self.save_and_read(m)
        if thp_mode() in ("madvise", "always"):
            self.assertGreater(heap_huge_and_resident(m.pid)[0], 0,
                               "no huge page in the daemon's heap after a 64 MiB save and read")

    def test_the_heap_rests_once_the_daemon_is_quiet(self):
        """After the trim of a quiet daemon, its heap is advised against huge pages (khugepaged
        would fill the trimmed holes again); the next read advises them again."""
        m = self.mount_with_tunables("rest", None)
        # More than the trimmer's 32 MiB minimum must lie free in the heap once the save is
        # committed: a torch checkpoint of 256 MiB of tensors, which the daemon encodes (random
        # bytes, stored as they are, left 40-60 MiB of heap in all, and a quiet trim came or not
        # with the timing).
        os.mkdir(os.path.join(m.mnt, "v1"))
        path = os.path.join(m.mnt, "v1", "model.pt")
        torch.manual_seed(0)
        torch.save({f"w{i}": torch.randn(4 << 20) * 0.02 for i in range(16)}, path)
        mounted.ckptfs("sync", m.mnt)
        expected = mounted.read_file(path)
        self.assertEqual(torch.load(io.BytesIO(expected))["w3"].numel(), 4 << 20)
        # The trimmer trims once the daemon used < 5% of a core over 10 s.
        self.assertTrue(mounted.wait_until(
            lambda: any("nh" in f for f in heap_vm_flags(m.pid)), 60),
            "the heap was not advised against huge pages after the daemon went quiet: %s"
            % heap_vm_flags(m.pid))
        self.assertFalse(any("hg" in f for f in heap_vm_flags(m.pid)))

        def read_through_the_daemon():
            with open(path, "rb") as f:
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)  # not from page cache
                self.assertEqual(f.read(), expected)
            return any("hg" in f for f in heap_vm_flags(m.pid))

        self.assertTrue(mounted.wait_until(read_through_the_daemon, 20, interval=0.2),
                        "reads did not wake the heap: %s" % heap_vm_flags(m.pid))
        # Waking collapsed the heap into huge pages: the trim had split the ones beside live
        # buffers, and those ranges would fault 4 KiB at a time.
        # (The trimmer collapses right after it advised them: wait for it.)
        if thp_mode() in ("madvise", "always"):
            def collapsed():
                huge, resident = heap_huge_and_resident(m.pid)
                return huge >= resident * 0.9
            self.assertTrue(mounted.wait_until(collapsed, 10),
                            "heap after waking: %d of %d bytes in huge pages"
                            % heap_huge_and_resident(m.pid))

    def test_a_users_choice_is_kept(self):
        chosen = "glibc.malloc.hugetlb=0"
        m = self.mount_with_tunables("chosen", chosen)
        self.assertEqual(daemon_tunables(m.pid), chosen)
        self.save_and_read(m)
        if thp_mode() == "madvise":
            self.assertEqual(heap_huge_and_resident(m.pid)[0], 0)


if __name__ == "__main__":
    mounted.check_prerequisites()
    mounted.main()
