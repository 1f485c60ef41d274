# Run 27 (issue 13): what the 1B's API server does while a wave waits for its renders. Runs 19, 25 and 26: at a
# closed loop's wave boundary the loop is 8-14 ms late at times with no stamp in between, and no prompt is rendered
# before the wave's last handler. The stamps (stage_trace/sitecustomize.py) now also record every garbage
# collection in every process and sample the API server's loop thread every millisecond; switch files turn the
# collector off in the API server (gcoff-api) or the EngineCore (gcoff-core) between loads, and stop the sampler
# (nosample) to see what it costs. Same engine, client and prompts as runs 19, 25 and 26 (engine-args-1b.txt).
set -u
S=$(cd "$(dirname "$0")" && pwd)
K=$PWD/.device-kit/scripts
. /tmp/k/device-setup.sh 2>/dev/null || . $K/device-setup.sh
RUN=r27 ARGS=engine-args-1b.txt SEED=2700; export KP_MODEL_NAME=Llama-3.2-1B-Instruct
R=/tmp/$RUN; mkdir -p $R/st; t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
T() { echo "$* at $(el) s epoch $(date +%s.%N | cut -c1-14)" | tee -a $R/timeline.txt; }
export PYTHONPATH=$PWD/operator:$PYTHONPATH
echo "checkout $(git rev-parse HEAD 2>/dev/null)" > $R/source.txt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $R/gpu.txt 2>&1
lscpu > $R/lscpu.txt 2>&1
pack() { tar czf $OUT/loop-results.tgz -C /tmp $RUN; }
python3 $S/make_llama1b.py
KP_STAGE_DIR=$R/st PYTHONPATH=$S/stage_trace:$PYTHONPATH python3 -m vllm.entrypoints.cli.main serve $(cat $S/$ARGS) --load-format dummy > $R/serve-1b.log 2>&1 & srv=$!
up=0; for i in $(seq 1 360); do curl -sf http://127.0.0.1:8000/health >/dev/null 2>&1 && { up=1; break; }; kill -0 $srv 2>/dev/null || break; sleep 1; done
T "1b up=$up"; pack
[ $up = 1 ] || exit 0
CL() { n=$1; shift; T "start $n"; timeout 120 python3 $S/stage_client.py $R/cl-$n.json "$n" "$@" > $R/cl-$n.txt 2>&1; echo "rc=$?" >> $R/cl-$n.txt; T "client $n done $(head -c 200 $R/cl-$n.txt)"; }
mode() { rm -f $R/st/gcoff-api $R/st/gcoff-core $R/st/nosample; for f in "$@"; do touch $R/st/$f; done; sleep 0.6; T "mode ${*:-default}"; }
CL warm 1 1 2 0 1024 16 $SEED
touch $R/st/on; sleep 0.5
mode; CL c1 1 1 8 1 1024 64 $((SEED + 1))
mode; CL c32-a 1 32 160 32 1024 256 $((SEED + 2))
mode nosample; CL c32-nosample 1 32 160 32 1024 256 $((SEED + 3))
mode gcoff-api; CL c32-gcoff-api 1 32 160 32 1024 256 $((SEED + 4))
mode gcoff-api gcoff-core; CL c32-gcoff-all 1 32 160 32 1024 256 $((SEED + 5))
mode; CL c32-b 1 32 160 32 1024 256 $((SEED + 6))
pack
mode; CL p128 1 32 160 32 128 256 $((SEED + 7))
mode gcoff-api gcoff-core; CL p128-gcoff-all 1 32 160 32 128 256 $((SEED + 8))
mode; CL c128 1 128 256 128 1024 256 $((SEED + 9))
mode gcoff-api gcoff-core; CL c128-gcoff-all 1 128 256 128 1024 256 $((SEED + 10))
mode; rm -f $R/st/on; sleep 1
kill $srv 2>/dev/null; for j in $(seq 1 15); do kill -0 $srv 2>/dev/null || break; sleep 1; done
T end; pack; ls -la $OUT
