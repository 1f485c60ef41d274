"""Samples, every 0.25 s until killed, where vLLM's processes run and how busy each CPU is (run 13): for each watched
process, every thread's CPU (the `processor` field of /proc/<pid>/task/<tid>/stat) and CPU time; for each CPU, the
share busy and stolen by the hypervisor since the last sample. Usage: host_sampler.py OUT.jsonl NAME=PID ..."""

import json
import os
import sys
import time

HZ = os.sysconf("SC_CLK_TCK")


def threads(pid: int) -> list[dict]:
    rows = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return rows
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                raw = f.read()
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                comm = f.read().strip()
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2 :].split()
        # fields[0] is field 3 (state): utime 14, stime 15, processor 39
        rows.append({"tid": int(tid), "comm": comm, "cpu": int(fields[36]), "ticks": int(fields[11]) + int(fields[12])})
    return rows


def cpu_times() -> dict[int, tuple[int, int, int]]:
    out = {}
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu") and line[3].isdigit():
                v = [int(x) for x in line.split()[1:]]
                idle = v[3] + v[4]
                out[int(line.split()[0][3:])] = (sum(v[:8]), idle, v[7])
    return out


def main() -> None:
    out = open(sys.argv[1], "a")
    procs = {name: int(pid) for name, pid in (a.split("=") for a in sys.argv[2:])}
    last_ticks: dict[int, int] = {}
    last_cpu = cpu_times()
    while True:
        time.sleep(0.25)
        now = cpu_times()
        busy, steal = {}, {}
        for c, (tot, idle, st) in now.items():
            t0, i0, s0 = last_cpu.get(c, (tot, idle, st))
            d = max(tot - t0, 1)
            busy[c] = round(1 - (idle - i0) / d, 2)
            steal[c] = round((st - s0) / d, 2)
        last_cpu = now
        rec = {"t": round(time.time(), 2), "busy": busy, "steal": steal}
        for name, pid in procs.items():
            rows = []
            for th in threads(pid):
                dt = th["ticks"] - last_ticks.get(th["tid"], th["ticks"])
                last_ticks[th["tid"]] = th["ticks"]
                if dt or th["tid"] == pid:
                    rows.append([th["tid"], th["comm"], th["cpu"], round(dt / HZ / 0.25, 2)])
            rec[name] = rows
        out.write(json.dumps(rec) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
