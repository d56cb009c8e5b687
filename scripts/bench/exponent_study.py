#!/usr/bin/python3
"""Entropy bounds behind the codec's choices (docs/engine.md, "Compression"): what byte-plane
layouts and exponent contexts could store, computed from real checkpoints (order-0 / order-1
entropy, not a codec; the codec stores ~0.5% of raw more than these bounds).

  exponent_study.py first FILE.pt        first versions, per 1 MiB piece: planes as ckptfs
                                         stores them (rotated), and the exponent plane with
                                         an order-1 context of K buckets, table costs included
  exponent_study.py delta OLD.pt NEW.pt  changed tensors: sub (what ckptfs stores), sub of the
                                         rotated elements, the rotated difference, rotated xor,
                                         and sub with an order-1 context on its top plane
  exponent_study.py model FILE.pt        first versions: the 8-bit exponent's entropy (bits per
                                         element) order 0, given the element to the left, the
                                         one above (the previous row), both, its row's and its
                                         column's mean; and per 1 MiB piece the residual against
                                         column + row terms as ckptfs stores it (segment 0x42),
                                         terms counted, with the true row length and phase
  exponent_study.py coders OLD.pt NEW.pt changed tensors, the top plane of the sub delta per
                                         1 MiB piece (where below 4 bits): its entropy (what
                                         rANS reaches), Huffman's bits, and Huffman over pairs
                                         of bytes (the 15 most frequent values and an escape)
  exponent_study.py adam DIR OLD NEW     DeepSpeed checkpoints DIR/global_step{OLD,NEW} of an
                                         Adam trajectory: the weights' sub delta against the old
                                         weights and against the old weights minus Adam's update
                                         rebuilt from the old and new moments (and the reverse
                                         deltas with the split planes of segment 0x43, with and
                                         without the update); exp_avg_sq against the old one
                                         scaled and against b2^k old + (1 - b2^k) g^2
  exponent_study.py split OLD.pt NEW.pt  changed tensors, the old version as a sub delta against
                                         the new (as the re-encoder stores it; exp_avg_sq of
                                         fp32 against the scaled prediction), per 1 MiB piece:
                                         the planes order 0, and the top one or two planes split
                                         into K buckets by the base's magnitude byte (quantiles
                                         of the piece), 300 bytes of table per bucket counted
                                         (what segment 0x43 stores)
  exponent_study.py sibling OPTIM.pt     first versions of Adam's moments (a DeepSpeed optimizer
                                         file): each moment's exponent given the other's (same
                                         element), against order 0 and the row/column model;
                                         and exp_avg_sq as a sub delta against exp_avg^2 scaled

Stored / raw over the fp32 and bf16 tensors of more than 1024 elements. Needs torch
(/usr/bin/python3 on this machine).
"""
import heapq
import sys

import numpy as np
import torch


def entropy(counts):
    c = counts[counts > 0].astype(np.float64)
    p = c / c.sum()
    return -(p * np.log2(p)).sum()


def h(a):
    return entropy(np.bincount(a.ravel(), minlength=256))


def h_given(x, y):  # H(y | x) for bytes
    j = x.astype(np.int64) * 256 + y
    return entropy(np.bincount(j.ravel(), minlength=65536)) - h(x)


def table_bytes(counts):  # a Huffman table as ckptfs writes it, and 4 stream lengths
    nz = np.nonzero(counts)[0]
    return 1 + (nz.max() + 2) // 2 + 12 if nz.size else 0


def tensors(path):
    out = {}

    def walk(o, key):
        if torch.is_tensor(o):
            if o.dtype in (torch.bfloat16, torch.float32) and o.numel() > 1024:
                out[key] = o
        elif isinstance(o, dict):
            for k, v in o.items():
                walk(v, key + "/" + str(k))
        elif isinstance(o, (list, tuple)):
            for i, v in enumerate(o):
                walk(v, key + "/" + str(i))

    walk(torch.load(path, weights_only=False, map_location="cpu"), "")
    return out


def bits_of(t):
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().view(np.uint16).ravel().astype(np.uint64), 16
    return t.contiguous().view(torch.int32).numpy().view(np.uint32).ravel().astype(np.uint64), 32


def rot(x, w):
    return ((x << np.uint64(1)) | (x >> np.uint64(w - 1))) & np.uint64((1 << w) - 1)


