#!/usr/bin/env bash
# Clang thread-safety analysis of the whole tree (issue 15): every translation unit of the
# project (engine, fs, cli, tests) compiled by clang-14 with -Wthread-safety -Werror, syntax
# only (no code generated, so it is quick). The locks are declared with the annotated Mutex of
# engine/util/mutex.h (GUARDED_BY, REQUIRES, ...), the only home of the annotations; no lock
# annotation is left in a comment (`// GUARDED_BY(mu_)` would go unchecked). Skipped unless
# --all is given (CI keeps under 20 minutes; scripts/sanitize.sh checks everything):
# - a source compiled into several targets (the fuzz targets build engine units again with
#   sanitizer flags: 28 of 182 units) is checked once: those flags do not change the analysis;
# - a unit that does not include engine/util/mutex.h, directly or through the project's headers
#   (followed here, #if or not; a quoted include found nowhere keeps the unit), sees no
#   annotation, so the analysis has nothing to check (the codecs, parsers, cli helpers and the
#   tests of those: 79 of 182 units);
# - a test that names no lock (no Mutex, MutexLock, CondVar or annotation in its own text): its
#   body cannot take or name a lock, and the headers it includes are checked with the units
#   that implement them (26 units).
# 49 units are left (2026-12-07: 1 min 21 s on 2 cores, 2 min 1 s before the first two skips).
#
# Usage: scripts/thread_safety.sh [--all] [JOBS]     (default 2; configures build-tsa/)
set -euo pipefail
cd "$(dirname "$0")/.."
all=0
if [ "${1:-}" = "--all" ]; then
  all=1
  shift
fi
jobs="${1:-2}"
# Configured every time (quick), so that new sources are in compile_commands.json.
CC=clang-14 CXX=clang++-14 cmake -S . -B build-tsa -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_EXPORT_COMPILE_COMMANDS=ON >/dev/null
/usr/bin/python3 - "$jobs" "$all" <<'PY'
import concurrent.futures, json, os, re, shlex, subprocess, sys
jobs = int(sys.argv[1])
root = os.getcwd()
check_all = sys.argv[2] == "1"
entries = [e for e in json.load(open("build-tsa/compile_commands.json"))
           if e["file"].endswith(".cc") and "/_deps/" not in e["file"]]
LOCKS = re.compile(r"\b(Mutex|MutexLock|CondVar|GUARDED_BY|PT_GUARDED_BY|REQUIRES|EXCLUDES|"
                   r"ACQUIRE|RELEASE|SCOPED_CAPABILITY|CAPABILITY|NO_THREAD_SAFETY_ANALYSIS)\b")
def is_test(path):
    return path.endswith("_test.cc") or "/tests/" in path
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)
direct = {}
MUTEX_H = os.path.realpath(os.path.join(root, "engine/util/mutex.h"))
def includes_mutex(source):
    """Whether `source` includes engine/util/mutex.h, directly or through the project's headers
    (quoted includes, resolved against the including file's directory and the tree's root). A
    quoted include found in neither place (a header generated elsewhere) counts as one that may:
    the unit is checked."""
    todo, seen = [os.path.realpath(source)], set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        if path not in direct:
            direct[path] = []
            for inc in INCLUDE.findall(open(path).read()):
                found = [c for c in (os.path.join(os.path.dirname(path), inc),
                                     os.path.join(root, inc)) if os.path.isfile(c)]
                direct[path].append(os.path.realpath(found[0]) if found else None)
        for header in direct[path]:
            if header is None or header == MUTEX_H:
                return True
            todo.append(header)
    return False
skipped = {"duplicates": 0, "no mutex.h": 0, "lock-free tests": 0}
if not check_all:
    kept, files = [], set()
    for e in entries:
        path = e["file"]
        if path in files:
            skipped["duplicates"] += 1
        elif not includes_mutex(path):
            skipped["no mutex.h"] += 1
        elif is_test(path) and not LOCKS.search(open(path).read()):
            skipped["lock-free tests"] += 1
        else:
            kept.append(e)
        files.add(path)
    entries = kept
def check(e):
    args = shlex.split(e["command"])
    out = []
    skip = False
    for a in args:  # drop the output file and any launcher; keep flags and the source
        if skip:
            skip = False
            continue
        if a == "-o":
            skip = True
            continue
        out.append(a)
    if out and out[0].endswith("ccache"):
        out = out[1:]
    out += ["-fsyntax-only", "-Wthread-safety", "-Werror"]
    p = subprocess.run(out, cwd=e["directory"], capture_output=True, text=True)
    return e["file"], p.returncode, p.stderr
failed = 0
with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
    for path, rc, err in pool.map(check, entries):
        if rc != 0:
            failed += 1
            print(err, file=sys.stderr)
print("thread_safety.sh: %d translation units, %d with errors (skipped: %s)"
      % (len(entries), failed, ", ".join("%d %s" % (n, k) for k, n in skipped.items())))
sys.exit(1 if failed else 0)
PY
