# Run 37 (issue 13): a wave of 128-token prompts on an H100, stamped and profiled. Runs 28-29 stamped the 8B's and
# the 8B fp8's closed loops of 128-token prompts (c8/c16/c48/c128): a wave reaches real vLLM's EngineCore in about half
# the simulator's intake, yet the engine's part of the wave is within 20 % of the model's, and the stamps cannot split a
# step's launch from its GPU work. Here each engine runs stamped closed loops of 128/256 at c24 and c40 (the loads whose
# TTFT the model misses most: +30 % at c40), then two profiled slices (the operator's --profiler-config, 64 steps) of
# the same loads at c24 and c48 through the load generator's --profile-seconds, whose kernels give each prefill step's
# GPU time beside its period. `exp-wave-profile.sh RUN:ARGS_FILE...` (run 37: r37:engine-args-8b-fp8.txt
# r37b:engine-args-realfit.txt), one engine after the other.
set -u
S=$(cd "$(dirname "$0")" && pwd)
K=$PWD/.device-kit/scripts
. /tmp/k/device-setup.sh 2>/dev/null || . $K/device-setup.sh
export PYTHONPATH=$PWD/operator:$PYTHONPATH
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
pack() { tar czf $OUT/$RUN-results.tgz -C /tmp $RUN 2>/dev/null; }  # one archive an engine: two traces each stay under 16 MiB
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
    CL warm 1 1 2 0 128 16 3700
    touch $R/st/on; sleep 0.5
    # stage_client: LABEL STREAM CONCURRENCY NUM WARMUP INPUT_LEN OUTPUT_LEN SEED
    CL c24 1 24 72 24 128 256 3701
    CL c40 1 40 120 40 128 256 3702
    rm -f $R/st/on; sleep 0.5; pack
    LGP() { n=$1; shift; rm -rf /tmp/prof; T "profile $n start"
      timeout 90 python3 -m kneepoint loadgen --endpoint http://127.0.0.1:8000 --model $M --api completions --max-error-fraction 1.0 --no-progress "$@" --save-json $R/lg-$n.json > $R/lg-$n.txt 2>&1; echo "rc=$?" >> $R/lg-$n.txt
      for i in $(seq 1 30); do s1=$(du -sb /tmp/prof 2>/dev/null | cut -f1); sleep 1; s2=$(du -sb /tmp/prof 2>/dev/null | cut -f1); [ "$s1" = "$s2" ] && [ "${s1:-0}" -gt 100000 ] && break; done
      big=$(ls -S /tmp/prof/*.gz 2>/dev/null | head -1)
      if [ -n "$big" ]; then python3 $S/kernels_by_step.py "$big" > $R/kernels-$n.txt 2>&1; sz=$(stat -c %s "$big"); echo "$n trace $big $sz bytes" >> $R/traces.txt
        [ "$sz" -lt 7500000 ] && cp "$big" $R/trace-$n.json.gz; fi
      T "profile $n done"; pack; }
    for C in 24 48; do LGP c$C --input-len 128 --output-len 256 --seed $((3710+C)) --concurrency $C --num-requests $((2*C)) --warmup-requests $C --profile-seconds 1.5 --profile-requests $((2*C)); done
  fi
  kill $srv 2>/dev/null; for j in $(seq 1 20); do kill -0 $srv 2>/dev/null || break; sleep 1; done
  T "$RUN end"; pack
}
for spec in "$@"; do engine ${spec%%:*} ${spec#*:}; done
ls -la $OUT
