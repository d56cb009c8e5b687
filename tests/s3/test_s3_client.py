"""Runs the S3 client's integration tests (s3_client_tests, GoogleTest) against a real radosgw:
starts the Ceph fixture, creates the test bucket and seeds, with boto3, what the client must
recognise (an object whose bytes disagree with its stored SHA-256, an object written by another
tool, a multipart upload left incomplete), then stops the cluster however the tests end.

Skips (exit 77) when Ceph or boto3 is not installed. Usage: test_s3_client.py S3_CLIENT_TESTS"""
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ceph_fixture  # noqa: E402

try:
    import boto3
except ImportError:
    boto3 = None

BUCKET = "ckptfs-test"


def seed(cluster):
    s3 = boto3.client("s3", endpoint_url=cluster.endpoint, aws_access_key_id=cluster.access_key,
                      aws_secret_access_key=cluster.secret_key, region_name="us-east-1")
    s3.create_bucket(Bucket=BUCKET)
    s3.put_object(Bucket=BUCKET, Key="seeded/bad-checksum", Body=b"these bytes changed",
                  Metadata={"ckptfs-sha256": "0" * 64})
    s3.put_object(Bucket=BUCKET, Key="seeded/foreign", Body=b"written by boto3")
    s3.create_multipart_upload(Bucket=BUCKET, Key="seeded/incomplete")


def main():
    if not ceph_fixture.installed() or boto3 is None:
        print("skipped: Ceph or python3-boto3 is not installed (scripts/setup.sh installs them)")
        return 77
    binary = sys.argv[1]
    root = tempfile.mkdtemp(prefix="s3-client-", dir="/tmp")
    try:
        with ceph_fixture.CephCluster(os.path.join(root, "ceph")) as cluster:
            seed(cluster)
            env = dict(os.environ, **cluster.env())
            env.update(S3_TEST_BUCKET=BUCKET, RGW_PID=str(cluster.procs["rgw"].pid),
                       HOME=root)  # no ~/.aws of the machine's user
            return subprocess.run([binary] + sys.argv[2:], env=env, timeout=240).returncode
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
