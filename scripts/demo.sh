#!/usr/bin/env bash
# The main job: set up, mount a store in a temp dir, save a real torch checkpoint into it in
# DeepSpeed's layout for two training steps (two versions), list them, load one back and compare
# bitwise, unmount, and show what the store keeps compared with the logical bytes.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
ckptfs="$PWD/build/ckptfs"
work=$(mktemp -d)
mnt="$work/mnt"
mkdir -p "$mnt"
cleanup() {
  if mountpoint -q "$mnt"; then "$ckptfs" umount "$mnt" || fusermount3 -u -z "$mnt"; fi
  rm -rf "$work"
}
trap cleanup EXIT

"$ckptfs" init "$work/store"
"$ckptfs" mount "$work/store" "$mnt"
echo "mounted $work/store at $mnt"
/usr/bin/python3 - "$mnt" <<'PY'
import os, sys, torch
mnt = sys.argv[1]
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(8)])
opt = torch.optim.Adam(model.parameters(), lr=1e-4)
for step in (1, 2):
    x = torch.randn(16, 1024)
    loss = model(x).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    d = os.path.join(mnt, f"global_step{step}")
    os.makedirs(d, exist_ok=True)
    torch.save({"module": model.state_dict()}, os.path.join(d, "mp_rank_00_model_states.pt"))
    torch.save({"optimizer": opt.state_dict()},
               os.path.join(d, "zero_pp_rank_0_mp_rank_00_optim_states.pt"))
    with open(os.path.join(mnt, "latest"), "w") as f:
        f.write(f"global_step{step}")
back = torch.load(os.path.join(mnt, "global_step2", "mp_rank_00_model_states.pt"))
same = all(torch.equal(v, back["module"][k]) for k, v in model.state_dict().items())
print("torch.load from the mount equals the model:", same)
sys.exit(0 if same else 1)
PY
ls -l "$mnt" "$mnt"/global_step*
# The hidden views (docs/views.md): one .npy per tensor, a bf16 copy of the version, lazy loads.
echo "views of global_step2/mp_rank_00_model_states.pt:"
ls "$mnt/global_step2/mp_rank_00_model_states.pt@tensors" | head -4
ls -l "$mnt/global_step2@bf16/mp_rank_00_model_states.pt"
PYTHONPATH=python /usr/bin/python3 - "$mnt" <<'PY'
import os, sys, torch, ckptfs
path = os.path.join(sys.argv[1], "global_step2", "mp_rank_00_model_states.pt")
whole = torch.load(path)["module"]
sd = ckptfs.lazy_load(path, filter=lambda n: n.startswith("module.3."), dtype="bf16")
same = all(torch.equal(sd["module." + k], v.to(torch.bfloat16))
           for k, v in whole.items() if k.startswith("3."))
print("lazy_load of layer 3 as bf16 (%d tensors) equals t.to(torch.bfloat16):" % len(sd), same)
sys.exit(0 if same and len(sd) == 2 else 1)
PY
"$ckptfs" umount "$mnt"
echo "unmounted; the store now holds:"
"$ckptfs" stats "$work/store"
"$ckptfs" verify "$work/store"
