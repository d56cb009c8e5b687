#!/usr/bin/python3
"""Writes consecutive checkpoints of one real training run: OUT/v0.pt .. OUT/v{N-1}.pt.

Each file holds a small transformer-ish MLP's state_dict and its Adam state, saved every few
optimizer steps (so consecutive files differ a little, as in a training run); the first layer
is frozen, so its tensors never change. Deterministic for a seed. Needs Debian's /usr/bin/python3
(python3-torch). Usage: delta_versions.py OUT N [--hidden H] [--dtype float32|bfloat16]
"""
import argparse
import os

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("n", type=int)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    dtype = getattr(torch, args.dtype)
    h = args.hidden
    model = torch.nn.Sequential(
        torch.nn.Linear(h, h), torch.nn.GELU(),
        torch.nn.Linear(h, 4 * h), torch.nn.GELU(),
        torch.nn.Linear(4 * h, h)).to(dtype)
    for p in model[0].parameters():
        p.requires_grad_(False)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    os.makedirs(args.out, exist_ok=True)
    for v in range(args.n):
        for _ in range(2):
            x = torch.randn(16, h, dtype=dtype)
            loss = (model(x).float() - x.float()).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        torch.save({"module": model.state_dict(), "optimizer": opt.state_dict(),
                    "global_steps": 2 * (v + 1)}, os.path.join(args.out, "v%d.pt" % v))


if __name__ == "__main__":
    main()
