#!/usr/bin/python3
"""Real training trajectories saved the way DeepSpeed saves them, for the storage benchmark.

Trains a small GPT (decoder-only transformer, byte-level: vocabulary 256, written in plain
torch: token + position embeddings, pre-LN blocks of causal self-attention and a GELU MLP,
final LayerNorm, head tied to the token embedding) on CPU and saves every --save-every steps:

  OUT/<trajectory>/global_step<N>/mp_rank_00_model_states.pt
      {'module': model.state_dict(), 'optimizer': None, 'global_steps': N, 'global_samples',
       'dp_world_size': 1, 'mp_world_size': 1, 'param_shapes', 'frozen_param_shapes',
       'shared_params', 'buffer_names', 'lr_scheduler': None, 'skipped_steps': 0, 'ds_config',
       'ds_version', ...}                                  (DeepSpeed's engine keys, ZeRO-1 style)
  OUT/<trajectory>/global_step<N>/zero_pp_rank_0_mp_rank_00_optim_states.pt
      {'optimizer_state_dict': adam.state_dict(), 'ds_config', 'ds_version'}
  OUT/<trajectory>/latest
      the tag ("global_step<N>") as plain text, as DeepSpeed writes it

Both .pt files are written with torch.save (the zip format), as DeepSpeed does. Trajectories:

  fp32      the model in fp32, Adam (lr 1e-3, betas 0.9/0.99), gradient clipping 1.0.
  bf16      the same model, same data, with its parameters in bf16 (model.to(bfloat16)); Adam's
            exp_avg / exp_avg_sq are bf16 too, as torch makes them (no fp32 master copy: that is
            what DeepSpeed's bf16 optimizer would add).
  finetune  starts from the fp32 trajectory's last checkpoint (weights and Adam state, as
            DeepSpeed's load_checkpoint does), freezes the embeddings and the lower half of the
            blocks (requires_grad False: Adam skips them, so their weights and moments stay
            bitwise the same), and continues training on different text (the licenses only).
            Its global_steps continue from the fp32 trajectory's.

Data (real text found on every Debian 12 machine with Python 3.11, read in sorted path order):
  pre-training: /usr/share/common-licenses/* (regular files, symlinks skipped) followed by the
                top-level Python standard library modules /usr/lib/python3.11/*.py
  fine-tuning:  /usr/share/common-licenses/* only (English legal text after a mostly-code mix)
/usr/share/doc/*/copyright is not used: it changes whenever a package is installed. The summary
prints the SHA-256 of each corpus; batches are random windows drawn from a torch.Generator
seeded with --seed, so a run is deterministic (same bytes on every run on the same machine and
torch build: torch.manual_seed, torch.use_deterministic_algorithms, a fixed thread count).

Sizes (--size): ci   hidden 128, 5 blocks, 4 heads, context 128: 1.04 M parameters, 4 versions
                     of each trajectory (saved every 2 steps); 12.6 MB per fp32 version (model
                     4.2 MB + Adam 8.4 MB), 6.3 MB per bf16 one. 5 s on 2 cores (28 s at load
                     average 3-4).
                full hidden 384, 6 blocks, 6 heads, context 256: 10.84 M parameters, 8 versions
                     of each (saved every 5 steps); 130.2 MB per fp32 version, 65.2 MB per bf16
                     one (2.6 GB in all). 6 minutes on 2 cores at load average ~3, 15 minutes
                     at load 5-8 (others compiling on the same cores); fp32 steps are the bulk.
Batches are 4 windows of the context length (CPU time is the limit); the loss still falls from
~5.5 (uniform over 256 bytes) towards ~3 over the full size's 40 steps.

Run with Debian's /usr/bin/python3 (the interpreter that sees python3-torch).
Usage: gen_trajectory.py --out DIR [--size ci|full] [--trajectories fp32,bf16,finetune]
                         [--steps N] [--save-every K] [--seed S] [--threads T] [--json FILE]
"""
import argparse
import glob
import hashlib
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

