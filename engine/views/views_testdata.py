#!/usr/bin/python3
"""Reference data for engine/views/*_test.cc, from real torch (Debian's /usr/bin/python3).

  views_testdata.py convert             one line per value: "f32 bits, bf16 bits, fp16 bits" as
                                        torch computes t.to(torch.bfloat16) and t.half(), hex;
                                        then lines "d f64 bits, f32, bf16, fp16" for doubles
  views_testdata.py model OUT           torch.save of a checkpoint with tied weights, offset and
                                        strided views, several dtypes and optimizer state to OUT;
                                        prints "name dtype shape hex" per tensor (C order bytes)
  views_testdata.py check ORIG VIEW T   torch.load both; every floating tensor of VIEW must equal
                                        ORIG's converted to T (bf16|fp16|fp32) bitwise, all else
                                        equal; exits 0 and prints "ok N" when it does
"""
import struct
import sys

import torch


def special_floats():
    vals = [0.0, -0.0, 1.0, -1.0, 0.1, 1 / 3, 65504.0, 65519.99, 65520.0, 1e6, -1e30,
            float("inf"), float("-inf"), float("nan"), 6e-8, 5.9604645e-08, 2.98e-8, 1e-40,
            1.17549435e-38, 3.4028235e38]
    bits = [0x3F808000, 0x3F818000, 0x3F80C000, 0x3F80FFFF, 0x7F7FFFFF, 0x00000001,
            0x7FA00000, 0xFFC00001, 0x387FE000, 0x33000000, 0x33000001, 0x477FF000]
    vals += [struct.unpack("<f", struct.pack("<I", b))[0] for b in bits]
    return vals


def bits16(t):
    return t.view(torch.int16).item() & 0xFFFF


def bits32(t):
    return t.view(torch.int32).item() & 0xFFFFFFFF


def convert():
    g = torch.Generator().manual_seed(5)
    xs = torch.tensor(special_floats(), dtype=torch.float32)
    xs = torch.cat([xs, torch.randn(2000, generator=g) * 10 ** torch.randint(-9, 9, (2000,),
                                                                            generator=g)])
    xs = torch.cat([xs, torch.randint(-2**31, 2**31 - 1, (2000,), generator=g,
                                      dtype=torch.int64).to(torch.int32).view(torch.float32)])
    bf, hf = xs.to(torch.bfloat16), xs.half()
    for i in range(xs.numel()):
        print("%08x %04x %04x" % (bits32(xs[i:i + 1]), bits16(bf[i:i + 1]), bits16(hf[i:i + 1])))
    ds = torch.randn(500, generator=g, dtype=torch.float64) * 1e3
    ds = torch.cat([ds, torch.tensor([1 + 2 ** -24, 1 + 2 ** -24 + 2 ** -40, 1e300, -1e-300],
                                     dtype=torch.float64)])
    f, b, h = ds.float(), ds.to(torch.bfloat16), ds.half()
    for i in range(ds.numel()):
        print("d %016x %08x %04x %04x" % (ds[i:i + 1].view(torch.int64).item() & (2**64 - 1),
                                          bits32(f[i:i + 1]), bits16(b[i:i + 1]),
                                          bits16(h[i:i + 1])))


def sample():
    torch.manual_seed(7)
    emb = torch.randn(100, 8)
    storage = torch.randn(1024)
    model = {
        "embed.weight": emb,
        "head.weight": emb,
        "slice": storage[100:356],
        "rows": storage.view(32, 32)[3:9],
        "cols": storage.view(32, 32)[:, 5:9],
        "transposed": torch.randn(13, 7).t(),
        "expanded": torch.randn(5, 1).expand(5, 7),
        "half": torch.randn(31).half(),
        "bf16": torch.randn(3, 5).to(torch.bfloat16),
        "f64": torch.randn(9, dtype=torch.float64),
        "ids": torch.arange(50, dtype=torch.int64),
        "mask": torch.rand(17) > 0.5,
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 4),
    }
    lin = torch.nn.Linear(6, 4)
    opt = torch.optim.Adam(lin.parameters())
    lin(torch.randn(2, 6)).sum().backward()
    opt.step()
    return {"module": model, "optimizer": opt.state_dict(), "step": 1}


def flatten(obj, prefix=""):
    out = {}
    if isinstance(obj, torch.Tensor):
        out[prefix] = obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            out.update(flatten(v, "%s.%s" % (prefix, k) if prefix else str(k)))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out.update(flatten(v, "%s.%d" % (prefix, i) if prefix else str(i)))
    return out


def raw(t):
    t = t.contiguous()
    if t.dtype in (torch.bfloat16, torch.float16):
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def model(out):
    torch.save(sample(), out)
    for name, t in flatten(torch.load(out)).items():
        print(name, str(t.dtype).replace("torch.", ""), ",".join(map(str, t.shape)) or "-",
              raw(t).hex() or "-")


def same_bits(a, b):
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_floating_point():
        ty = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        return torch.equal(a.contiguous().view(ty), b.contiguous().view(ty))
    return torch.equal(a, b)


def check(orig, view, target):
    to = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[target]
    a, b = flatten(torch.load(orig)), flatten(torch.load(view))
    if a.keys() != b.keys():
        sys.exit("names differ: %s vs %s" % (sorted(a), sorted(b)))
    for name, t in a.items():
        want = t.to(to) if t.is_floating_point() else t
        if not same_bits(want, b[name]):
            sys.exit("%s differs: %s vs %s" % (name, want, b[name]))
    # Views into one storage stay views into one storage.
    if "module.embed.weight" in b:
        if b["module.embed.weight"].data_ptr() != b["module.head.weight"].data_ptr():
            sys.exit("tied weights were untied")
    print("ok", len(a))


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "convert":
        convert()
    elif cmd == "model":
        model(sys.argv[2])
    elif cmd == "check":
        check(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        sys.exit(__doc__)
