# Run 25 (issue 13): what holds a render in the 1B's API server. Run 19 showed that while the 1B streams, no prompt
# of a closed loop's wave is rendered before the wave's last handler has started (0 of 640), without streaming a
# third are. If the render waits for Python's interpreter lock, which the API server's busy main thread hands over
# only at its switch interval (5 ms by default), a shorter interval lets renders through sooner and a longer one
# holds them longer; if it waits in the event loop's queue, the interval moves nothing. Same engine, prompts,
# stamps and client as run 19 (exp-stages.sh 1b): the 1B with the operator's flags (engine-args-1b.txt), the
# switch interval of the API server's process set between loads through stage_trace/sitecustomize.py
# ($R/st/switch, in µs), each load at 5,000 (Python's default), 500 and 20,000 µs, interleaved.
set -u
S=$(cd "$(dirname "$0")" && pwd)
K=$PWD/.device-kit/scripts
. /tmp/k/device-setup.sh 2>/dev/null || . $K/device-setup.sh
RUN=r25 ARGS=engine-args-1b.txt SEED=2500; export KP_MODEL_NAME=Llama-3.2-1B-Instruct
R=/tmp/$RUN; mkdir -p $R/st; t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
T() { echo "$* at $(el) s epoch $(date +%s.%N | cut -c1-14)" | tee -a $R/timeline.txt; }
export PYTHONPATH=$PWD/operator:$PYTHONPATH
echo "checkout $(git rev-parse HEAD 2>/dev/null)" > $R/source.txt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $R/gpu.txt 2>&1
lscpu > $R/lscpu.txt 2>&1
pack() { tar czf $OUT/switch-results.tgz -C /tmp $RUN; }
python3 $S/make_llama1b.py
KP_STAGE_DIR=$R/st PYTHONPATH=$S/stage_trace:$PYTHONPATH python3 -m vllm.entrypoints.cli.main serve $(cat $S/$ARGS) --load-format dummy > $R/serve-1b.log 2>&1 & srv=$!
up=0; for i in $(seq 1 360); do curl -sf http://127.0.0.1:8000/health >/dev/null 2>&1 && { up=1; break; }; kill -0 $srv 2>/dev/null || break; sleep 1; done
T "1b up=$up"; pack
[ $up = 1 ] || exit 0
CL() { n=$1; shift; T "start $n"; timeout 120 python3 $S/stage_client.py $R/cl-$n.json "$n" "$@" > $R/cl-$n.txt 2>&1; echo "rc=$?" >> $R/cl-$n.txt; T "client $n done $(head -c 200 $R/cl-$n.txt)"; }
SW() { echo $1 > $R/st/switch; sleep 0.6; }
CL warm 1 1 2 0 1024 16 $SEED
touch $R/st/on; sleep 0.5
k=1
for rep in a b; do
  for us in 5000 500 20000; do
    SW $us
    CL c32-s$us-$rep 1 32 160 32 1024 256 $((SEED + k)); k=$((k + 1))
    CL p128-s$us-$rep 1 32 160 32 128 256 $((SEED + k)); k=$((k + 1))
  done
  pack
done
for us in 5000 500; do
  SW $us
  CL c128-s$us 1 128 256 128 1024 256 $((SEED + k)); k=$((k + 1))
done
SW 5000
rm -f $R/st/on; sleep 1
kill $srv 2>/dev/null; for j in $(seq 1 15); do kill -0 $srv 2>/dev/null || break; sleep 1; done
T end; pack; ls -la $OUT