SIZES = {
    # hidden, blocks, heads, context, batch, steps, save_every
    "ci": dict(hidden=128, layers=5, heads=4, ctx=128, batch=4, steps=8, save_every=2),
    "full": dict(hidden=384, layers=6, heads=6, ctx=256, batch=4, steps=40, save_every=5),
}
VOCAB = 256
MODEL_FILE = "mp_rank_00_model_states.pt"
OPTIM_FILE = "zero_pp_rank_0_mp_rank_00_optim_states.pt"
DS_VERSION = "0.10.0"  # the DeepSpeed layout emulated here (key names of that release)
T0 = time.monotonic()


def log(msg):
    print(f"[{time.monotonic() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- data

def _read_files(paths):
    chunks = []
    for p in paths:
        with open(p, "rb") as f:
            chunks.append(f.read())
    return b"\n".join(chunks)


def license_files():
    return sorted(p for p in glob.glob("/usr/share/common-licenses/*")
                  if os.path.isfile(p) and not os.path.islink(p))


def stdlib_files():
    return sorted(p for p in glob.glob("/usr/lib/python3.11/*.py")
                  if os.path.isfile(p) and not os.path.islink(p))


def corpus(kind):
    files = license_files() + (stdlib_files() if kind == "pretrain" else [])
    if not files:
        raise SystemExit(f"gen_trajectory: no text for the {kind} corpus "
                         "(/usr/share/common-licenses, /usr/lib/python3.11)")
    data = _read_files(files)
    return dict(data=torch.frombuffer(bytearray(data), dtype=torch.uint8).to(torch.long),
                files=len(files), bytes=len(data), sha256=hashlib.sha256(data).hexdigest())


def batch(data, gen, batch_size, ctx):
    starts = torch.randint(0, data.numel() - ctx - 1, (batch_size,), generator=gen)
    x = torch.stack([data[s:s + ctx] for s in starts.tolist()])
    y = torch.stack([data[s + 1:s + 1 + ctx] for s in starts.tolist()])
    return x, y


# ---------------------------------------------------------------- the model

class Linear(torch.nn.Linear):
    """torch.nn.Linear (same parameters, same state_dict) whose fp32 matmul runs as a 1x1
    convolution: Debian's torch does fp32 matmuls with the reference BLAS (~4 GFLOP/s on this
    machine) but convolutions with oneDNN (~45 GFLOP/s), which makes the full size trainable
    here in minutes. bf16 already goes through oneDNN in F.linear."""

    def forward(self, x):
        if x.dtype != torch.float32:
            return F.linear(x, self.weight, self.bias)
        shape = x.shape
        y = F.conv1d(x.reshape(-1, shape[-1], 1), self.weight.unsqueeze(-1), self.bias)
        return y.reshape(*shape[:-1], self.out_features)


class Block(torch.nn.Module):
    def __init__(self, hidden, heads, ctx):
        super().__init__()
        self.heads = heads
        self.ln_1 = torch.nn.LayerNorm(hidden)
        self.c_attn = Linear(hidden, 3 * hidden)
        self.c_proj = Linear(hidden, hidden)
        self.ln_2 = torch.nn.LayerNorm(hidden)
        self.mlp_fc = Linear(hidden, 4 * hidden)
        self.mlp_proj = Linear(4 * hidden, hidden)
        self.register_buffer("mask", torch.tril(torch.ones(ctx, ctx, dtype=torch.bool)),
                             persistent=False)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // self.heads))
        att = att.masked_fill(~self.mask[:t, :t], float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.mlp_fc(self.ln_2(x))))


class GPT(torch.nn.Module):
    def __init__(self, hidden, layers, heads, ctx):
        super().__init__()
        self.wte = torch.nn.Embedding(VOCAB, hidden)
        self.wpe = torch.nn.Embedding(ctx, hidden)
        self.blocks = torch.nn.ModuleList(Block(hidden, heads, ctx) for _ in range(layers))
        self.ln_f = torch.nn.LayerNorm(hidden)
        self.lm_head = Linear(hidden, VOCAB, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as in GPT-2
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight") or name.endswith("mlp_proj.weight"):
                torch.nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * layers))

    @staticmethod
    def _init(m):
        if isinstance(m, torch.nn.Linear):
            torch.nn.init.normal_(m.weight, 0.0, 0.02)
            if m.bias is not None:
                torch.nn.init.zeros_(m.bias)
        elif isinstance(m, torch.nn.Embedding):
            torch.nn.init.normal_(m.weight, 0.0, 0.02)

    def forward(self, idx):
        pos = torch.arange(idx.shape[1])
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def train_step(model, opt, x, y):
    logits = model(x)
    loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), y.reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
    opt.step()
    return loss.item()


