"""The rough edges of issue 16, each as a test that failed before its fix: commands on a path
that is not a mount, a second mount on a busy mount point, missing stores, silent format
upgrades, umount of a read-only mount, messages for misdirected commands, help and
did-you-mean, sizes in T, --version with the store format."""
import json
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cli_common import CKPTFS, ckptfs_xattrs, mounted, new_dir, run  # noqa: E402


class NotAMount(unittest.TestCase):
    def test_sync_and_seal_on_a_plain_directory_fail_and_leave_no_attribute(self):
        d = new_dir("plain")
        os.mkdir(os.path.join(d, "v1"))
        for args in (["sync", d], ["seal", d], ["seal", os.path.join(d, "v1")]):
            p = run(*args)
            self.assertEqual(p.returncode, 1, args)
            self.assertIn("not inside a ckptfs mount", p.stderr)
        self.assertEqual(ckptfs_xattrs(d), [])
        self.assertEqual(ckptfs_xattrs(os.path.join(d, "v1")), [])

    def test_umount_of_a_plain_directory_fails(self):
        p = run("umount", new_dir("plain"))
        self.assertEqual(p.returncode, 1)
        self.assertIn("not a ckptfs mount point", p.stderr)


class MissingStore(unittest.TestCase):
    def test_mount_refuses_a_missing_store_unless_create(self):
        base = new_dir("missing")
        store, mnt = os.path.join(base, "stoer"), os.path.join(base, "mnt")
        os.mkdir(mnt)
        p = run("mount", store, mnt)
        self.assertEqual(p.returncode, 1)
        self.assertIn("ckptfs init", p.stderr)
        self.assertFalse(os.path.exists(store), "a refused mount made the store")
        self.assertFalse(mounted.is_mounted(mnt))
        m = mounted.Mount("create")
        self.addCleanup(m.close)
        m.mount([])  # mounted.Mount passes --create for a new store
        self.assertTrue(os.path.exists(os.path.join(m.store, "ckptfs.json")))

    def test_put_refuses_a_missing_store_unless_create(self):
        store = os.path.join(new_dir("put"), "stoer")
        p = run("put", store, "x", stdin=b"bytes")
        self.assertEqual(p.returncode, 1)
        self.assertIn(b"ckptfs init", p.stderr)
        self.assertFalse(os.path.exists(store))
        self.assertEqual(run("put", store, "x", "--create", stdin=b"bytes").returncode, 0)
        self.assertEqual(run("get", store, "x").stdout, "bytes")

    def test_init_records_the_codec_and_mount_reads_it(self):
        store = os.path.join(new_dir("init"), "store")
        p = run("init", store, "--codec", "zstd:5")
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(os.path.join(store, "ckptfs.json")) as f:
            self.assertEqual(json.load(f)["codec"], "zstd:5")
        self.assertEqual(run("init", store).returncode, 1, "init of an existing store")
        m = mounted.Mount("init")
        m.store = store
        self.addCleanup(m.close)
        m.mount([])
        with open(os.path.join(store, "ckptfs.log")) as f:
            log = f.read()
        self.assertIn("codec zstd:5", log)


class FormatUpgrade(unittest.TestCase):
    def test_an_older_store_is_not_upgraded_silently(self):
        store = os.path.join(new_dir("old"), "store")
        self.assertEqual(run("put", store, "x", "--create", stdin="bytes").returncode, 0)
        path = os.path.join(store, "ckptfs.json")
        with open(path) as f:
            config = json.load(f)
        config["format"] = 1
        with open(path, "w") as f:
            json.dump(config, f)
        for args in (["stats", store], ["ls", store], ["verify", store], ["get", store, "x"]):
            p = run(*args)
            self.assertEqual(p.returncode, 1, args)
            self.assertIn("ckptfs upgrade", p.stderr)
            with open(path) as f:
                self.assertEqual(json.load(f)["format"], 1, "%s upgraded the store" % args)
        p = run("upgrade", store)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("from format 1 to 2", p.stdout)
        with open(path) as f:
            self.assertEqual(json.load(f)["format"], 2)
        self.assertEqual(run("get", store, "x").stdout, "bytes")


