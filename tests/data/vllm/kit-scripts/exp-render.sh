# Run 26 (issue 13): inside the 1B's renders. Runs 19 and 25: while the 1B streams, no prompt of a closed loop's
# wave is rendered before the wave's last handler has started, whatever the interpreter's switch interval. The
# stamps (stage_trace/sitecustomize.py) now split a render: the renderer entered (render_cmpl_async), the prompt
# submitted to the renderer's one worker thread, that thread's encode start and end, the coroutine back on the
# loop, then rendered. Same engine, client and prompts as runs 19 and 25 (engine-args-1b.txt).
set -u
S=$(cd "$(dirname "$0")" && pwd)
K=$PWD/.device-kit/scripts
. /tmp/k/device-setup.sh 2>/dev/null || . $K/device-setup.sh
RUN=r26 ARGS=engine-args-1b.txt SEED=2600; export KP_MODEL_NAME=Llama-3.2-1B-Instruct
R=/tmp/$RUN; mkdir -p $R/st; t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
T() { echo "$* at $(el) s epoch $(date +%s.%N | cut -c1-14)" | tee -a $R/timeline.txt; }
export PYTHONPATH=$PWD/operator:$PYTHONPATH
echo "checkout $(git rev-parse HEAD 2>/dev/null)" > $R/source.txt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $R/gpu.txt 2>&1
lscpu > $R/lscpu.txt 2>&1
pack() { tar czf $OUT/render-results.tgz -C /tmp $RUN; }
python3 $S/make_llama1b.py
KP_STAGE_DIR=$R/st PYTHONPATH=$S/stage_trace:$PYTHONPATH python3 -m vllm.entrypoints.cli.main serve $(cat $S/$ARGS) --load-format dummy > $R/serve-1b.log 2>&1 & srv=$!
up=0; for i in $(seq 1 360); do curl -sf http://127.0.0.1:8000/health >/dev/null 2>&1 && { up=1; break; }; kill -0 $srv 2>/dev/null || break; sleep 1; done
T "1b up=$up"; pack
[ $up = 1 ] || exit 0
CL() { n=$1; shift; T "start $n"; timeout 120 python3 $S/stage_client.py $R/cl-$n.json "$n" "$@" > $R/cl-$n.txt 2>&1; echo "rc=$?" >> $R/cl-$n.txt; T "client $n done $(head -c 200 $R/cl-$n.txt)"; }
CL warm 1 1 2 0 1024 16 $SEED
touch $R/st/on; sleep 0.5
CL c1 1 1 8 1 1024 64 $((SEED + 1))
CL c32-a 1 32 160 32 1024 256 $((SEED + 2))
CL p128 1 32 160 32 128 256 $((SEED + 3))
CL c32-nostream 0 32 160 32 1024 256 $((SEED + 4))
CL c32-b 1 32 160 32 1024 256 $((SEED + 5))
pack
CL c128 1 128 256 128 1024 256 $((SEED + 6))
rm -f $R/st/on; sleep 1
kill $srv 2>/dev/null; for j in $(seq 1 15); do kill -0 $srv 2>/dev/null || break; sleep 1; done
T end; pack; ls -la $OUT
