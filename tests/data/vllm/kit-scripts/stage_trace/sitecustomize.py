"""Run 19 (issue 13): where a request waits on its way to its first token, inside real vLLM 0.24.

Imported at every interpreter start when this folder is on PYTHONPATH and KP_STAGE_DIR is set (the API server,
the EngineCore and any other child). It wraps a few of vLLM's own functions after their modules load and stamps
each call with time.time() and time.monotonic() (both system-wide clocks, so the API server's and the EngineCore's
stamps share a time line), nothing else changed:

API server  create_completion entry (the client's X-Request-Id), render_completion_request exit (tokenized),
            AsyncLLM.add_request entry, AsyncLLM._add_request entry/exit (sent to the EngineCore, internal id),
            every EngineCoreOutputs decoded from the EngineCore (its own monotonic stamp, the first outputs of
            requests), OutputProcessor.process_outputs (how long each chunk took), and an event-loop lag probe.
EngineCore  preprocess_add_request (the input thread got the request), add_request (the busy loop took it),
            Scheduler.schedule exit (tokens, running, the new requests), update_from_output exit (first tokens).

Records are kept only while KP_STAGE_DIR/on exists (a thread looks every 0.2 s), and written every 0.5 s to
KP_STAGE_DIR/trace-<pid>.jsonl, one JSON array per record: [kind, wall, mono, ...].

Run 26: inside a render too: the renderer's render_cmpl_async entered, the tokenization submitted to its worker
thread and back on the loop (BaseRenderer._tokenize_prompt_async), and the worker thread's encode start and end.

Run 27: what the API server's loop does while a wave waits. Every process stamps each garbage collection
(gc.callbacks: ["gc", wall, mono, generation, seconds, collected]). The API server's process samples its loop
thread's Python stack every millisecond from a thread of its own while KP_STAGE_DIR/nosample is absent
(["smp", wall, mono, stack id]; each new stack once as ["stack", wall, mono, id, [innermost frame first, as
file:function:line]]); a sample is taken when the sampler gets the interpreter lock, so one taken while the loop
runs Python comes at the lock's switch interval. While KP_STAGE_DIR/gcoff-api (gcoff-core) exists, the API server
(the EngineCore) runs with the collector off (gc.disable), stamped as ["gcmode", wall, mono, enabled].

Run 25: while KP_STAGE_DIR/switch holds a number of microseconds, the API server's process (the one that has
loaded the completion handler) runs with that interpreter switch interval (sys.setswitchinterval; Python's
default 5,000 µs), stamped as ["switch", wall, mono, seconds] when it changes."""

import gc
import importlib.abc
import json
import os
import sys
import threading
import time

_DIR = os.environ.get("KP_STAGE_DIR")