class Mounts(mounted.MountedTestCase):
    mount_options = ["--seal-after", "0", "--cache-size", "1T"]

    def test_cache_size_in_terabytes_is_accepted(self):
        self.assertTrue(mounted.is_mounted(self.mnt))  # mounted with --cache-size 1T
        with open(os.path.join(self.store, "ckptfs.log")) as f:
            log = f.read()
        self.assertIn("cache 1048576 MiB", log)

    def test_a_second_mount_on_a_busy_mount_point_is_refused(self):
        other = os.path.join(new_dir("other"), "store")
        self.assertEqual(run("init", other).returncode, 0)
        p = run("mount", other, self.mnt)
        self.assertEqual(p.returncode, 1)
        self.assertIn("is a mount point already", p.stderr)
        points = [pt for pt in mounted.mounted_points() if pt == os.path.realpath(self.mnt)]
        self.assertEqual(len(points), 1, "a second store was stacked on the mount point")
        self.assertFalse(os.path.exists(os.path.join(other, "ckptfs.log")), "its daemon ran")

    def test_seal_of_something_that_is_not_a_version_says_so(self):
        v1 = self.version_dir("v1")
        mounted.write_file(os.path.join(v1, "f"), b"x")
        os.symlink("v1", self.m.path("latest"))
        for path in (self.m.path("latest"), os.path.join(v1, "f")):
            p = run("seal", path)
            self.assertEqual(p.returncode, 1, path)
            self.assertIn("is not a version", p.stderr)
            self.assertNotIn("is it inside", p.stderr)
        self.assertEqual(os.getxattr(v1, "user.ckptfs.sealed"), b"0")
        self.assertEqual(run("seal", v1).returncode, 0)
        self.assertEqual(os.getxattr(v1, "user.ckptfs.sealed"), b"1")

    def test_verify_of_a_mount_verifies_its_store(self):
        v1 = self.version_dir("v1")
        mounted.write_file(os.path.join(v1, "f"), mounted.data(1 << 20, 1))
        self.assertEqual(run("sync", self.mnt).returncode, 0)
        for path in (self.mnt, v1, self.store):  # the mount, a path in it, its (mounted) store
            p = run("verify", path)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn("no problems", p.stdout)
            self.assertNotIn("no ckptfs store", p.stderr)
        p = run("verify", new_dir("plain"))
        self.assertEqual(p.returncode, 1)
        self.assertIn("neither a ckptfs store nor inside a ckptfs mount", p.stderr)

    def test_sync_inside_a_mount_works(self):
        v1 = self.version_dir("v1")
        mounted.write_file(os.path.join(v1, "f"), b"x")
        self.assertEqual(run("sync", v1).returncode, 0)
        self.assertEqual(run("sync", self.mnt).returncode, 0)


class ReadOnlyMount(unittest.TestCase):
    def test_umount_of_a_read_only_mount(self):
        m = mounted.Mount("ro")
        self.addCleanup(m.close)
        m.mount()
        os.mkdir(m.path("v1"))
        mounted.write_file(m.path("v1", "f"), b"x")
        m.umount()
        m.mount(["-o", "ro"])
        self.assertEqual(os.listdir(m.mnt), ["v1"])
        p = run("umount", m.mnt)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertFalse(mounted.is_mounted(m.mnt))
        self.assertEqual(run("sync", m.mnt).returncode, 1)  # no longer a mount


