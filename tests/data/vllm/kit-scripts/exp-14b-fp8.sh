# Run 31 (issue 13): a held-out model, dtype and GPU together: Qwen2.5-14B's shape with online fp8 on an H100, the
# operator's flags (engine-args-14b-fp8.txt: vllm_args for the example experiment with model Qwen/Qwen2.5-14B-Instruct
# and dtype fp8). First gemm_by_rows.py on the 14B's linear shapes (a third shape for the per-GPU fp8 row factors,
# which average the 8B's and the 70B's), then run 12b's decode-dominated loads (128/256, c8-c128) and 1,024/256 at
# c1 and c32 (run31-loads.txt, seeds 3101-3111). `exp-14b-fp8.sh [RUN]`.
set -u
RUN=${1:-r31}
S=$(cd "$(dirname "$0")" && pwd)
K=$PWD/.device-kit/scripts
. /tmp/k/device-setup.sh 2>/dev/null || . $K/device-setup.sh
export PYTHONPATH=$PWD/operator:$PYTHONPATH
R=/tmp/$RUN; mkdir -p $R; t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
T() { echo "$* at $(el) s epoch $(date +%s.%N | cut -c1-14)" | tee -a $R/timeline.txt; }
pack() { tar czf $OUT/$RUN-results.tgz -C /tmp $RUN 2>/dev/null; }
echo "checkout $(git rev-parse HEAD 2>/dev/null)" > $R/source.txt
cp $S/engine-args-14b-fp8.txt $S/run31-loads.txt $R/
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv > $R/gpu.txt 2>&1
lscpu > $R/lscpu.txt 2>&1
KP_ROWS=1,8,16,17,24,32,40,48,56,64,65,72,80,88,96,104,112,120,128,129,136,144,160,192,224,256 KP_SHAPES=14b:1 \
  timeout 120 python3 $S/gemm_by_rows.py $R/gemm-by-rows.jsonl > $R/gemm.log 2>&1; echo "rc=$?" >> $R/gemm.log
T "gemm done"; pack
python3 $S/make_qwen14b.py > $R/make-model.txt 2>&1
python3 -m vllm.entrypoints.cli.main serve $(cat $S/engine-args-14b-fp8.txt) --load-format dummy --tokenizer /tmp/k/models/tok-qwen-152k > $R/serve-$RUN.log 2>&1 & srv=$!
up=0; for i in $(seq 1 300); do curl -sf http://127.0.0.1:8000/health >/dev/null 2>&1 && { up=1; break; }; kill -0 $srv 2>/dev/null || break; sleep 1; done
T "$RUN up=$up"; curl -s http://127.0.0.1:8000/metrics > $R/metrics-start.txt; pack
if [ $up = 1 ]; then
  while read -r name args; do
    [ -n "$name" ] || continue
    [ $(el) -gt 540 ] && { T "skip $name"; continue; }
    T "loadgen $name start"
    TERMINATION_MESSAGE_PATH=$R/lg-$name.termination.json timeout 50 python3 -m kneepoint loadgen $args --save-json $R/lg-$name.json > $R/lg-$name.txt 2>&1
    echo "rc=$?" >> $R/lg-$name.txt
    T "loadgen $name done $(grep -o '"tpotMeanMs": [0-9.]*' $R/lg-$name.json | head -1)"
  done < $S/run31-loads.txt
  curl -s http://127.0.0.1:8000/metrics > $R/metrics-last.txt
fi
kill $srv 2>/dev/null; for j in $(seq 1 10); do kill -0 $srv 2>/dev/null || break; sleep 1; done
T "$RUN end"; pack; ls -la $OUT
