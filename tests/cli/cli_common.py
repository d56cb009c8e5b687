"""Helpers for the CLI integration tests (tests/cli/test_*.py): the mount fixtures of tests/fs,
`ckptfs` runs that return (exit code, stdout, stderr), and a small JSON-schema checker for the
--json schemas documented in docs/cli.md (tests/cli/schemas.json holds them as data)."""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "fs"))
import mounted  # noqa: E402,F401  (before torch: it starts the cleanup guard)

CKPTFS = mounted.CKPTFS


def run(*args, stdin=None, timeout=300):
    """`ckptfs ARGS`: a CompletedProcess (returncode, stdout, stderr as text); never raises."""
    import subprocess
    return subprocess.run([CKPTFS] + [str(a) for a in args], input=stdin, capture_output=True,
                          text=stdin is None or isinstance(stdin, str), timeout=timeout)


def new_dir(name):
    """A new empty directory under the tests' temporary root."""
    import tempfile
    return tempfile.mkdtemp(prefix=name + "-", dir=mounted.root_dir())


def ckptfs_xattrs(path):
    return [a for a in os.listxattr(path) if a.startswith("user.ckptfs")]


# ---- --json schemas -------------------------------------------------------------------------

with open(os.path.join(HERE, "schemas.json")) as _f:
    SCHEMAS = json.load(_f)


def check_schema(value, schema, where="$"):
    """Checks `value` against a JSON-schema subset (type, properties, required, items,
    additionalProperties: false, enum, minimum). Raises AssertionError naming the place."""
    types = schema.get("type")
    if types is not None:
        types = types if isinstance(types, list) else [types]
        ok = False
        for t in types:
            ok = ok or {
                "object": lambda v: isinstance(v, dict),
                "array": lambda v: isinstance(v, list),
                "string": lambda v: isinstance(v, str),
                "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
                "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
                "boolean": lambda v: isinstance(v, bool),
                "null": lambda v: v is None,
            }[t](value)
        if not ok:
            raise AssertionError("%s: %r is not of type %s" % (where, value, types))
    if "enum" in schema and value not in schema["enum"]:
        raise AssertionError("%s: %r not one of %s" % (where, value, schema["enum"]))
    if "minimum" in schema and isinstance(value, (int, float)) and value < schema["minimum"]:
        raise AssertionError("%s: %r < %r" % (where, value, schema["minimum"]))
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for key in schema.get("required", []):
            if key not in value:
                raise AssertionError("%s: missing %r" % (where, key))
        for key, v in value.items():
            if key in props:
                check_schema(v, props[key], "%s.%s" % (where, key))
            elif schema.get("additionalProperties") is False:
                raise AssertionError("%s: unexpected key %r" % (where, key))
            elif isinstance(schema.get("additionalProperties"), dict):
                check_schema(v, schema["additionalProperties"], "%s.%s" % (where, key))
    if isinstance(value, list) and "items" in schema:
        for i, v in enumerate(value):
            check_schema(v, schema["items"], "%s[%d]" % (where, i))


def json_of(test, command, *args):
    """Runs `ckptfs COMMAND ARGS --json`, checks exit 0 and the documented schema; the dict."""
    p = run(command, *args, "--json")
    test.assertEqual(p.returncode, 0, "ckptfs %s %s --json: %s" % (command, args, p.stderr))
    doc = json.loads(p.stdout)
    check_schema(doc, SCHEMAS[command], command)
    return doc


def status_of(test, mountpoint):
    """`ckptfs status --json`, exit 0, with only the entry of `mountpoint` checked against the
    schema (other mounts on a shared machine may be served by other ckptfs builds); that
    entry."""
    p = run("status", "--json")
    test.assertEqual(p.returncode, 0, p.stderr)
    doc = json.loads(p.stdout)
    mine = [m for m in doc["mounts"] if m["mountpoint"] == os.path.realpath(mountpoint)]
    test.assertEqual(len(mine), 1, doc)
    check_schema({"mounts": mine}, SCHEMAS["status"], "status")
    return mine[0]
