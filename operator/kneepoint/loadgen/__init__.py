"""kneepoint's load generator: fixed-concurrency (or Poisson) load on an OpenAI-compatible server.

Pure parts (no I/O, no aiohttp): ``statistics``, ``sse``, ``workload``, ``records``,
``resolve_rules``, ``summary``, ``table``, ``worker_plan``. I/O parts: ``http_client``
(aiohttp), ``runner`` (one process's share of the load), ``worker_pool`` (several processes),
``selfmonitor`` (CPU and event-loop lag), ``progress`` (TTY line), ``tokenizer_files``
(local tokenizer.json) and ``command`` (the click command ``kneepoint loadgen``).
"""
