# Run 24 (issue 13): real vLLM at 256 in flight, every request stamped. Run 23b's c256 captures keep their closed
# loop's waves (the next wave's first token 0.12-0.22 s after the last one's end, its prompts sent 0.2-0.35 s before);
# the simulator spreads them (TTFT P50 767 against 1,737 ms). Runs 19-22 stamped c1-c128 only. Here run 23b's engine
# (run24-engine-args.txt, the operator's flags for decision_cost.py's 8b/h200 highconc, --max-num-seqs 256), and:
# stage_client.py's closed loop of 512-token prompts / 256 out at 256 in flight with stamps on, the same without
# (what the stamps cost), 128 in flight with stamps on; then the load-test Job's own flags (run24-loads.txt, from
# make_run23_args.py --run24): one repeat of highconc and of the example experiment, as sim_vs_real_vllm.py replays.
set -u
S=$(cd "$(dirname "$0")" && pwd)
K=$PWD/.device-kit/scripts
. /tmp/k/device-setup.sh 2>/dev/null || . $K/device-setup.sh
export KP_MODEL_NAME=Llama-3.1-8B-Instruct
M=8b RUN=r24 SEED=2400
R=/tmp/$RUN; mkdir -p $R/st; t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
T() { echo "$* at $(el) s epoch $(date +%s.%N | cut -c1-14)" | tee -a $R/timeline.txt; }
export PYTHONPATH=$PWD/operator:$PYTHONPATH
echo "checkout $(git rev-parse HEAD 2>/dev/null)" > $R/source.txt
cp $S/run24-engine-args.txt $S/run24-loads.txt $R/
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv > $R/gpu.txt 2>&1
lscpu > $R/lscpu.txt 2>&1
pack() { curl -s http://127.0.0.1:8000/metrics > $R/metrics-last.txt 2>/dev/null; tar czf $OUT/run24-results.tgz -C /tmp $RUN; }
KP_STAGE_DIR=$R/st PYTHONPATH=$S/stage_trace:$PYTHONPATH python3 -m vllm.entrypoints.cli.main serve $(cat $S/run24-engine-args.txt) --load-format dummy > $R/serve-$M.log 2>&1 & srv=$!
up=0; for i in $(seq 1 300); do curl -sf http://127.0.0.1:8000/health >/dev/null 2>&1 && { up=1; break; }; kill -0 $srv 2>/dev/null || break; sleep 1; done
T "$M up=$up"; pack
[ $up = 1 ] || exit 0
snap() { curl -s http://127.0.0.1:8000/metrics | grep -E '^vllm:(time_to_first_token|request_queue_time|request_prefill_time|e2e_request_latency|iteration_tokens)' > $R/m-$1.txt; }
CL() { n=$1; shift; snap $n-before; T "start $n"; timeout 150 python3 $S/stage_client.py $R/cl-$n.json "$n" "$@" > $R/cl-$n.txt 2>&1; echo "rc=$?" >> $R/cl-$n.txt; T "client $n done $(head -c 200 $R/cl-$n.txt)"; snap $n-after; pack; }
CL warm 1 1 2 0 512 16 $((SEED + 0))
touch $R/st/on; sleep 0.5
CL c256 1 256 1000 256 512 256 $((SEED + 1))
rm -f $R/st/on; sleep 1
CL off-c256 1 256 1000 256 512 256 $((SEED + 5))
touch $R/st/on; sleep 0.5
CL c128 1 128 512 128 512 256 $((SEED + 6))
rm -f $R/st/on; sleep 1
while read -r name args; do
  [ -n "$name" ] || continue
  T "loadgen $name start"
  TERMINATION_MESSAGE_PATH=$R/lg-$name.termination.json timeout 150 python3 -m kneepoint loadgen $args --save-json $R/lg-$name.json > $R/lg-$name.txt 2>&1
  echo "rc=$?" >> $R/lg-$name.txt
  T "loadgen $name done"; pack
done < $S/run24-loads.txt
kill $srv 2>/dev/null; for j in $(seq 1 15); do kill -0 $srv 2>/dev/null || break; sleep 1; done
T end; pack; ls -la $OUT
