# Run 32 (issue 13): where the 14B fp8's first tokens go on an H100. Run 31 found every TTFT of Qwen2.5-14B's shape
# with online fp8 13-34 % later on real vLLM than in the simulator while its decode steps are within 4 %. Same engine
# and flags as run 31 (engine-args-14b-fp8.txt), stamped inside vLLM (stage_trace/sitecustomize.py, as runs 19-22 and
# 28-29): first gemm_by_rows.py on the 14B's shapes at prefill sizes (512-8,192 rows: run 31 stopped at 256), then
# second takes of run 31's c1, d-c8, d-c32 and d-c128 loads (run32-loads.txt, new seeds 3201, 3204, 3209, 3210, stamps off), then
# stamped closed loops: lone 1,024-token prompts, and waves of 8 and 32 128-token prompts. `exp-14b-fp8-stages.sh [RUN]`.
set -u
RUN=${1:-r32}
S=$(cd "$(dirname "$0")" && pwd)
K=$PWD/.device-kit/scripts
. /tmp/k/device-setup.sh 2>/dev/null || . $K/device-setup.sh
export KP_MODEL_NAME=Qwen2.5-14B-Instruct
export PYTHONPATH=$PWD/operator:$PYTHONPATH
R=/tmp/$RUN; mkdir -p $R/st; t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
T() { echo "$* at $(el) s epoch $(date +%s.%N | cut -c1-14)" | tee -a $R/timeline.txt; }
pack() { tar czf $OUT/$RUN-results.tgz -C /tmp $RUN 2>/dev/null; }
echo "checkout $(git rev-parse HEAD 2>/dev/null)" > $R/source.txt
cp $S/engine-args-14b-fp8.txt $S/run32-loads.txt $R/
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv > $R/gpu.txt 2>&1
lscpu > $R/lscpu.txt 2>&1
KP_ROWS=512,1024,2048,4096,8192 KP_SHAPES=14b:1 timeout 60 python3 $S/gemm_by_rows.py $R/gemm-by-rows.jsonl > $R/gemm.log 2>&1; echo "rc=$?" >> $R/gemm.log
T "gemm done"; pack
python3 $S/make_qwen14b.py > $R/make-model.txt 2>&1
KP_STAGE_DIR=$R/st PYTHONPATH=$S/stage_trace:$PYTHONPATH python3 -m vllm.entrypoints.cli.main serve $(cat $S/engine-args-14b-fp8.txt) --load-format dummy --tokenizer /tmp/k/models/tok-qwen-152k > $R/serve-$RUN.log 2>&1 & srv=$!
up=0; for i in $(seq 1 300); do curl -sf http://127.0.0.1:8000/health >/dev/null 2>&1 && { up=1; break; }; kill -0 $srv 2>/dev/null || break; sleep 1; done
T "$RUN up=$up"; pack
if [ $up = 1 ]; then
  CL() { n=$1; shift; [ $(el) -gt 540 ] && { T "skip $n"; return; }; T "start $n"; timeout 40 python3 $S/stage_client.py $R/cl-$n.json "$n" "$@" > $R/cl-$n.txt 2>&1; echo "rc=$?" >> $R/cl-$n.txt; T "client $n done"; }
  CL warm 1 1 2 0 128 16 3220
  while read -r name args; do
    [ -n "$name" ] || continue
    [ $(el) -gt 480 ] && { T "skip $name"; continue; }
    T "loadgen $name start"
    TERMINATION_MESSAGE_PATH=$R/lg-$name.termination.json timeout 50 python3 -m kneepoint loadgen $args --save-json $R/lg-$name.json > $R/lg-$name.txt 2>&1
    echo "rc=$?" >> $R/lg-$name.txt
    T "loadgen $name done $(grep -o '"ttftP50Ms": [0-9.]*' $R/lg-$name.json | head -1)"
  done < $S/run32-loads.txt
  pack
  touch $R/st/on; sleep 0.5
  # stage_client: LABEL STREAM CONCURRENCY NUM WARMUP INPUT_LEN OUTPUT_LEN SEED
  CL c1 1 1 8 1 1024 64 3221
  CL c8 1 8 16 8 128 256 3222
  CL c32 1 32 64 32 128 256 3223
  rm -f $R/st/on; curl -s http://127.0.0.1:8000/metrics > $R/metrics-last.txt 2>/dev/null
fi
kill $srv 2>/dev/null; for j in $(seq 1 10); do kill -0 $srv 2>/dev/null || break; sleep 1; done
T "$RUN end"; pack; ls -la $OUT