# ---------------------------------------------------------------- DeepSpeed's layout

def ds_config(cfg, dtype):
    return {"train_batch_size": cfg["batch"], "train_micro_batch_size_per_gpu": cfg["batch"],
            "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
            "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "betas": [0.9, 0.99]}},
            "bf16": {"enabled": dtype == "bf16"}, "fp16": {"enabled": False},
            "zero_optimization": {"stage": 1}, "steps_per_print": 10 ** 9}


def save_checkpoint(model, opt, step, cfg, dtype, tdir):
    tag = f"global_step{step}"
    d = os.path.join(tdir, tag)
    os.makedirs(d, exist_ok=True)
    config = ds_config(cfg, dtype)
    shapes = {n: p.shape for n, p in model.named_parameters() if p.requires_grad}
    frozen = {n: p.shape for n, p in model.named_parameters() if not p.requires_grad}
    model_state = {
        "module": model.state_dict(),
        "buffer_names": [n for n, _ in model.named_buffers()
                         if n.split(".")[-1] in model.state_dict()],
        "optimizer": None,  # ZeRO: the optimizer state is in the zero_pp_rank file
        "param_shapes": [shapes],
        "frozen_param_shapes": frozen or None,
        "shared_params": {"lm_head.weight": "wte.weight"},
        "frozen_param_fragments": None,
        "lr_scheduler": None,
        "data_sampler": None,
        "random_ltd": None,
        "sparse_tensor_module_names": set(),
        "skipped_steps": 0,
        "global_steps": step,
        "global_samples": step * cfg["batch"],
        "dp_world_size": 1,
        "mp_world_size": 1,
        "ds_config": config,
        "ds_version": DS_VERSION,
    }
    torch.save(model_state, os.path.join(d, MODEL_FILE))
    torch.save({"optimizer_state_dict": opt.state_dict(), "ds_config": config,
                "ds_version": DS_VERSION}, os.path.join(d, OPTIM_FILE))
    with open(os.path.join(tdir, "latest"), "w") as f:
        f.write(tag)
    return tag, {name: os.path.getsize(os.path.join(d, name)) for name in (MODEL_FILE, OPTIM_FILE)}


def load_latest(tdir):
    with open(os.path.join(tdir, "latest")) as f:
        tag = f.read().strip()
    d = os.path.join(tdir, tag)
    ms = torch.load(os.path.join(d, MODEL_FILE))
    os_ = torch.load(os.path.join(d, OPTIM_FILE))
    return tag, ms, os_


# ---------------------------------------------------------------- trajectories

def make(cfg):
    return GPT(cfg["hidden"], cfg["layers"], cfg["heads"], cfg["ctx"])


