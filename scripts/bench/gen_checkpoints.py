#!/usr/bin/python3
"""Writes two real torch checkpoints of one training run, for the engine benchmark.

  v1.pt  a small transformer (token embedding, N encoder layers, tied head) and its Adam state
         after --steps training steps.
  v2.pt  the same run one step later, with the first half of the encoder layers (and the
         embedding) frozen: only the other layers' weights and Adam moments change, the way
         fine-tuning with frozen layers (or a step where part of the model gets no gradient)
         leaves most of a checkpoint as it was.

Both are {"model": state_dict, "optimizer": state_dict, "step": n} saved with torch.save (the
zip format). Also prints where the tensor data records start, to show they are 64-byte aligned.
Deterministic for a given seed. Run with Debian's /usr/bin/python3, which sees python3-torch.
Usage: gen_checkpoints.py OUTDIR [--hidden 512] [--layers 8] [--vocab 8192] [--seed 0]
"""
import argparse
import os
import zipfile

import torch


class Model(torch.nn.Module):
    def __init__(self, vocab, hidden, layers):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.layers = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(hidden, nhead=8, dim_feedforward=4 * hidden,
                                             dropout=0.0, batch_first=True)
            for _ in range(layers))
        self.norm = torch.nn.LayerNorm(hidden)

    def forward(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x) @ self.embed.weight.t()


def train_step(model, opt, vocab, gen):
    tokens = torch.randint(0, vocab, (1, 33), generator=gen)  # CPU torch here is slow
    logits = model(tokens[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def save(model, opt, step, path):
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}, path)
    with zipfile.ZipFile(path) as z:
        offsets = []
        with open(path, "rb") as f:
            for info in z.infolist():
                if "/data/" not in info.filename:
                    continue
                f.seek(info.header_offset + 26)
                name_len = int.from_bytes(f.read(2), "little")
                extra_len = int.from_bytes(f.read(2), "little")
                offsets.append(info.header_offset + 30 + name_len + extra_len)
    aligned = sum(1 for o in offsets if o % 64 == 0)
    print(f"{path}: {os.path.getsize(path) / 1e6:.1f} MB, {len(offsets)} tensor records, "
          f"{aligned} of them start at a multiple of 64")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    gen = torch.Generator().manual_seed(args.seed)
    model = Model(args.vocab, args.hidden, args.layers)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(args.steps):
        train_step(model, opt, args.vocab, gen)
    save(model, opt, args.steps, os.path.join(args.outdir, "v1.pt"))

    # One more step with the embedding and the first half of the layers frozen: Adam skips
    # parameters without a gradient, so their weights and moments stay bit-identical.
    frozen = [model.embed] + list(model.layers[: args.layers // 2])
    for module in frozen:
        for p in module.parameters():
            p.requires_grad_(False)
    train_step(model, opt, args.vocab, gen)
    save(model, opt, args.steps + 1, os.path.join(args.outdir, "v2.pt"))


if __name__ == "__main__":
    main()
