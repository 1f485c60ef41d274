"""Run 16 (issue 13): a sampler inside vLLM's API server process. Imported at start-up when this folder is on
PYTHONPATH and KP_GIL_SAMPLE is set (popped at once, so the EngineCore and other children do not sample).
A thread sleeps 1 ms at a time: how late it wakes is how long it waited for the interpreter lock (plus timer
slack), the convoy a busy main thread makes for every other thread; after each wake it reads the main
thread's innermost frames (and, every 10th time, every other thread's innermost frame). Every 0.25 s one
JSON line to KP_GIL_OUT: the wake-up delays' quantiles and the frame counts."""

import collections
import json
import os
import sys
import threading
import time

if os.environ.pop("KP_GIL_SAMPLE", None):
    _out = os.environ.pop("KP_GIL_OUT", "/tmp/gil.jsonl")
    _main = threading.main_thread().ident

    def _frames(frame, depth):
        names = []
        while frame is not None and len(names) < depth:
            names.append(f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_code.co_name}")
            frame = frame.f_back
        return " < ".join(names)

    def _run():
        f = open(_out, "a")
        period = 0.001
        waits = []
        main = collections.Counter()
        others = collections.Counter()
        last = time.perf_counter()
        k = 0
        while True:
            t0 = time.perf_counter()
            time.sleep(period)
            t1 = time.perf_counter()
            waits.append(t1 - t0 - period)
            frames = sys._current_frames()
            fr = frames.get(_main)
            if fr is not None:
                main[_frames(fr, 4)] += 1
            k += 1
            if k % 10 == 0:
                names = {t.ident: t.name for t in threading.enumerate()}
                me = threading.get_ident()
                for ident, fr in frames.items():
                    if ident not in (_main, me):
                        others[f"{names.get(ident, ident)}: {_frames(fr, 2)}"] += 1
            if t1 - last >= 0.25:
                waits.sort()
                n = len(waits)
                row = {
                    "t": time.time(),
                    "n": n,
                    "waitMeanMs": sum(waits) / n * 1e3,
                    "waitP50Ms": waits[n // 2] * 1e3,
                    "waitP90Ms": waits[int(n * 0.9)] * 1e3,
                    "waitMaxMs": waits[-1] * 1e3,
                    "main": main.most_common(12),
                    "others": others.most_common(8),
                }
                f.write(json.dumps(row) + "\n")
                f.flush()
                waits, main, others, last = [], collections.Counter(), collections.Counter(), t1

    threading.Thread(target=_run, daemon=True, name="kp-gil-sampler").start()
