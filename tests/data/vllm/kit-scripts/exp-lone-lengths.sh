# Run 34 (issue 13): how a step above the CUDA graphs adds the engine thread's launch and the GPU's work. Runs 32-33
# stamped a lone 1,024-token prompt on an H100 with online fp8: 17.3 ms (8B) and 32.7 ms (14B) from the step's plan
# to its token, where launch (13, 23 ms) and GPU work (the model's step 14.9, 24.9 ms) are about equal; on the H200's
# engines, whose GPU work is longer, that time was the model's step within 5 %. Two points cannot say how the two add
# up. Here each engine prefills lone prompts of 256 to 3,968 tokens (the GPU's part grows with the prompt, the
# launch about stays), stamped (stage_trace/sitecustomize.py, stage_client.py: 6 a length after one unrecorded
# warm-up, 8 tokens out), then two profiled slices (the operator's --profiler-config) of lone 1,024- and 3,072-token
# prompts, whose kernels say whether the GPU waits inside the step or its kernels run longer than the model's.
# `exp-lone-lengths.sh RUN:ARGS_FILE...`, one engine after the other (run 34: r34:engine-args-8b-fp8.txt
# r34b:engine-args-realfit.txt; r34c:engine-args-1b.txt. Run 35, held out: Qwen2.5-14B's shape,
# r35:engine-args-14b-fp8.txt r35b:engine-args-14b.txt, with run 18's tokenizer workaround).
set -u
S=$(cd "$(dirname "$0")" && pwd)
K=$PWD/.device-kit/scripts
. /tmp/k/device-setup.sh 2>/dev/null || . $K/device-setup.sh
export PYTHONPATH=$PWD/operator:$PYTHONPATH
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
FIRST=${1%%:*}
ALL=""; for spec in "$@"; do ALL="$ALL ${spec%%:*}"; done
pack() { tar czf $OUT/$FIRST-results.tgz -C /tmp $ALL 2>/dev/null; }
PC=$(python3 -c "import kneepoint.kube.manifests as m; m.PROFILES_DIR='/tmp/prof'; print(m.profiler_config())" 2>/dev/null) || \
  PC='{"profiler":"torch","torch_profiler_dir":"/tmp/prof","torch_profiler_with_stack":false,"ignore_frontend":true,"max_iterations":64}'
engine() {  # engine RUN ARGS_FILE
  RUN=$1 ARGS=$2
  R=/tmp/$RUN; mkdir -p $R/st; rm -rf /tmp/prof
  T() { echo "$* at $(el) s epoch $(date +%s.%N | cut -c1-14)" | tee -a $R/timeline.txt; }
  echo "checkout $(git rev-parse HEAD 2>/dev/null)" > $R/source.txt
  cp $S/$ARGS $R/; echo "$PC" > $R/profiler-config.txt
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv > $R/gpu.txt 2>&1
  lscpu > $R/lscpu.txt 2>&1
  grep -q llama-3.2-1b $S/$ARGS && python3 $S/make_llama1b.py
  EXTRA=""; if grep -q qwen2.5-14b $S/$ARGS; then python3 $S/make_qwen14b.py > $R/make-model.txt 2>&1; EXTRA="--tokenizer /tmp/k/models/tok-qwen-152k"; fi
  M=$(sed 's/.*--served-model-name \([^ ]*\).*/\1/' $S/$ARGS); export KP_MODEL_NAME=$M
  KP_STAGE_DIR=$R/st PYTHONPATH=$S/stage_trace:$PYTHONPATH python3 -m vllm.entrypoints.cli.main serve $(cat $S/$ARGS) --load-format dummy $EXTRA --profiler-config "$PC" > $R/serve-$RUN.log 2>&1 & srv=$!
  up=0; for i in $(seq 1 300); do curl -sf http://127.0.0.1:8000/health >/dev/null 2>&1 && { up=1; break; }; kill -0 $srv 2>/dev/null || break; sleep 1; done
  T "$RUN up=$up"; pack
  if [ $up = 1 ]; then
    CL() { n=$1; shift; T "start $n"; timeout 40 python3 $S/stage_client.py $R/cl-$n.json "$n" "$@" > $R/cl-$n.txt 2>&1; echo "rc=$?" >> $R/cl-$n.txt; T "client $n done"; }
    CL warm 1 1 2 0 128 16 3400
    touch $R/st/on; sleep 0.5
    # stage_client: LABEL STREAM CONCURRENCY NUM WARMUP INPUT_LEN OUTPUT_LEN SEED
    k=0; for L in 256 384 512 768 1024 1536 2048 3072 3968; do k=$((k+1)); CL p$L 1 1 6 1 $L 8 $((3400+k)); done
    rm -f $R/st/on; sleep 0.5; pack
    LGP() { n=$1; shift; rm -rf /tmp/prof; T "profile $n start"
      timeout 60 python3 -m kneepoint loadgen --endpoint http://127.0.0.1:8000 --model $M --api completions --max-error-fraction 1.0 --no-progress "$@" --save-json $R/lg-$n.json > $R/lg-$n.txt 2>&1; echo "rc=$?" >> $R/lg-$n.txt
      for i in $(seq 1 30); do s1=$(du -sb /tmp/prof 2>/dev/null | cut -f1); sleep 1; s2=$(du -sb /tmp/prof 2>/dev/null | cut -f1); [ "$s1" = "$s2" ] && [ "${s1:-0}" -gt 100000 ] && break; done
      big=$(ls -S /tmp/prof/*.gz 2>/dev/null | head -1)
      if [ -n "$big" ]; then python3 $S/kernels_by_step.py "$big" > $R/kernels-$n.txt 2>&1; sz=$(stat -c %s "$big"); echo "$n trace $big $sz bytes" >> $R/traces.txt
        [ "$sz" -lt 15000000 ] && cp "$big" $R/trace-$n.json.gz; fi
      T "profile $n done"; pack; }
    LGP p1024 --input-len 1024 --output-len 8 --seed 3420 --concurrency 1 --num-requests 3 --warmup-requests 1 --profile-seconds 1 --profile-requests 3
    LGP p3072 --input-len 3072 --output-len 8 --seed 3421 --concurrency 1 --num-requests 3 --warmup-requests 1 --profile-seconds 1 --profile-requests 3
  fi
  kill $srv 2>/dev/null; for j in $(seq 1 20); do kill -0 $srv 2>/dev/null || break; sleep 1; done
  T "$RUN end"; pack
}
for spec in "$@"; do engine ${spec%%:*} ${spec#*:}; done
ls -la $OUT
