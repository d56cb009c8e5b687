#!/usr/bin/env bash
# The main job, until the filesystem lands: set up, save a real torch checkpoint twice (a second
# training step's state), store both with the CLI, read them back bitwise, show what it cost.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
ckptfs=build/ckptfs
/usr/bin/python3 scripts/gen_torch_sample.py "$work/step1.pt" --hidden 1024 --seed 1
/usr/bin/python3 scripts/gen_torch_sample.py "$work/step2.pt" --hidden 1024 --seed 1
cp "$work/step2.pt" "$work/step2-resave.pt"
for f in step1 step2-resave; do
  "$ckptfs" put "$work/store" "global_step/$f.pt" < "$work/$f.pt"
done
for f in step1 step2-resave; do
  "$ckptfs" get "$work/store" "global_step/$f.pt" | cmp - "$work/$f.pt"
  echo "read back global_step/$f.pt: bitwise equal"
done
"$ckptfs" ls "$work/store"
"$ckptfs" verify "$work/store"
"$ckptfs" stats "$work/store"
