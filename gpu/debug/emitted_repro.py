"""Repro of the emitted-package crash on a 3-D A (issue 4): build the GPU test's package, then call its
sm90 op with bad inputs in fresh processes, with and without kernel launches and JIT ops before."""
import os, subprocess, sys, time
from pathlib import Path

OUT = Path(os.environ.get("OUT", "/tmp/out"))
ROOT = Path("/tmp/emitted_repro")
SITE = ROOT / "site"

def build():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from generator import Gemm, emit
    plans = {"gemm_bf16_tn": Gemm(dtype="bf16", layout="tn"), "gemm_fp16_nn": Gemm(dtype="fp16", layout="nn")}
    pkg = emit(list(plans.values()), name="gg_repro", out=ROOT / "gg_repro", op_names=list(plans))
    t = time.time()
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "--target",
                        str(SITE), str(pkg)], capture_output=True, text=True)
    print("install rc", r.returncode, f"{time.time() - t:.1f}s", r.stderr[-3000:], flush=True)

CASE = r'''
import sys, torch
sys.path.insert(0, "{site}")
import gg_repro
mode = "{mode}"
a = torch.randn(256, 64, device="cuda").bfloat16()
b = torch.randn(128, 64, device="cuda").bfloat16().t()
if "jit" in mode:
    sys.path.insert(0, "{repo}")
    from generator import Gemm
    jit = Gemm(dtype="bf16", layout="tn").compile()
    jit(a, b); torch.cuda.synchronize()
if "launch" in mode:
    d = gg_repro.gemm_bf16_tn(a, b); torch.cuda.synchronize(); print("launch ok", d.shape, flush=True)
if "fp16" in mode:
    x = torch.randn(64, 256, device="cuda").half().t(); y = torch.randn(128, 64, device="cuda").half().t()
    gg_repro.gemm_fp16_nn(x, y); torch.cuda.synchronize(); print("fp16 ok", flush=True)
for label, aa in (("cpu", a.cpu()), ("3d-cuda", a[None]), ("3d-cpu", a.cpu()[None])):
    try:
        gg_repro.gemm_bf16_tn(aa, b)
        print(label, "NO ERROR", flush=True)
    except Exception as e:
        print(label, type(e).__name__, e, flush=True)
print("DONE", mode, flush=True)
'''

def run(mode):
    code = CASE.format(site=SITE, mode=mode, repo=Path(__file__).resolve().parents[2])
    env = dict(os.environ, LD_PRELOAD="/tmp/segv_backtrace.so")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    print(f"=== mode {mode}: rc {r.returncode}\n{r.stdout}\n{r.stderr[-6000:]}", flush=True)

if __name__ == "__main__":
    build()
    for mode in ("plain", "launch", "fp16", "jit", "jit+launch"):
        run(mode)
