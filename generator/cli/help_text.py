"""The program name and the examples each command's ``--help`` ends with (argparse epilogs)."""
from __future__ import annotations

from .options import PLAN_OPTION_KEYS

PROG = "python -m generator"

TOP_EPILOG = f"""\
examples:
  {PROG} plan --dtype bf16 --layout tn --arch 80
  {PROG} plan --dtype bf16 --layout tn --arch 90
  {PROG} plan --dtype fp16 --layout nn --arch 90 --m 8192 --n 8192 --k 8192 --verbose
  {PROG} render --dtype bf16 --layout tn --arch 80 --tile 128x128x32 --stages 4 --out build/kernels
  {PROG} emit --dtype bf16 --layout tn --arch 90 --name my_gemms --out emitted/my_gemms
  {PROG} bench --set square --dtypes bf16
  {PROG} plot benchmarks/results/h200_bench_llm_rules.json --out llm.png

Layouts: first letter A (M x K), second B (K x N); 't' = row-major, 'n' = column-major (BLAS).
'tn' is torch's x @ W.t() for an nn.Linear weight W of shape (N, K). See docs/cli.md and docs/api.md.
"""

PLAN_EPILOG = f"""\
examples:
  {PROG} plan --dtype bf16 --layout tn --arch 80
  {PROG} plan --dtype bf16 --layout tn --arch 80 --m 128 --n 4096 --k 4096 --verbose
  {PROG} plan --dtype bf16 --layout tn --arch 90            (sm90 family: TMA, wgmma, clusters)
  {PROG} plan --arch 90 --tile 128x128x64 --schedule pingpong --cluster 1x2 --raster n --m 4096 --n 8192
  {PROG} plan --dtype fp16 --out-dtype fp32 --layout tt --arch 90 --family sm80 --tile 128x256x32 --warps 2x4 --stages 3
  {PROG} plan --arch 90 --activation gelu_tanh --bias col     (fused epilogue: D = gelu_tanh(acc + bias))
  {PROG} plan --arch 80 --alpha scalar --beta 0.5              (D = alpha * acc + 0.5 * C, alpha a runtime scalar)
  {PROG} plan --arch 90 --epilogue my_epilogues.py:fused       (a function of the accumulator; see generator.epilogue)

At --arch 90 the sm90 family is planned (knobs --schedule, --cluster, --raster); --family sm80 plans
the cp.async/mma.sync family there instead (knob --warps).
"""

RENDER_EPILOG = f"""\
examples:
  {PROG} render --dtype bf16 --layout tn --arch 80 --out build/kernels
  {PROG} render --dtype fp16 --layout nt --arch 90 --tile 128x128x64 --stages 4 --out /tmp/k
  {PROG} render --dtype bf16 --layout tn --arch 90 --schedule pingpong --cluster 1x1 --out /tmp/k
  {PROG} render --arch 90 --activation silu --bias col --out /tmp/k

The .cu files include plain CUDA headers from the templates folder: compile them with
nvcc -I <that folder> (render prints it on stderr).
"""

EMIT_EPILOG = f"""\
examples:
  {PROG} emit --dtype bf16 --layout tn --arch 90 --name my_gemms --out emitted/my_gemms
  {PROG} emit --plan "dtype=bf16,layout=tn,arch=90" --plan "dtype=fp16,layout=nn,arch=80" \\
      --name my_gemms --out emitted/my_gemms
  {PROG} emit --arch 80 --plan dtype=bf16 --plan "dtype=fp16,out_dtype=fp32,op_name=mm_f32" --out emitted/mm80
  {PROG} emit --arch 90 --plan "schedule=pingpong,cluster=1x1" --plan "family=sm80,layout=nt" --out emitted/mm90
  {PROG} emit --plans plans.json --name my_gemms --out emitted/my_gemms
  {PROG} emit --arch 90 --plan "activation=gelu_tanh,bias=col" --plan "alpha=scalar,beta=scalar" --out emitted/ep90

Writes a pip-installable package (torch extension) with one op per plan into --out; then
  pip install --no-build-isolation emitted/my_gemms
  python -c "import my_gemms; help(my_gemms)"
A --plan is comma-separated key=value pairs: {', '.join(PLAN_OPTION_KEYS)}
(tile=128x128x32, warps=2x4, cluster=2x1, activation=relu, bias=col, alpha=scalar). The knobs given as
options (--arch, --dtype, ...) are the defaults of every --plan and --plans entry. --plans takes a JSON list
of objects of Gemm keyword arguments (the plans.json that emit writes into a package is one). Op names
default to gemm_<dtype>_<layout> (+ _o<out dtype>, + _dcol). --name defaults to the --out folder's name.
The ops are differentiable (the package also holds the backward kernels); --no-autograd leaves that out.
Needs neither torch nor a GPU. A plan with a fused epilogue (--activation, --bias, --alpha, --beta, or
--epilogue; activation=..., bias=... in a --plan) makes an op that takes the epilogue's operands after A and
B (gemm_<dtype>_<layout>_<epilogue tag>); it is differentiable too (in A, B and its tensor operands).
"""

PLOT_EPILOG = f"""\
examples:
  {PROG} plot benchmarks/results/h200_bench_llm_rules.json --out llm.png
  {PROG} plot benchmarks/results/h200_bench_llm_rules.json --kind roofline --out roofline.png
  {PROG} plot benchmarks/results/h100_sm90_bench_llm.json --dtype bf16 --kind bars --title "H100, bf16"
  {PROG} plot corpus.json --kind bands --dtype bf16 --out corpus.png

Reads the JSON of benchmarks/bench.py --json or benchmarks/inductor_compare.py --json and draws per shape the
TFLOP/s of ours, cuBLAS, Triton and Inductor (those the file has) with ours / each beneath, and a roofline
(TFLOP/s against FLOP per byte of A, B and D, under the GPU's HBM bandwidth and tensor-core peak).
A benchmarks/bench_corpus.py file ("benchmark": "corpus") is drawn as bands (its only kind): ours / cuBLAS
against tokens, a panel per pass (fwd, dX, dW), a line per layer kind, the geomean and min of every row.
Needs matplotlib: pip install -e ".[plot]". Neither torch nor a GPU.
"""

TUNE_EPILOG = f"""\
examples:
  {PROG} tune --dtype bf16 --layout tn --shapes 4096x4096x4096,512x4096x14336
  {PROG} tune --dtype fp16 --layout tn --family sm80 --shapes 8192x8192x8192 --budget 60 --max-candidates 16
  {PROG} tune --export tuning.json            (every table of the tuning cache, for another machine)
  {PROG} tune --import tuning.json            (then plans of those shapes on a matching GPU take the winners)
  {PROG} emit --dtype bf16 --layout tn --arch 90 --tuning tuning.json --out emitted/my_gemms

Per shape: the legal configs around the planner's pick (its neighbours in tile, stages, cluster, schedule, raster
and split-K/stream-K, then the next best by estimate) are built in one parallel run, checked against a reference
and timed side by side (L2 flushed, interleaved rounds, medians); the winner is kept in the tuning cache
(<cache>/tuning/, docs/tuning.md), so a plan of that request and shape on this GPU uses it from then on
(GEMMGEN_TUNED=0 turns that off), and a second tune of the shape answers from the cache. Needs torch and a GPU,
except --export and --import.
"""

BENCH_EPILOG = f"""\
examples:
  {PROG} bench --set square --dtypes bf16
  {PROG} bench --help        (the benchmark's own options)

Runs benchmarks/bench.py of a source checkout with the remaining arguments; needs torch and a GPU.
"""