def planes(x, w):
    return [((x >> np.uint64(s)) & np.uint64(0xFF)).astype(np.int64) for s in range(0, w, 8)]


def stored_bits(p):  # a plane as the codec stores it: raw above 7.5 bits
    e = h(p)
    return p.size * (8 if e > 7.5 else e)


def first(path):
    kinds = (2, 4, 8, 16)
    tot = {"order0": 0.0, **{f"K={k}": 0.0 for k in kinds}, "bits": 0}
    for t in tensors(path).values():
        u, w = bits_of(t)
        per = (1 << 20) // (w // 8)
        for a in range(0, u.size, per):
            x = u[a:a + per]
            ps = planes(rot(x, w), w)
            e = ps[-1]
            rest = sum(stored_bits(p) for p in ps[:-1])
            c0 = np.bincount(e, minlength=256)
            tot["order0"] += rest + e.size * entropy(c0) + 8 * table_bytes(c0)
            prev = np.concatenate([[0], e[:-1]])
            order = np.argsort(-np.bincount(prev, minlength=256))
            for k in kinds:
                bucket_of = np.full(256, k - 1)
                bucket_of[order[:k - 1]] = np.arange(k - 1)
                b = bucket_of[prev]
                cost = rest + 8 * 128  # the bucket map, 4 bits per exponent value
                for j in range(k):
                    c = np.bincount(e[b == j], minlength=256)
                    cost += c.sum() * entropy(c) + 8 * table_bytes(c)
                tot[f"K={k}"] += cost
            tot["bits"] += x.size * w
    print({k: round(v / tot["bits"], 4) for k, v in tot.items() if k != "bits"})


def changed(old_path, new_path, other="other"):
    """(kind, old tensor, new tensor) for each tensor of NEW that OLD has, same shape, changed;
    kind: exp_avg_sq, exp_avg or `other`."""
    old, new = tensors(old_path), tensors(new_path)
    for key, tb in new.items():
        ta = old.get(key)
        if ta is None or ta.shape != tb.shape or torch.equal(ta, tb):
            continue
        kind = "exp_avg_sq" if "exp_avg_sq" in key else "exp_avg" if "exp_avg" in key else other
        yield kind, ta, tb


def delta(old_path, new_path):
    tot = {}
    for kind, ta, tb in changed(old_path, new_path):
        v, w = bits_of(tb)
        b, _ = bits_of(ta)
        m = np.uint64((1 << w) - 1)

        def zigzag(d):
            s = (d >> np.uint64(w - 1)) & np.uint64(1)
            return ((d << np.uint64(1)) & m) ^ (m * s)

        variants = {"sub": zigzag((v - b) & m), "sub of rotated": zigzag((rot(v, w) - rot(b, w)) & m),
                    "rotated sub": rot((v - b) & m, w), "rotated xor": rot(v ^ b, w)}
        d = tot.setdefault(kind, {"bits": 0})
        d["bits"] += v.size * w
        for name, x in variants.items():
            ps = planes(x, w)
            d[name] = d.get(name, 0.0) + sum(v.size * min(h(p), 8) for p in ps)
            if name == "sub":
                top = ps[-1]
                ctx = v.size * h_given(top[:-1], top[1:]) + sum(v.size * min(h(p), 8) for p in ps[:-1])
                d["sub, order-1 top plane"] = d.get("sub, order-1 top plane", 0.0) + ctx
    for kind, d in tot.items():
        print(kind, {k: round(x / d["bits"], 4) for k, x in d.items() if k != "bits"})


def h_cond(ctx, x):  # H(x | ctx) for integer arrays, in bits
    j = ctx.astype(np.int64) * (int(x.max()) + 1) + x
    return entropy(np.unique(j, return_counts=True)[1]) - entropy(np.unique(ctx, return_counts=True)[1])


def row_column_bits(e, cols, phase):  # the residual against column + row terms, and the terms
    idx = np.arange(e.size) + phase
    col, row = idx % cols, idx // cols
    c = np.rint(np.bincount(col, e, cols) / np.maximum(np.bincount(col, None, cols), 1)).astype(np.int64)
    r = np.rint(np.bincount(row, e - c[col]) / np.maximum(np.bincount(row), 1)).astype(np.int64)
    return e.size * h((e - c[col] - r[row]) & 255) + 8 * (cols + r.size + 13)


