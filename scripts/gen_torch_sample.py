#!/usr/bin/python3
"""Writes a real torch checkpoint (a small MLP, its Adam state after a few steps) to argv[1].

Deterministic for a given seed. Run with Debian's /usr/bin/python3, which sees python3-torch.
Usage: gen_torch_sample.py OUT.pt [--hidden N] [--seed S]
"""
import argparse

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    h = args.hidden
    model = torch.nn.Sequential(torch.nn.Linear(h, 4 * h), torch.nn.GELU(), torch.nn.Linear(4 * h, h))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(3):
        x = torch.randn(32, h)
        loss = (model(x) - x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 3}, args.out)


if __name__ == "__main__":
    main()