class Help(unittest.TestCase):
    def test_help_and_help_command(self):
        p = run("help")
        self.assertEqual(p.returncode, 0)
        for command in ("init", "mount", "umount", "verify", "gc", "upgrade"):
            self.assertIn(command, p.stdout)
        p = run("help", "mount")
        self.assertEqual(p.returncode, 0)
        self.assertIn("--cache-size", p.stdout)
        self.assertIn("--create", p.stdout)
        p = run("help", "mout")
        self.assertEqual(p.returncode, 2)
        self.assertIn("Did you mean 'mount'", p.stderr)

    def test_a_mistyped_command_gets_a_suggestion(self):
        for typo, meant in (("mout", "mount"), ("umonut", "umount"), ("verfy", "verify"),
                            ("stat", "stats")):
            p = run(typo, "x")
            self.assertEqual(p.returncode, 2, typo)
            self.assertIn("Did you mean '%s'?" % meant, p.stderr)
            self.assertNotIn("A subcommand is required", p.stderr)
        p = run("frobnicate")
        self.assertEqual(p.returncode, 2)
        self.assertIn("not a ckptfs command", p.stderr)

    def test_a_mistyped_option_gets_a_suggestion(self):
        for args, typo, meant in ((("mount", "s", "m", "--cach-size", "1G"), "--cach-size",
                                   "--cache-size"),
                                  (("verify", "x", "--jsn"), "--jsn", "--json"),
                                  (("forget", "x", "--keep-lst", "3"), "--keep-lst", "--keep-last"),
                                  (("advise", "--mtbf=6h", "--save-second", "1"), "--save-second",
                                   "--save-seconds")):
            p = run(*args)
            self.assertEqual(p.returncode, 2, args)
            self.assertIn("no option '%s'. Did you mean '%s'?" % (typo, meant), p.stderr)
            self.assertIn("ckptfs help %s" % args[0], p.stderr)
        p = run("gc", "x", "--frobnicate")
        self.assertEqual(p.returncode, 2)
        self.assertIn("no option '--frobnicate'.", p.stderr)
        self.assertNotIn("Did you mean", p.stderr)

    def test_help_describes_every_command(self):
        listing = run("help").stdout
        commands = [line.split()[0] for line in
                    listing.split("Subcommands:")[1].strip().splitlines() if line.strip()]
        self.assertIn("advise", commands)
        self.assertGreaterEqual(len(commands), 20)
        for command in commands:
            p = run("help", command)
            self.assertEqual(p.returncode, 0, command)
            self.assertIn("Usage:", p.stdout, command)
            self.assertEqual(p.stdout, run(command, "--help").stdout, command)
            # Every argument is described: no option line without words after its name.
            for line in p.stdout.splitlines():
                if line.strip().startswith("-") and len(line.split()) < 2:
                    self.fail("%s: %r has no description" % (command, line))

    def test_bash_completion_reads_the_commands_and_options_from_the_binary(self):
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                              "packaging", "bash-completion", "ckptfs")

        def complete(*words):
            line = ("source %s; COMP_WORDS=(%s %s); COMP_CWORD=%d; _ckptfs; "
                    "echo \"${COMPREPLY[*]}\"" % (script, CKPTFS, " ".join(words), len(words)))
            return subprocess.run(["bash", "-c", line], capture_output=True, text=True,
                                  check=True).stdout.split()

        listing = run("help").stdout
        commands = [line.split()[0] for line in
                    listing.split("Subcommands:")[1].strip().splitlines() if line.strip()]
        self.assertEqual(sorted(c for c in complete("") if not c.startswith("-")),
                         sorted(commands))
        self.assertEqual(complete("adv"), ["advise"])
        self.assertEqual(complete("advise", "--m"), ["--mtbf"])
        self.assertEqual(complete("mount", "s", "m", "--keep-l"), ["--keep-last"])
        self.assertEqual(complete("export", "a", "b", "--to", "s"), ["safetensors"])

    def test_no_command_prints_the_help(self):
        p = run()
        self.assertEqual(p.returncode, 2)
        self.assertIn("Subcommands", p.stderr)

    def test_version_names_the_store_format(self):
        p = run("--version")
        self.assertEqual(p.returncode, 0)
        self.assertRegex(p.stdout, r"^ckptfs \d+\.\d+\.\d+ \(store format \d+\)")


if __name__ == "__main__":
    mounted.main()