def model(path):
    tot = {}
    for key, t in tensors(path).items():
        kind = "exp_avg_sq" if "exp_avg_sq" in key else "exp_avg" if "exp_avg" in key else "other"
        u, w = bits_of(t)
        e = ((u >> np.uint64(w - 9)) & np.uint64(0xFF)).astype(np.int64)
        d = tot.setdefault(kind, {"n": 0})
        n = e.size

        def add(k, bits):
            d[k] = d.get(k, 0.0) + bits
        add("order 0", n * h(e))
        add("| left", n * h_cond(np.concatenate([[0], e[:-1]]), e))
        if t.dim() == 2:
            rows, cols = t.shape
            e2 = e.reshape(rows, cols)
            above = np.vstack([np.zeros((1, cols), np.int64), e2[:-1]]).ravel()
            left = np.hstack([np.zeros((rows, 1), np.int64), e2[:, :-1]]).ravel()
            rm = np.broadcast_to(np.rint(e2.mean(1))[:, None], e2.shape).ravel().astype(np.int64)
            cm = np.broadcast_to(np.rint(e2.mean(0)), e2.shape).ravel().astype(np.int64)
            add("| above", n * h_cond(above, e))
            add("| left, above", n * h_cond(left * 256 + above, e))
            add("| row mean", n * h_cond(rm, e))
            add("| column mean", n * h_cond(cm, e))
            add("| row, column mean", n * h_cond(rm * 256 + cm, e))
        else:
            cols = 0
            for k in ("| above", "| left, above", "| row mean", "| column mean", "| row, column mean"):
                add(k, n * h(e))
        per = (1 << 20) // (w // 8)
        for a in range(0, n, per):
            x = e[a:a + per]
            o0 = x.size * h(x) + 8 * table_bytes(np.bincount(x, minlength=256))
            add("pieces: order 0", o0)
            add("pieces: row/column model", min(o0, row_column_bits(x, cols, a % cols)) if cols else o0)
        d["n"] += n
    for kind, d in tot.items():
        n = d.pop("n")
        print(kind, {k: round(v / n, 3) for k, v in d.items()})


def huffman_bits(counts):  # the bits of an optimal (unlimited) Huffman code for these counts
    heap = [(int(c), [s]) for s, c in enumerate(counts) if c > 0]
    if len(heap) <= 1:
        return int(sum(counts))
    length = {s[0]: 0 for _, s in heap}
    heapq.heapify(heap)
    while len(heap) > 1:
        a, sa = heapq.heappop(heap)
        b, sb = heapq.heappop(heap)
        for x in sa + sb:
            length[x] += 1
        heapq.heappush(heap, (a + b, sa + sb))
    return sum(int(counts[x]) * n for x, n in length.items())


def zigzag_sub(v, b, w):
    m = np.uint64((1 << w) - 1)
    d = (v - b) & m
    s = (d >> np.uint64(w - 1)) & np.uint64(1)
    return ((d << np.uint64(1)) & m) ^ (m * s)


def coders(old_path, new_path):
    tot = {"entropy": 0.0, "huffman": 0.0, "pair huffman": 0.0, "bytes": 0}
    for _, ta, tb in changed(old_path, new_path):
        v, w = bits_of(tb)
        z = zigzag_sub(v, bits_of(ta)[0], w)
        per = (1 << 20) // (w // 8)
        for a in range(0, z.size, per):
            p = ((z[a:a + per] >> np.uint64(w - 8)) & np.uint64(255)).astype(np.int64)
            counts = np.bincount(p, minlength=256)
            if h(p) >= 4:
                continue
            rank = np.full(256, 15)
            rank[np.argsort(-counts)[:15]] = np.arange(15)
            r = rank[p]
            escapes = int((r == 15).sum())
            if r.size % 2:
                r = np.append(r, 0)
            pairs = np.bincount(r[0::2] * 16 + r[1::2], minlength=256)
            tot["entropy"] += p.size * h(p)
            tot["huffman"] += huffman_bits(counts)
            tot["pair huffman"] += huffman_bits(pairs) + 8 * escapes
            tot["bytes"] += p.size
    n = tot.pop("bytes")
    print("top planes below 4 bits, bits per byte:", {k: round(x / max(n, 1), 3) for k, x in tot.items()})