if _DIR:
    _buf: list = []
    _state = {"on": False}

    def rec(*fields):
        if _state["on"]:
            _buf.append((fields[0], time.time(), time.monotonic(), *fields[1:]))

    def _flusher():
        path = os.path.join(_DIR, f"trace-{os.getpid()}.jsonl")
        flag = os.path.join(_DIR, "on")
        switch = os.path.join(_DIR, "switch")
        default = sys.getswitchinterval()
        k = 0
        while True:
            time.sleep(0.2)
            _state["on"] = os.path.exists(flag)
            if "vllm.entrypoints.openai.completion.serving" in sys.modules:  # the API server's process only
                try:
                    with open(switch) as f:
                        want = float(f.read().strip()) * 1e-6
                except (OSError, ValueError):
                    want = default
                if abs(sys.getswitchinterval() - want) > 1e-9:
                    sys.setswitchinterval(want)
                    rec("switch", sys.getswitchinterval())
            role = _role()
            if role:
                off = os.path.exists(os.path.join(_DIR, f"gcoff-{role}"))
                if off == gc.isenabled():
                    gc.disable() if off else gc.enable()
                    rec("gcmode", gc.isenabled())
                _sampling["on"] = role == "api" and _state["on"] and not os.path.exists(os.path.join(_DIR, "nosample"))
            k += 1
            if k % 3 == 0 and _buf:
                n = len(_buf)  # run 27: take what is there, keep what other threads append meanwhile
                out = _buf[:n]
                del _buf[:n]
                with open(path, "a") as f:
                    f.write("".join(json.dumps(r) + "\n" for r in out))

    def _role():
        if "vllm.entrypoints.openai.completion.serving" in sys.modules:
            return "api"
        if "vllm.v1.core.sched.scheduler" in sys.modules:
            return "core"
        return None

    # Run 27: every collection, in every process.
    _gc_t0 = {"v": 0.0}

    def _gc_cb(phase, info):
        if phase == "start":
            _gc_t0["v"] = time.perf_counter()
        elif _state["on"]:
            rec("gc", info.get("generation"), time.perf_counter() - _gc_t0["v"], info.get("collected"))

    gc.callbacks.append(_gc_cb)

    # Run 27: the API server's loop thread, sampled.
    _sampling = {"on": False, "started": False}

    def _sampler(ident):
        stacks: dict = {}
        while True:
            time.sleep(0.001)
            if not _sampling["on"]:
                continue
            frame = sys._current_frames().get(ident)
            names = []
            while frame is not None and len(names) < 24:
                code = frame.f_code
                names.append(f"{os.path.basename(code.co_filename)}:{code.co_name}:{frame.f_lineno}")
                frame = frame.f_back
            key = tuple(names)
            sid = stacks.get(key)
            if sid is None:
                sid = stacks[key] = len(stacks)
                rec("stack", sid, names)
            rec("smp", sid)

    def _start_sampler():
        if not _sampling["started"]:
            _sampling["started"] = True
            threading.Thread(target=_sampler, args=(threading.get_ident(),), daemon=True, name="kp-stage-sampler").start()

    def _start():
        threading.Thread(target=_flusher, daemon=True, name="kp-stage-flush").start()

    _start()
    os.register_at_fork(after_in_child=lambda: (_buf.clear(), _start()))

    def _wrap_async(cls, name, before=None, after=None):
        orig = getattr(cls, name)

        async def wrapper(*a, **kw):
            if before:
                before(*a, **kw)
            res = await orig(*a, **kw)
            if after:
                after(res, *a, **kw)
            return res

        wrapper.__wrapped__ = orig
        setattr(cls, name, wrapper)

    def _wrap(cls, name, before=None, after=None):
        orig = getattr(cls, name)

        def wrapper(*a, **kw):
            if before:
                before(*a, **kw)
            res = orig(*a, **kw)
            if after:
                after(res, *a, **kw)
            return res

        wrapper.__wrapped__ = orig
        setattr(cls, name, wrapper)

    # ---- API server ------------------------------------------------------------------------------------------
    import contextvars

    _hdr = contextvars.ContextVar("kp_hdr", default=None)
    _lag_started = {"v": False}

    async def _lag_probe():
        import asyncio

        period = 0.0005
        while True:
            t0 = time.perf_counter()
            await asyncio.sleep(period)
            lag = time.perf_counter() - t0 - period
            if lag > 0.001:
                rec("lag", lag)

    def _patch_completion(mod):
        cls = mod.OpenAIServingCompletion

        def before(self, request, raw_request=None):
            h = raw_request.headers.get("X-Request-Id") if raw_request is not None else None
            _hdr.set(h)
            rec("http", h)
            _start_sampler()  # run 27: from the loop's thread, which it samples
            if not _lag_started["v"]:
                import asyncio

                _lag_started["v"] = True
                asyncio.get_running_loop().create_task(_lag_probe())

        _wrap_async(cls, "create_completion", before=before)
        _wrap_async(cls, "render_completion_request", after=lambda res, *a, **kw: rec("rendered", _hdr.get()))

    def _patch_async_llm(mod):
        cls = mod.AsyncLLM
        _wrap_async(cls, "add_request", before=lambda self, request_id, *a, **kw: rec("add", request_id))
        _wrap_async(
            cls,
            "_add_request",
            before=lambda self, request, *a, **kw: rec("send", request.request_id),
            after=lambda res, self, request, *a, **kw: rec("sent", request.request_id),
        )

    _seen_api: set = set()

    def _patch_serial(mod):
        cls = mod.MsgpackDecoder
        orig = cls.decode

        def decode(self, bufs):
            res = orig(self, bufs)
            outs = getattr(res, "outputs", None)
            if _state["on"] and outs and hasattr(res, "timestamp"):
                first = []
                for o in outs:
                    rid = o.request_id
                    if rid not in _seen_api:
                        _seen_api.add(rid)
                        first.append(rid)
                rec("recv", res.timestamp, len(outs), first)
            return res

        cls.decode = decode

    def _patch_output_processor(mod):
        cls = mod.OutputProcessor
        orig = cls.process_outputs

        def process_outputs(self, engine_core_outputs, *a, **kw):
            t0 = time.perf_counter()
            res = orig(self, engine_core_outputs, *a, **kw)
            rec("proc", len(engine_core_outputs), time.perf_counter() - t0)
            return res

        cls.process_outputs = process_outputs

    def _patch_renderer(mod):
        # Run 26: inside a render. The renderer tokenizes in its one worker thread (run_in_executor, which does not
        # carry the request's context), so the thread's stamps carry no id: they pair with the submits in order.
        cls = mod.BaseRenderer
        _wrap(cls, "_encode", before=lambda *a, **kw: rec("enc0", threading.current_thread().name), after=lambda *a, **kw: rec("enc1", threading.current_thread().name))
        _wrap_async(
            cls,
            "_tokenize_prompt_async",
            before=lambda *a, **kw: rec("tok_submit", _hdr.get()),
            after=lambda *a, **kw: rec("tok_back", _hdr.get()),
        )
        _wrap_async(cls, "render_cmpl_async", before=lambda *a, **kw: rec("rcmpl", _hdr.get()))

    # ---- EngineCore ------------------------------------------------------------------------------------------
    _seen_core: set = set()

    def _patch_core(mod):
        _wrap(mod.EngineCoreProc, "preprocess_add_request", before=lambda self, request: rec("core_in", request.request_id))
        _wrap(mod.EngineCore, "add_request", before=lambda self, request, *a, **kw: rec("core_add", request.request_id))

    def _patch_scheduler(mod):
        cls = mod.Scheduler

        def after_schedule(out, self, *a, **kw):
            rec("sched", out.total_num_scheduled_tokens, len(out.num_scheduled_tokens), [r.req_id for r in out.scheduled_new_reqs])

        def after_update(res, self, *a, **kw):
            if not _state["on"]:
                return
            first = []
            for eco in res.values():
                for o in eco.outputs:
                    if o.new_token_ids and o.request_id not in _seen_core:
                        _seen_core.add(o.request_id)
                        first.append(o.request_id)
            rec("update", first)

        _wrap(cls, "schedule", after=after_schedule)
        _wrap(cls, "update_from_output", after=after_update)

    _TARGETS = {
        "vllm.entrypoints.openai.completion.serving": _patch_completion,
        "vllm.v1.engine.async_llm": _patch_async_llm,
        "vllm.v1.serial_utils": _patch_serial,
        "vllm.v1.engine.output_processor": _patch_output_processor,
        "vllm.renderers.base": _patch_renderer,
        "vllm.v1.engine.core": _patch_core,
        "vllm.v1.core.sched.scheduler": _patch_scheduler,
    }

    class _Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            patch = _TARGETS.get(name)
            if patch is None:
                return None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
            else:
                return None
            orig_exec = spec.loader.exec_module

            def exec_module(module):
                orig_exec(module)
                try:
                    patch(module)
                    sys.stderr.write(f"[kp-stage] patched {name} in pid {os.getpid()}\n")
                except Exception as e:  # a missed patch shows in the log, vLLM runs on
                    sys.stderr.write(f"[kp-stage] could not patch {name}: {e!r}\n")

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _Finder())
