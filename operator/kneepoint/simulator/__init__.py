"""The engine simulator behind ``kneepoint sim``: a vLLM-compatible server without a GPU.

Pure parts (standard library only, unit-tested without sockets or sleeping):
``perf_model`` (roofline step time per GPU type and interconnect), ``calibration``
(the fitted constants from ``kneepoint/data/simulator_calibration.json``), ``calibration_fit``
(how those constants were fitted to the H200 measurements), ``scheduler`` (continuous
batching, chunked prefill, KV blocks, preemption) and ``tokens`` (prompt token counting and
output words).
I/O parts: ``server`` (aiohttp HTTP API and the engine loop), ``vllm_metrics`` and
``dcgm_metrics`` (Prometheus exposition text), ``command`` (the click command).
"""
