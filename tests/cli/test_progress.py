"""Progress of long commands (docs/cli.md "Progress"): verify, gc, restore, export and forget
draw a one-line progress on stderr when stderr is a terminal (a pty here), online (the daemon
sends it over the control socket) and offline, and never with --json or when stderr is piped.
Real torch saves into a real mount."""
import json
import os
import pty
import re
import shutil
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cli_common import CKPTFS, mounted, new_dir, run  # noqa: E402

try:
    import torch  # noqa: E402
except ImportError:
    mounted.skip_all("needs python3-torch (run with Debian's /usr/bin/python3)")


def run_on_tty(*args):
    """`ckptfs ARGS` with stderr on a pseudo-terminal and stdout piped: (exit code, stdout,
    what the terminal received)."""
    master, slave = pty.openpty()
    p = subprocess.Popen([CKPTFS] + [str(a) for a in args], stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    received = b""
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the last writer closed the terminal
            break
        if not data:
            break
        received += data
    out = p.stdout.read()
    p.wait(timeout=300)
    p.stdout.close()
    os.close(master)
    return p.returncode, out.decode(), received.decode(errors="replace")


def progress_re(what):
    # "\rverify  1.20 MiB / 24.0 MiB    5%" (then a rate and an ETA once there is one)
    return re.compile(r"\r%s  [\d.]+ (B|KiB|MiB|GiB) / [\d.]+ (B|KiB|MiB|GiB) +\d+%%" % what)


class Progress(unittest.TestCase):
    def setUp(self):
        self.m = mounted.Mount("progress")
        self.addCleanup(self.m.close)
        self.assertEqual(run("init", self.m.store).returncode, 0)
        self.m.mount(["--seal-after", "0"])
        self.tmp = new_dir("progress-out")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        for step in (1, 2, 3, 4):
            d = self.m.path("v%d" % step)
            os.mkdir(d)
            g = torch.Generator().manual_seed(step)
            torch.save({"w": torch.randn(2 << 20, generator=g)}, os.path.join(d, "model.pt"))
            self.assertEqual(run("seal", d).returncode, 0)
        self.assertEqual(run("sync", self.m.mnt).returncode, 0)

    def out(self, name):
        return os.path.join(self.tmp, name)

    def assert_progress(self, what, *args):
        rc, out, tty = run_on_tty(*args)
        self.assertEqual(rc, 0, tty)
        self.assertRegex(tty, progress_re(what), "%s: no progress on the terminal" % (args,))
        self.assertTrue(tty.endswith("\r\033[K") or "\r\033[K" in tty, "line not erased")
        self.assertNotIn("\r", out)
        return out

    def assert_no_progress(self, *args, piped=None):
        """None with --json on the terminal (args), nor with stderr piped (piped, else args)."""
        rc, out, tty = run_on_tty(*args, "--json")
        self.assertEqual(rc, 0, tty)
        json.loads(out)
        self.assertNotIn("\r", tty, "--json drew progress")
        self.assertNotIn("%", tty)
        p = run(*(piped or args))  # stderr piped
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertNotIn("\r", p.stderr, "progress on a pipe")
        self.assertNotIn("%", p.stderr)

    def test_online_through_the_daemon_then_offline(self):
        mnt, store = self.m.mnt, self.m.store
        # verify: the daemon sends how far it is.
        self.assertIn("no problems", self.assert_progress("verify", "verify", mnt))
        self.assert_no_progress("verify", mnt)
        # restore and export read through the mount.
        self.assert_progress("restore", "restore", mnt, "v4", self.out("r1"))
        self.assert_no_progress("restore", mnt, "v3", self.out("r2"),
                                piped=("restore", mnt, "v3", self.out("r3")))
        src = os.path.join(mnt, "v4", "model.pt")
        self.assert_progress("export", "export", src, self.out("e1.pt"), "--to", "pt")
        self.assert_no_progress("export", src, self.out("e2.safetensors"), "--to", "safetensors",
                                piped=("export", src, self.out("e3.npy"), "--to", "npy"))
        # gc: piped, then on the terminal, each with a pack to rewrite.
        shutil.rmtree(self.m.path("v1"))
        p = run("gc", mnt, "--rewrite-below", "1", "--json")
        self.assertGreater(json.loads(p.stdout)["records_moved"], 0)  # there was work
        self.assertNotIn("\r", p.stderr)
        shutil.rmtree(self.m.path("v2"))
        self.assert_progress("gc", "gc", mnt, "--rewrite-below", "1")
        # forget counts versions, then its gc reports.
        rc, out, tty = run_on_tty("forget", mnt, "--keep-last", "1")
        self.assertEqual(rc, 0, tty)
        self.assertRegex(tty, r"\rforget  [01] / 1 versions")
        self.assertIn("forget  v3", out)

        self.m.umount()
        self.assertIn("no problems", self.assert_progress("verify", "verify", store))
        self.assert_no_progress("verify", store)
        self.assert_progress("restore", "restore", store, "v4", self.out("r4"))
        self.assert_no_progress("restore", store, "v4", self.out("r5"),
                                piped=("restore", store, "v4", self.out("r6")))
        self.assert_progress("export", "export", os.path.join(store, "v4", "model.pt"),
                             self.out("e4"), "--to", "npy")
        with open(os.path.join(self.out("r4"), "model.pt"), "rb") as a, \
                open(os.path.join(self.out("r1"), "model.pt"), "rb") as b:
            self.assertEqual(a.read(), b.read())  # online and offline restores agree
        self.assertEqual(torch.load(self.out("e1.pt"))["w"].numel(), 2 << 20)


if __name__ == "__main__":
    mounted.main()