def adam(d, old_step, new_step):
    def load(step):
        ms = torch.load(f"{d}/global_step{step}/mp_rank_00_model_states.pt", weights_only=False)
        opt = torch.load(f"{d}/global_step{step}/zero_pp_rank_0_mp_rank_00_optim_states.pt",
                         weights_only=False)["optimizer_state_dict"]
        return ms, opt
    (ms0, o0), (ms1, o1) = load(old_step), load(new_step)
    group = o1["param_groups"][0]
    lr, (b1, b2), eps = group["lr"], group["betas"], group["eps"]

    def cost(new, pred):  # sub of the fp32 bit patterns, order-0 entropy per plane
        z = zigzag_sub(bits_of(new.float())[0], bits_of(pred.float())[0], 32)
        return sum(z.size * min(h(((z >> np.uint64(8 * j)) & np.uint64(255)).astype(np.int64)), 8)
                   for j in range(4))
    tot = {"weights: sub": 0.0, "weights: Adam's update": 0.0, "exp_avg_sq: scaled": 0.0,
           "exp_avg_sq: from exp_avg": 0.0, "bits": 0}
    for i, name in enumerate(ms0["param_shapes"][0].keys()):
        w0, w1 = ms0["module"][name].double(), ms1["module"][name].double()
        s0, s1 = o0["state"][i], o1["state"][i]
        t0 = int(s0["step"])
        k = int(s1["step"]) - t0
        m0, v0, m1, v1 = (x.double() for x in (s0["exp_avg"], s0["exp_avg_sq"], s1["exp_avg"],
                                                s1["exp_avg_sq"]))
        # The k steps between, with a gradient constant over them: what each moment's change says.
        gm = (m1 - b1 ** k * m0) / (1 - b1 ** k)
        gv = (v1 - b2 ** k * v0) / (1 - b2 ** k)
        update = torch.zeros_like(w0)
        for j in range(1, k + 1):
            mj = b1 ** j * m0 + (1 - b1 ** j) * gm
            vj = (b2 ** j * v0 + (1 - b2 ** j) * gv).clamp(min=0)
            update += lr * (mj / (1 - b1 ** (t0 + j))) / ((vj / (1 - b2 ** (t0 + j))).sqrt() + eps)
        scale = float(np.median((v1 / v0.clamp(min=1e-30)).numpy()))
        tot["weights: sub"] += cost(w1, w0)
        tot["weights: Adam's update"] += cost(w1, w0 - update)
        tot["exp_avg_sq: scaled"] += cost(v1, v0 * scale)
        tot["exp_avg_sq: from exp_avg"] += cost(v1, b2 ** k * v0 + (1 - b2 ** k) * gm ** 2)
        # As the re-encoder stores them (the old version against the new), planes split by the
        # base's magnitude (segment 0x43): with and without Adam's update in the prediction.
        old_bits = bits_of(w0.float())[0]
        for label, pred in (("sub", w1), ("Adam's update", w1 + update)):
            p = bits_of(pred.float())[0]
            tot[f"weights, reverse, split: {label}"] = tot.get(
                f"weights, reverse, split: {label}", 0.0) + split_bits(
                    zigzag_sub(old_bits, p, 32),
                    ((p >> np.uint64(23)) & np.uint64(255)).astype(np.int64), 32, 4, 2)
        tot["bits"] += w0.numel() * 32
    n = tot.pop("bits")
    print(f"lr {lr} betas {b1} {b2}; stored / raw:", {k: round(x / n, 4) for k, x in tot.items()})