def run_trajectory(name, cfg, args, data, out):
    tdir = os.path.join(out, name)
    if os.path.exists(tdir):
        raise SystemExit(f"gen_trajectory: {tdir} exists (use a fresh --out)")
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed + {"fp32": 0, "bf16": 0, "finetune": 1}[name])
    model = make(cfg)
    dtype = "bf16" if name == "bf16" else "fp32"
    first_step = 0
    if name == "bf16":
        model = model.to(torch.bfloat16)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.99))
    if name == "finetune":
        src = os.path.join(out, "fp32")
        if not os.path.exists(os.path.join(src, "latest")):
            raise SystemExit(f"gen_trajectory: finetune needs the fp32 trajectory in {src}")
        tag, ms, osd = load_latest(src)
        model.load_state_dict(ms["module"])
        opt.load_state_dict(osd["optimizer_state_dict"])
        first_step = ms["global_steps"]
        frozen = [model.wte, model.wpe] + list(model.blocks[:cfg["layers"] // 2])
        for m in frozen:
            for p in m.parameters():
                p.requires_grad_(False)
        # wte is tied to lm_head: freezing the embedding freezes the head too.
        log(f"finetune: from fp32/{tag}, frozen: embeddings + blocks 0..{cfg['layers'] // 2 - 1}")
    n_params = sum(p.numel() for p in model.parameters())
    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    versions = []
    t = time.monotonic()
    losses = []
    for i in range(1, args.steps + 1):
        x, y = batch(data["data"], gen, cfg["batch"], cfg["ctx"])
        losses.append(train_step(model, opt, x, y))
        if i % args.save_every == 0:
            step = first_step + i
            tag, sizes = save_checkpoint(model, opt, step, cfg, dtype, tdir)
            versions.append(dict(tag=tag, bytes=sum(sizes.values()), files=sizes,
                                 loss=sum(losses) / len(losses)))
            log(f"{name}: {tag} saved, mean loss of the last {len(losses)} steps "
                f"{versions[-1]['loss']:.3f}, {versions[-1]['bytes'] / 1e6:.2f} MB")
            losses = []
    return dict(name=name, params=n_params, trainable=n_train, versions=versions,
                seconds=time.monotonic() - t, corpus_sha256=data["sha256"],
                corpus_bytes=data["bytes"], corpus_files=data["files"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--size", choices=sorted(SIZES), default="ci")
    ap.add_argument("--trajectories", default="fp32,bf16,finetune")
    ap.add_argument("--steps", type=int, help="training steps per trajectory")
    ap.add_argument("--save-every", type=int, help="save a version every K steps")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2, help="torch threads (fixed: determinism)")
    ap.add_argument("--json", help="also write the summary there")
    args = ap.parse_args()
    cfg = dict(SIZES[args.size])
    args.steps = args.steps or cfg["steps"]
    args.save_every = args.save_every or cfg["save_every"]
    names = [n for n in args.trajectories.split(",") if n]
    for n in names:
        if n not in ("fp32", "bf16", "finetune"):
            raise SystemExit(f"gen_trajectory: unknown trajectory {n!r}")
    names.sort(key=["fp32", "bf16", "finetune"].index)  # finetune needs fp32 first
    if args.steps < args.save_every:
        raise SystemExit("gen_trajectory: --steps must be at least --save-every")

    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    os.makedirs(args.out, exist_ok=True)
    corpora = {}
    results = []
    log(f"size {args.size}: {cfg}, {args.steps} steps per trajectory, a version every "
        f"{args.save_every}; torch {torch.__version__}, {args.threads} threads")
    for name in names:
        kind = "finetune" if name == "finetune" else "pretrain"
        if kind not in corpora:
            corpora[kind] = corpus(kind)
        results.append(run_trajectory(name, cfg, args, corpora[kind], args.out))

    print(f"\ngen_trajectory: --size {args.size} --seed {args.seed}: hidden {cfg['hidden']}, "
          f"{cfg['layers']} blocks, {cfg['heads']} heads, context {cfg['ctx']}, batch "
          f"{cfg['batch']}, {args.steps} steps, a version every {args.save_every}, into "
          f"{args.out}")
    for kind, c in corpora.items():
        print(f"corpus {kind}: {c['files']} files, {c['bytes']} bytes, sha256 {c['sha256'][:16]}")
    print("\n| trajectory | params (trainable) | versions | bytes per version | total | "
          "loss first -> last | train+save time |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        per = sorted({v["bytes"] for v in r["versions"]})
        per_s = (f"{per[0]:,}" if len(per) == 1 else f"{per[0]:,} .. {per[-1]:,}")
        print(f"| {r['name']} | {r['params']:,} ({r['trainable']:,}) | {len(r['versions'])} "
              f"({r['versions'][0]['tag']} .. {r['versions'][-1]['tag']}) | {per_s} | "
              f"{sum(v['bytes'] for v in r['versions']) / 1e6:.1f} MB | "
              f"{r['versions'][0]['loss']:.3f} -> {r['versions'][-1]['loss']:.3f} | "
              f"{r['seconds']:.1f} s |")
    print(f"total {time.monotonic() - T0:.1f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(size=args.size, seed=args.seed, config=cfg, steps=args.steps,
                           save_every=args.save_every, trajectories=results), f, indent=1)


if __name__ == "__main__":
    main()
