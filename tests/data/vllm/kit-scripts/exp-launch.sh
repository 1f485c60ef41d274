# Run 39 (issue 13): is the lone prefill's slower launch on the H200 machine (runs 20-21: 10.3-10.8 ms, runs 33 and 38
# on H100 machines: 6.3-7.2 ms) the machine's or the day's? The host's launch costs (launch_probe.py, unpinned, and run
# 13's per-CPU host_probe.py) before and after the engines, and run 38's experiment (exp-lone-waves.sh) on the engines
# given as arguments (run 39: r39:engine-args-1b.txt r39b:engine-args-realfit.txt r39c:engine-args-8b-fp8.txt).
set -u
S=$(cd "$(dirname "$0")" && pwd)
K=$PWD/.device-kit/scripts
. /tmp/k/device-setup.sh 2>/dev/null || . $K/device-setup.sh
P=/tmp/probe; mkdir -p $P
probe() {  # probe TAG
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv > $P/gpu-$1.txt 2>&1
  lscpu > $P/lscpu-$1.txt 2>&1
  timeout 60 python3 $S/launch_probe.py > $P/launch-$1.jsonl 2> $P/launch-$1.err
  timeout 90 python3 $S/host_probe.py > $P/host-$1.jsonl 2> $P/host-$1.err
  tar czf $OUT/probe-results.tgz -C /tmp probe
}
probe before
bash $S/exp-lone-waves.sh "$@"
probe after
ls -la $OUT
