#!/usr/bin/env bash
# Sanitizer builds of the whole tree (issue 15; results in docs/reliability.md):
#   asan  build-asan/: AddressSanitizer + UndefinedBehaviorSanitizer (gcc, -O1 -g). Runs every
#         GoogleTest unit and engine acceptance test and the mounted integration tests whose
#         daemon is this build's ckptfs (ASan reports of the daemon land in the log directory,
#         since a daemon has no terminal). Not run: the tests that load libckptfs_snapshot.so
#         into /usr/bin/python3 (an uninstrumented interpreter cannot host the ASan runtime)
#         and the Debian package test (it installs the package system-wide); fs_kill9 and
#         fs_powercut run without their snapshot phase, fs_security without its snapshot by a
#         second user. The S3 tests (label s3: a Ceph fixture) are not run either. Only the
#         targets the tests need are built (not the benchmarks, nor libckptfs_snapshot.so).
#   tsan  build-tsan/: ThreadSanitizer, on the concurrency tests (committer, ingester, worker
#         pool, chunk and content readers, host ring, snapshot engine, control protocol, the
#         catalog (its map grows only while no transaction is open), the engine's concurrent
#         writers/readers/gc, the re-encoder's overlapping batches (a sync thread beside the
#         appends), and tests/fs/test_concurrency.py against a TSan daemon).
#   threads  scripts/thread_safety.sh: clang -Wthread-safety -Werror over every translation
#         unit (the annotated Mutex of engine/util/mutex.h).
# Any sanitizer report fails the run; the reports are kept in build-sanitize-logs/.
#
# Usage: scripts/sanitize.sh [asan|tsan|threads|all] [JOBS]    (default all, JOBS 2)
# Slow: each build compiles the tree from scratch (ccache helps on reruns).
set -euo pipefail
cd "$(dirname "$0")/.."
what="${1:-all}"
jobs="${2:-2}"
logs="$PWD/build-sanitize-logs"
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi

build() {  # DIR FLAGS TARGET...
  local dir="$1" flags="$2"
  shift 2
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Debug "${launcher[@]}" \
    -DCMAKE_C_FLAGS="-O1 -g $flags" -DCMAKE_CXX_FLAGS="-O1 -g $flags" \
    -DCMAKE_EXE_LINKER_FLAGS="$flags" -DCMAKE_SHARED_LINKER_FLAGS="$flags" >/dev/null
  cmake --build "$dir" -j"$jobs" --target "$@"
}

check_logs() {  # NAME: fails when a sanitizer wrote a report
  if compgen -G "$logs/*" >/dev/null; then
    echo "sanitize.sh: $1: sanitizer reports in $logs:" >&2
    head -n 60 "$logs"/* >&2
    return 1
  fi
  echo "sanitize.sh: $1: no sanitizer reports"
}

status=0
if [ "$what" = threads ] || [ "$what" = all ]; then
  scripts/thread_safety.sh --all "$jobs" || status=1
fi
if [ "$what" = asan ] || [ "$what" = all ]; then
  build build-asan "-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer" \
    ckptfs powercut_fs engine_unit_tests engine_acceptance_tests fs_unit_tests cli_unit_tests \
    snapshot_unit_tests objstore_unit_tests
  rm -rf "$logs" && mkdir -p "$logs"
  CKPTFS_FAULTS_NO_SNAPSHOT=1 \
  ASAN_OPTIONS="log_path=$logs/asan:detect_leaks=1:abort_on_error=0" \
  UBSAN_OPTIONS="log_path=$logs/ubsan:print_stacktrace=1:halt_on_error=1" \
    ctest --test-dir build-asan --output-on-failure -j1 -LE s3 \
      -E '^(snapshot_mounted|snapshot_cuda_mounted|packaging_deb)$|_NOT_BUILT' \
    2>&1 | tee build-asan/ctest-output.txt || status=1  # pipefail: ctest's status
  # UBSan reports of the test binaries reach their stderr, not log_path (gcc 12's combined
  # runtime): keep them from ctest's output too.
  grep -E -A12 'runtime error:|ERROR: (Address|Leak)Sanitizer' build-asan/ctest-output.txt \
    > "$logs/from-test-output" || rm -f "$logs/from-test-output"
  check_logs asan || status=1
fi
if [ "$what" = tsan ] || [ "$what" = all ]; then
  build build-tsan "-fsanitize=thread" ckptfs engine_unit_tests engine_acceptance_tests \
    snapshot_unit_tests
  rm -rf "$logs" && mkdir -p "$logs"
  TSAN_OPTIONS="log_path=$logs/tsan:halt_on_error=0:second_deadlock_stack=1:suppressions=$PWD/scripts/tsan.supp" \
    ctest --test-dir build-tsan --output-on-failure -j1 \
      -R 'Committer|Ingester|WorkerPool|ChunkReaderTest.Concurrent|HostRing|ConcurrencyTest|fs_concurrency|Mutex|ControlProtocol|SnapshotEngine|ContentReader|CatalogTest|DeltaTest.ManySmallReencoderBatches' \
    || status=1
  check_logs tsan || status=1
fi
exit "$status"