def split_bits(z, magnitude, w, k, top, table_bytes_per_bucket=300):
    """Bits of the zigzag delta z (width w bits) per 1 MiB piece, order 0 per plane, with the top
    `top` planes split into k buckets at quantiles of the piece's base magnitude bytes (where that
    is smaller), table_bytes_per_bucket counted per bucket: what segment 0x43 stores."""
    bits, per = 0.0, (1 << 20) // (w // 8)
    for a in range(0, z.size, per):
        x, e, n = z[a:a + per], magnitude[a:a + per], min(per, z.size - a)
        ps = [((x >> np.uint64(8 * j)) & np.uint64(255)).astype(np.int64) for j in range(w // 8)]
        c = np.searchsorted(np.unique(np.quantile(e, np.linspace(0, 1, k + 1)[1:-1])), e,
                            side="right")
        bits += 8 * k if top else 0
        for j, p in enumerate(ps):
            whole = n * min(h(p), 8)
            if j < len(ps) - top:
                bits += whole
                continue
            parts = sum(min(s.size * h(s) + 8 * table_bytes_per_bucket, 8 * s.size)
                        for s in (p[c == q] for q in range(k)) if s.size)
            bits += min(parts, whole)
    return bits


def split(old_path, new_path, table_bytes_per_bucket=300):
    tot = {}
    for kind, ta, tb in changed(old_path, new_path, other="weights"):
        v, w = bits_of(ta)  # the old version, coded against the new one
        b, _ = bits_of(tb)
        if kind == "exp_avg_sq" and w == 32:
            vf, bf = ta.double().numpy().ravel(), tb.double().numpy().ravel()
            ok = bf > 1e-30
            b = bits_of((tb.double() * float(np.median(vf[ok] / bf[ok]))).float())[0]
        z = zigzag_sub(v, b, w)
        magnitude = ((b >> np.uint64(w - 9)) & np.uint64(255)).astype(np.int64)
        d = tot.setdefault(kind, {"bits": 0})
        d["bits"] += z.size * w
        d["order 0"] = d.get("order 0", 0) + split_bits(z, magnitude, w, 1, 0)
        for k in (4, 8):
            for top in (1, 2):
                name = f"K={k}, top {top}"
                d[name] = d.get(name, 0) + split_bits(z, magnitude, w, k, top,
                                                      table_bytes_per_bucket)
    for kind, d in tot.items():
        print(kind, {k: round(x / d["bits"], 4) for k, x in d.items() if k != "bits"})


def sibling(path):
    state = torch.load(path, weights_only=False, map_location="cpu")["optimizer_state_dict"]["state"]
    tot = {}

    def add(k, bits):
        tot[k] = tot.get(k, 0.0) + bits
    for s in state.values():
        m, v = s["exp_avg"], s["exp_avg_sq"]
        if m.numel() <= 1024:
            continue
        (um, w), (uv, _) = bits_of(m), bits_of(v)
        em = ((um >> np.uint64(w - 9)) & np.uint64(0xFF)).astype(np.int64)
        ev = ((uv >> np.uint64(w - 9)) & np.uint64(0xFF)).astype(np.int64)
        n = em.size
        cols = m.shape[-1] if m.dim() == 2 else 0
        add("exp_avg: order 0", n * h(em))
        add("exp_avg: | exp_avg_sq's exponent", n * h_cond(ev, em))
        add("exp_avg_sq: order 0", n * h(ev))
        add("exp_avg_sq: | exp_avg's exponent", n * h_cond(em, ev))
        per = (1 << 20) // (w // 8)
        for a in range(0, n, per):
            for name, x in (("exp_avg", em[a:a + per]), ("exp_avg_sq", ev[a:a + per])):
                o0 = x.size * h(x) + 8 * table_bytes(np.bincount(x, minlength=256))
                add(name + ": row/column model", min(o0, row_column_bits(x, cols, a % cols))
                    if cols else o0)
        # exp_avg_sq against c * exp_avg^2 (a constant gradient gives c = (1-b2^t) / (1-b1^t)^2),
        # c fitted as the median ratio; sub of the bit patterns, order 0 per plane (as `adam`).
        md, vd = m.double(), v.double()
        c = float(np.median((vd / (md * md).clamp(min=1e-300)).numpy()))
        z = zigzag_sub(bits_of(v.float())[0], bits_of((c * md * md).float())[0], 32)
        add("exp_avg_sq: sub against c exp_avg^2 (fp32 bits)",
            sum(z.size * min(h(((z >> np.uint64(8 * j)) & np.uint64(255)).astype(np.int64)), 8)
                for j in range(4)))
        add("elements", n)
    n = tot.pop("elements")
    print("bits per element:", {k: round(x / n, 3) for k, x in tot.items()})


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "first":
        first(sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] == "model":
        model(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "delta":
        delta(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 4 and sys.argv[1] == "coders":
        coders(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 4 and sys.argv[1] == "split":
        split(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 3 and sys.argv[1] == "sibling":
        sibling(sys.argv[2])
    elif len(sys.argv) == 5 and sys.argv[1] == "adam":
        adam(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        sys.exit(__doc__)
