#!/usr/bin/env bash
# Installs dependencies (idempotent), builds Release into build/, runs every test with CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# Every libFuzzer target for 20 s from its seeds (about 2 minutes with the build): a crash fails.
scripts/fuzz.sh --ci 20
# Clang's thread-safety analysis of the units that see a lock annotation (syntax only: ~1.5 min).
scripts/thread_safety.sh 2
ctest --test-dir build --output-on-failure -j"$(nproc)" --timeout 900
