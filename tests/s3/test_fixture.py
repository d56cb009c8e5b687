"""The Ceph fixture (tests/s3/ceph_fixture.py): a cluster starts from nothing, serves S3 PUT/GET
to boto3, and stops leaving no process and no listening port behind, whether it is stopped by
its owner, by the command's `stop`, or orphaned by a harness killed with SIGKILL.

Skips (exit 77) when Ceph or boto3 is not installed (scripts/setup.sh installs both)."""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ceph_fixture  # noqa: E402

try:
    import boto3
    import botocore.config
except ImportError:
    boto3 = None

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ceph_fixture.py")


def s3_client(endpoint, access_key, secret_key):
    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=access_key,
                        aws_secret_access_key=secret_key, region_name="us-east-1",
                        config=botocore.config.Config(retries={"max_attempts": 1}))


class FixtureTest(unittest.TestCase):
    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="s3-fixture-", dir="/tmp")
        self.addCleanup(shutil.rmtree, self.root, True)

    def assert_gone(self, directory, ports):
        ceph_fixture._wait(lambda: not ceph_fixture.processes_under(directory), 10,
                           "the daemons to exit")
        for port in ports:
            self.assertFalse(ceph_fixture.port_listening(port), "port %d still listens" % port)

    def test_put_get_then_nothing_left(self):
        d = os.path.join(self.root, "ceph")
        cluster = ceph_fixture.CephCluster(d)
        try:
            cluster.start()
            ports = (cluster.mon_port, cluster.rgw_port)
            self.assertEqual(len(ceph_fixture.processes_under(d)), 4)
            self.assertTrue(all(ceph_fixture.port_listening(p) for p in ports))
            s3 = s3_client(cluster.endpoint, cluster.access_key, cluster.secret_key)
            s3.create_bucket(Bucket="fixture")
            payload = os.urandom(3 << 20)
            s3.put_object(Bucket="fixture", Key="a/b", Body=payload)
            self.assertEqual(s3.get_object(Bucket="fixture", Key="a/b")["Body"].read(), payload)
            part = s3.get_object(Bucket="fixture", Key="a/b", Range="bytes=100-199")
            self.assertEqual(part["Body"].read(), payload[100:200])
            with self.assertRaises(Exception):
                s3_client(cluster.endpoint, cluster.access_key, "wrong" * 8).get_object(
                    Bucket="fixture", Key="a/b")
        finally:
            cluster.stop()
        self.assert_gone(d, ports)
        # Every file the cluster wrote is under its directory.
        self.assertTrue(os.path.exists(os.path.join(d, "log", "mon.a.log")))
        self.assertTrue(os.path.exists(os.path.join(d, "run")))

    def test_command_start_stop_and_orphaned_daemons(self):
        d = os.path.join(self.root, "cli")
        try:
            out = subprocess.run([sys.executable, FIXTURE, "start", d], stdout=subprocess.PIPE,
                                 text=True, timeout=120, check=True).stdout
            info = dict(line.split("=", 1) for line in out.split())
            port = int(info["endpoint"].rsplit(":", 1)[1])
            s3 = s3_client(info["endpoint"], info["access_key"], info["secret_key"])
            s3.create_bucket(Bucket="cli")
            s3.put_object(Bucket="cli", Key="k", Body=b"x" * 1000)
            self.assertEqual(s3.get_object(Bucket="cli", Key="k")["Body"].read(), b"x" * 1000)
        finally:
            subprocess.run([sys.executable, FIXTURE, "stop", d], timeout=120, check=True)
        self.assert_gone(d, [port])

        # A harness killed with SIGKILL takes its daemons with it.
        d = os.path.join(self.root, "orphan")
        try:
            subprocess.run([sys.executable, FIXTURE, "start", d], stdout=subprocess.PIPE,
                           timeout=120, check=True)
            with open(os.path.join(d, "supervisor.pid")) as f:
                os.kill(int(f.read()), signal.SIGKILL)
            self.assert_gone(d, [])
        finally:
            subprocess.run([sys.executable, FIXTURE, "stop", d], timeout=120)
        self.assertEqual(ceph_fixture.processes_under(d), [])


if __name__ == "__main__":
    if not ceph_fixture.installed() or boto3 is None:
        print("skipped: Ceph (ceph-mon ceph-mgr ceph-osd radosgw ceph-common) or python3-boto3 "
              "is not installed; scripts/setup.sh installs them")
        sys.exit(77)
    warnings.simplefilter("ignore", ResourceWarning)  # boto3's pooled connections
    t0 = time.monotonic()
    result = unittest.main(exit=False).result
    print("fixture tests took %.1f s" % (time.monotonic() - t0))
    sys.exit(0 if result.wasSuccessful() else 1)
