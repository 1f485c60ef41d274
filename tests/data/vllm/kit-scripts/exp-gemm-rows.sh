# run 12 (issue 13): vLLM's linear-layer kernels timed by the rows (tokens) of a step, no server: the 70B fp8 decode step
# at 32 sequences took 28.1 ms against 21.5 at 16 (run 11), and vLLM's fp8 GEMM dispatch on SM90 picks its CUTLASS
# configuration by M ([1,16], (16,64], (64,128], above). gemm_by_rows.py times cutlass_scaled_mm (fp8, what
# --quantization fp8 runs) and F.linear (bf16, cuBLAS) for the Llama-3.1 70B shapes at TP 1/2/4 and the 8B's at TP 1.
set -u
S=$(cd "$(dirname "$0")" && pwd)
. /tmp/k/device-setup.sh 2>/dev/null || . $S/device-setup.sh
R=/tmp/r12; mkdir -p $R; t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,power.limit,driver_version --format=csv > $R/gpu.txt 2>&1
python3 -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)" > $R/versions.txt 2>&1
timeout 480 python3 $S/gemm_by_rows.py $R/gemm-by-rows.jsonl > $R/gemm.log 2>&1; echo "rc=$? after $(( $(date +%s) - t0 )) s" >> $R/gemm.log
tar czf $OUT/gemm-results.tgz -C /tmp r12; tail -3 $R/gemm.log; wc -l $R/gemm-by-rows.jsonl
