#!/usr/bin/env bash
# Installs dependencies (idempotent), builds Release into build/, runs every test with CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
ctest --test-dir build --output-on-failure -j"$(nproc)" --timeout 900
