#!/usr/bin/env bash
# One call on the GPU machine: install, build timing, GPU tests, benchmark. Logs and JSON go to $OUT.
#   STEPS="timing tests bench" gpu/run_all.sh          (default: all three)
#   STEPS=sweep SWEEP_ARGS="--dtype fp16" gpu/run_all.sh   (explicit configs, for the planner's tables)
#   BENCH_ARGS="--set square --dtypes bf16" STEPS=bench gpu/run_all.sh
#   STEPS="sanitize sass probe" gpu/run_all.sh         (sm90: compute-sanitizer, HGMMA in the SASS, template probe)
#   STEPS="fuzz fuzz_sanitize" FUZZ_ARGS="--cases 500" gpu/run_all.sh   (random calls against float64; then a sample of
#                                                       them under memcheck and racecheck: docs/fuzzing.md)
#   STEPS=corpus CORPUS_ARGS="--tokens 1,256,4096 --exact" gpu/run_all.sh   (the real models' layers, forward and
#                                                       backward, per M band: benchmarks/bench_corpus.py)
#   STEPS=corpusab CORPUS_AB_FLAGS=-DGEMMGEN_SM90_BLOCK_ORDER=0 CORPUS_ARGS="--passes fwd --tokens 256,512"
#                                                      (the corpus as is, then with a template switch: bench_corpus_{a,b})
#   STEPS=inductor gpu/run_all.sh                      (ours, cuBLAS and torch.compile max-autotune; what Inductor picked)
#   STEPS=power POWER_ARGS="--variant g16=raster_group:16" gpu/run_all.sh   (steady-state TFLOP/s, SM clock, power)
#   STEPS=ceiling CEILING_ARGS="--dtype fp16" gpu/run_all.sh   (mma.sync ceiling per clock next to the sm80 kernel;
#                                                       --probes ceiling,regs_w8,ldsm_w8,... for the ladder between them)
#   STEPS=tests GPU_TESTS=tests/gpu/test_sm90.py gpu/run_all.sh   (some GPU test files only; default: all of tests)
#   STEPS=ncusource NCU_SHAPES=2048x7168x2048 NCU_ARGS="--scale tensor"   (per-instruction SASS profile, ours beside cuBLAS)
#   STEPS=overhead gpu/run_all.sh                      (host time per call: JIT op, emitted op, torch.matmul)
#   STEPS=host gpu/run_all.sh                          (host-bound work: gpu/linear_overhead.py, train_step_profile.py,
#                                                       generate_profile.py, quantize_timing.py; logs per probe)
#   STEPS=trainprofile gpu/run_all.sh                  (a Llama training step's GPU time per kernel kind, stock against
#                                                       ours: gpu/llama_train_profile.py; TRAINPROFILE_ARGS)
#   STEPS=ab AB_ARGS="--variant a= --variant b=-DX=1" gpu/run_all.sh   (template variants A/B: gpu/ab_variants.py)
#   STEPS=ab90 gpu/run_all.sh                          (the same for sm90, default: stream-K on/off, fp16)
#   STEPS=epilogue EPILOGUE_ARGS="--no-inductor" gpu/run_all.sh   (fused epilogues vs cuBLASLt, addmm, Inductor)
#   STEPS=dtypes DTYPES_ARGS="--modes fp8_tensor,fp8_block" gpu/run_all.sh   (fp8/int8/tf32 tests, then the benchmark
#                                                       against torch._scaled_mm, torch._int_mm, TF32 cuBLAS)
#   STEPS=cublas CUBLAS_ARGS="--tokens 64,256"       (which kernels cuBLAS runs for the corpus' GEMMs: gpu/cublas_kernels.py)
#   STEPS=midm MIDM_ARGS="--shapes 64x8192x8192"     (M = 17-512: data-parallel against stream-K tiles, beside cuBLAS)
#   STEPS=grouped GROUPED_ARGS="--ragged" GROUPED_TAG=_ragged gpu/run_all.sh   (grouped GEMM vs torch._grouped_mm and a
#                                                       torch.mm loop; tests: STEPS=tests GPU_TESTS=tests/gpu/test_grouped.py)
#   STEPS=groupedfp8 gpu/run_all.sh                    (fp8 grouped with block scales against DeepGEMM's figures: gpu/bench_grouped_fp8.py)
#   STEPS=groupedfp8row gpu/run_all.sh                 (fp8 grouped with per-row scales against torch._scaled_grouped_mm)
#   STEPS=quantout gpu/run_all.sh                      (quantize-on-store against a bf16 GEMM and quantize(): benchmarks/bench_quantized_out.py)
#   STEPS=moe MOE_ARGS="--rounds 2" gpu/run_all.sh       (MoE layers of public models at uniform, Dirichlet and
#                                                       Zipf routing: benchmarks/bench_moe.py)
#   STEPS=moeblock gpu/run_all.sh                      (a MoE block's training step against torch._grouped_mm, each
#                                                       routing: examples/moe_block.py; MOEBLOCK_ARGS="--experts 8 ...")
#   STEPS=grouped GROUPED_ARGS=--list-only gpu/run_all.sh   (list form only: op.grouped_list; tests: tests/gpu/test_grouped_list.py)
#   STEPS=tune gpu/run_all.sh                          (tune 3 shapes from an empty build cache and tuning table, then
#                                                       the same again from the cache; TUNE_SHAPES, TUNE_ARGS="--dtype fp16")
#   STEPS=tunecorpus TUNE_CORPUS_ARGS="--tokens 256,512 --max-candidates 8"   (tune the corpus' forward layers and
#                                                       write the winners as a dispatch table: benchmarks/tune_corpus.py)
#   STEPS=ncu NCU_SHAPES="384x29568x8192 1024x1024x3072" NCU_ARGS="--layout tn" gpu/run_all.sh   (ncu, clocks left
#                                                       alone, on the planner's kernel and cuBLAS's for each shape:
#                                                       gpu/ncu_compare.sh; NCU_DTYPE=bf16)
#   STEPS=sktimeline SKTIMELINE_ARGS="--kernel 64x64x64:1x1:pingpong:12:sk --shapes 256x512x7168"   (a split-K call's
#                                                       blocks on the global timer, with and without the exchange)
#   STEPS=calibrate CALIBRATE_ARGS="--families sm90" CALIBRATE_TAG=_sm90 gpu/run_all.sh   (the estimate's pick against
#                                                       the measured best on the LLM set and squares, then --fit)
set -uo pipefail
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export GEMMGEN_CACHE_DIR=${GEMMGEN_CACHE_DIR:-/tmp/gemmgen-cache}
STEPS=${STEPS:-timing tests bench}
status=0

python3 -m pip install --no-build-isolation --no-deps -e . > "$OUT/install.log" 2>&1 || { echo "pip install failed (see install.log); using PYTHONPATH"; tail -5 "$OUT/install.log"; }
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; nvcc --version | tail -1; } > "$OUT/env.txt" 2>&1

for step in $STEPS; do
  case $step in
    timing) python3 gpu/build_timing.py 2>&1 | tee "$OUT/build_timing.log" || status=1 ;;
    tests)  python3 -m pytest ${GPU_TESTS:-tests} -q -x -m gpu ${PYTEST_ARGS:-} 2>&1 | tee "$OUT/tests.log"; [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    ab)     if [ -z "${AB_ARGS:-}" ]; then echo "ab: set AB_ARGS, e.g. AB_ARGS='--configs sm80 --variant a= --variant b=-DSWITCH=1'"; status=2; else
              python3 gpu/ab_variants.py --json "$OUT/ab_variants.json" $AB_ARGS 2>&1 | grep -v '^\[gemmgen\]' | tee "$OUT/ab_variants.log"; [ "${PIPESTATUS[0]}" = 0 ] || status=1; fi ;;
    ab90)   python3 gpu/ab_variants.py --json "$OUT/ab_variants_sm90.json" ${AB90_ARGS:---configs sm90 --dtype fp16 --variant dp= --variant sk=-DGEMMGEN_SM90_STREAM_K=1} 2>&1 | grep -v '^\[gemmgen\]' | tee "$OUT/ab_variants_sm90.log"; [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    sweep)  python3 benchmarks/sweep.py ${SWEEP_ARGS:-} 2>&1 | tee "$OUT/sweep.log" || status=1 ;;
    inductor) python3 benchmarks/inductor_compare.py --json "$OUT/inductor_compare.json" ${INDUCTOR_ARGS:-} 2>&1 | grep -v '^\[gemmgen\]' | tee "$OUT/inductor_compare.log"; [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    power)  python3 gpu/power_probe.py --json "$OUT/power_probe.json" ${POWER_ARGS:-} 2>&1 | grep -v '^\[gemmgen\]' | tee "$OUT/power_probe.log"; [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    ceiling) python3 gpu/mma_ceiling.py --json "$OUT/mma_ceiling.json" ${CEILING_ARGS:-} 2>&1 | grep -v '^\[gemmgen\]' | tee "$OUT/mma_ceiling.log"; [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    epilogue) python3 benchmarks/bench_epilogue.py --json "$OUT/bench_epilogue${EPILOGUE_TAG:-}.json" ${EPILOGUE_ARGS:-} 2>&1 | grep -v '^\[gemmgen\]' | tee "$OUT/bench_epilogue${EPILOGUE_TAG:-}.log"; [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    dtypes) python3 -m pytest tests/gpu/test_fp8.py tests/gpu/test_int8.py tests/gpu/test_tf32.py -q -m gpu -s ${PYTEST_ARGS:-} 2>&1 | tee "$OUT/dtypes_tests.log"; [ "${PIPESTATUS[0]}" = 0 ] || status=1
            python3 benchmarks/bench_dtypes.py --json "$OUT/bench_dtypes.json" ${DTYPES_ARGS:-} 2>&1 | grep -v '^\[gemmgen\]' | tee "$OUT/bench_dtypes.log"; [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    grouped) python3 benchmarks/bench_grouped.py --json "$OUT/bench_grouped${GROUPED_TAG:-}.json" ${GROUPED_ARGS:-} 2>&1 | grep -v '^\[gemmgen\]' | tee "$OUT/bench_grouped${GROUPED_TAG:-}.log"; [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    groupedfp8) python3 gpu/bench_grouped_fp8.py ${GROUPED_FP8_ARGS:-} 2>&1 | grep -v '^\[gemmgen\]' | tee "$OUT/bench_grouped_fp8.log"; [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    groupedfp8row) python3 gpu/bench_grouped_fp8_rowwise.py 2>&1 | grep -v '^\[gemmgen\]' | tee "$OUT/bench_grouped_fp8_rowwise.log"; [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    quantout) python3 benchmarks/bench_quantized_out.py --json "$OUT/bench_quantized_out.json" ${QUANTOUT_ARGS:-} 2>&1 | grep -v '^\[gemmgen\]' | tee "$OUT/bench_quantized_out.log"; [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    moe)    python3 benchmarks/bench_moe.py --json "$OUT/bench_moe${MOE_TAG:-}.json" ${MOE_ARGS:-} 2>&1 | grep -v '^\[gemmgen\]' | tee "$OUT/bench_moe${MOE_TAG:-}.log"; [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    moeblock) for routing in uniform dirichlet zipf; do
              python3 examples/moe_block.py --routing $routing --json "$OUT/moe_block_$routing${MOEBLOCK_TAG:-}.json" \
                ${MOEBLOCK_ARGS:-} 2>&1 | grep -v '^\[gemmgen\]' | tee "$OUT/moe_block_$routing${MOEBLOCK_TAG:-}.log"
              [ "${PIPESTATUS[0]}" = 0 ] || status=1
            done ;;
    cublas) python3 gpu/cublas_kernels.py --json "$OUT/cublas_kernels${CUBLAS_TAG:-}.json" ${CUBLAS_ARGS:-} > "$OUT/cublas_kernels${CUBLAS_TAG:-}.log" 2>&1 || status=1; tail -3 "$OUT/cublas_kernels${CUBLAS_TAG:-}.log" ;;
    midm)   python3 gpu/midm_tiles.py --json "$OUT/midm_tiles.json" ${MIDM_ARGS:-} 2>&1 | grep -v '^\[gemmgen\]' | tee "$OUT/midm_tiles.log"; [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    tune)   # A fresh build cache and tuning table: the first tune of each shape pays its builds (the first one the JIT
            # runtime's too), the second answers from the table; stderr (the progress bars) goes to tune_progress.log.
            tune_cache=$(mktemp -d)
            for pass in first second; do
              GEMMGEN_CACHE_DIR=$tune_cache GEMMGEN_TUNING_DIR=$tune_cache/tuning python3 -m generator tune --layout tn \
                --shapes ${TUNE_SHAPES:-4096x4096x4096,512x4096x14336,128x4096x4096} ${TUNE_ARGS:-} \
                2>> "$OUT/tune_progress.log" | tee -a "$OUT/tune.log"; [ "${PIPESTATUS[0]}" = 0 ] || status=1
            done
            GEMMGEN_CACHE_DIR=$tune_cache GEMMGEN_TUNING_DIR=$tune_cache/tuning python3 -m generator tune --export "$OUT/tuning.json" | tee -a "$OUT/tune.log"
            rm -rf "$tune_cache" ;;
    tunecorpus) python3 benchmarks/tune_corpus.py --out "$OUT/dispatch_table.json" ${TUNE_CORPUS_ARGS:-} 2>&1 | grep -v '^\[gemmgen\]' | tee "$OUT/tune_corpus.log"; [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    calibrate) python3 benchmarks/calibrate.py --json "$OUT/calibrate${CALIBRATE_TAG:-}.json" ${CALIBRATE_ARGS:-} \
                 2> "$OUT/calibrate${CALIBRATE_TAG:-}_progress.log" | tee "$OUT/calibrate${CALIBRATE_TAG:-}.log"; [ "${PIPESTATUS[0]}" = 0 ] || status=1
               python3 benchmarks/calibrate.py --fit "$OUT/calibrate${CALIBRATE_TAG:-}.json" --fit-json "$OUT/calibrate${CALIBRATE_TAG:-}_fit.json" 2>&1 | tee -a "$OUT/calibrate${CALIBRATE_TAG:-}.log" ;;
    bench)  python3 benchmarks/bench.py --json "$OUT/bench.json" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" || status=1 ;;
    corpusab) # the corpus twice, the second time with a template switch (CORPUS_AB_FLAGS) in every kernel it builds
            python3 benchmarks/bench_corpus.py --json "$OUT/bench_corpus_a.json" ${CORPUS_ARGS:-} 2>&1 | grep -v '^\[gemmgen\]' | tee "$OUT/bench_corpus_a.log"; [ "${PIPESTATUS[0]}" = 0 ] || status=1
            GEMMGEN_EXTRA_NVCC_FLAGS="${CORPUS_AB_FLAGS:?set CORPUS_AB_FLAGS, e.g. -DGEMMGEN_SM90_BLOCK_ORDER=0}" \
              python3 benchmarks/bench_corpus.py --json "$OUT/bench_corpus_b.json" ${CORPUS_ARGS:-} 2>&1 | grep -v '^\[gemmgen\]' | tee "$OUT/bench_corpus_b.log"; [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    corpus) python3 benchmarks/bench_corpus.py --json "$OUT/bench_corpus${CORPUS_TAG:-}.json" ${CORPUS_ARGS:-} 2>&1 | grep -v '^\[gemmgen\]' | tee "$OUT/bench_corpus${CORPUS_TAG:-}.log"; [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    sanitize)
      python3 gpu/sanitize.py > /dev/null 2>&1   # build outside the sanitizer
      for tool in memcheck racecheck; do
        compute-sanitizer --tool $tool python3 gpu/sanitize.py 2>&1 | tail -60 | tee "$OUT/sanitize_$tool.log"
        [ "${PIPESTATUS[0]}" = 0 ] || status=1
      done ;;
    fuzz)   python3 gpu/fuzz.py --json "$OUT/fuzz.json" ${FUZZ_ARGS:-} 2>&1 | grep -v '^\[gemmgen\]' | tee "$OUT/fuzz.log"; [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    fuzz_sanitize)   # small cases of the same draws; built outside the sanitizer; no caching allocator, so that
                     # memcheck sees each tensor's own bounds
      python3 gpu/fuzz.py --build-only --sample ${FUZZ_MEMCHECK_SAMPLE:-10} ${FUZZ_ARGS:-} > "$OUT/fuzz_sanitize_build.log" 2>&1 || status=1
      for tool in memcheck racecheck; do
        sample=${FUZZ_MEMCHECK_SAMPLE:-10}; [ $tool = racecheck ] && sample=${FUZZ_RACECHECK_SAMPLE:-4}
        PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool $tool --error-exitcode 1 python3 gpu/fuzz.py --sample $sample \
          --json "$OUT/fuzz_sanitize_$tool.json" ${FUZZ_ARGS:-} 2>&1 | grep -v '^\[gemmgen\]' > "$OUT/fuzz_sanitize_$tool.log"
        [ "${PIPESTATUS[0]}" = 0 ] || status=1
        tail -40 "$OUT/fuzz_sanitize_$tool.log"
      done ;;
    host)   # host-bound work: a Linear call at decode sizes, an MLP stack's training step, an eager generate() row, quantize(),
            # a list call of 128 small problems
            for probe in "gpu/linear_overhead.py" "gpu/train_step_profile.py" "gpu/generate_profile.py ${GENPROFILE_ARGS:---batches 1 --new-tokens 32 --rounds 9}" "gpu/quantize_timing.py" "gpu/list_host_time.py"; do
              name=$(basename "${probe%% *}" .py)
              OUT="$OUT" python3 $probe 2>&1 | grep -v '^\[gemmgen\]' > "$OUT/$name.log"; [ "${PIPESTATUS[0]}" = 0 ] || status=1
              head -8 "$OUT/$name.log"
            done ;;
    overhead) OUT="$OUT" python3 gpu/overhead.py 2>&1 | grep -v '^\[gemmgen\]' | tee "$OUT/overhead.log"; [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    sktimeline) python3 gpu/sk_timeline.py --json "$OUT/sk_timeline.json" ${SKTIMELINE_ARGS:---kernel 128x64x64:1x1:cooperative:8:sk --kernel 64x64x64:1x1:pingpong:12:sk} 2>&1 | grep -v '^\[gemmgen\]' | tee "$OUT/sk_timeline.log"; [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    ncusource) OUT="$OUT" bash gpu/ncu_source.sh "${NCU_SHAPES:-2048x7168x2048}" "${NCU_DTYPE:-e4m3}" "${NCU_ARGS:---scale tensor}" 2>&1 | tee "$OUT/ncu_source.log"; [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    ncu)    OUT="$OUT" bash gpu/ncu_compare.sh "${NCU_SHAPES:-4096x4096x4096}" "${NCU_DTYPE:-bf16}" "${NCU_ARGS:-}" 2>&1 | tee "$OUT/ncu_compare.log"; [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    trainprofile) OUT="$OUT" python3 gpu/llama_train_profile.py ${TRAINPROFILE_ARGS:---layers 4 --hidden 3072 --intermediate 8192 --heads 24 --kv-heads 8 --train-batch 2 --train-len 1024 --rounds 5} 2>&1 | grep -v '^\[gemmgen\]' | tee "$OUT/llama_train_profile.log"; [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    sass)   python3 gpu/sass_check.py 2>&1 | tee "$OUT/sass.log"; [ "${PIPESTATUS[0]}" = 0 ] || status=1 ;;
    probe)  python3 gpu/sm90_probe.py --json "$OUT/sm90_probe.json" ${PROBE_ARGS:-} 2>&1 | grep -v '^\[gemmgen\]' | tee "$OUT/probe.log" || status=1 ;;
    *) echo "unknown step $step"; status=2 ;;
  esac
done
cat "$OUT/env.txt"
exit $status
