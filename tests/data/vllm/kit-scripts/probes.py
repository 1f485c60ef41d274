"""API probes against a running vLLM: /tokenize, context-limit behaviour, error bodies."""

import http.client, json, sys

M = "Llama-3.1-8B-Instruct"


def post(path, payload, raw=None):
    c = http.client.HTTPConnection("127.0.0.1", 8000, timeout=120)
    c.request("POST", path, body=raw if raw is not None else json.dumps(payload), headers={"content-type": "application/json"})
    r = c.getresponse()
    b = r.read().decode()
    return r.status, b


def get(path):
    c = http.client.HTTPConnection("127.0.0.1", 8000, timeout=60)
    c.request("GET", path)
    r = c.getresponse()
    return r.status, r.read().decode()


ids = lambda n: [1000 + (i * 7919) % 100000 for i in range(n)]
words = lambda n: " ".join(["the", "of", "and", "to", "in"][i % 5] for i in range(n))
probes = [
    ("tokenize completion text", "/tokenize", {"model": M, "prompt": "the of and"}),
    ("tokenize completion text no special", "/tokenize", {"model": M, "prompt": "the of and", "add_special_tokens": False}),
    ("tokenize chat", "/tokenize", {"model": M, "messages": [{"role": "user", "content": "the of"}]}),
    (
        "tokenize chat 2 messages",
        "/tokenize",
        {"model": M, "messages": [{"role": "system", "content": "the"}, {"role": "user", "content": "the of"}]},
    ),
    (
        "tokenize chat add_generation_prompt false",
        "/tokenize",
        {"model": M, "messages": [{"role": "user", "content": "the of"}], "add_generation_prompt": False},
    ),
    ("tokenize unknown model", "/tokenize", {"model": "nope", "prompt": "x"}),
    ("detokenize", "/detokenize", {"model": M, "tokens": [1000, 1001]}),
    (
        "completion 4000 ids max_tokens 256 (clamp?)",
        "/v1/completions",
        {"model": M, "prompt": ids(4000), "max_tokens": 256, "ignore_eos": True},
    ),
    ("completion 4095 ids max_tokens 16", "/v1/completions", {"model": M, "prompt": ids(4095), "max_tokens": 16, "ignore_eos": True}),
    ("completion 4096 ids max_tokens 16", "/v1/completions", {"model": M, "prompt": ids(4096), "max_tokens": 16, "ignore_eos": True}),
    ("completion 4097 ids max_tokens 16", "/v1/completions", {"model": M, "prompt": ids(4097), "max_tokens": 16}),
    ("completion 4000 ids no max_tokens", "/v1/completions", {"model": M, "prompt": ids(4000), "ignore_eos": True}),
    ("completion 10 ids max_tokens 5000", "/v1/completions", {"model": M, "prompt": ids(10), "max_tokens": 5000, "ignore_eos": True}),
    (
        "chat 4000 words max_tokens 256 (clamp?)",
        "/v1/chat/completions",
        {"model": M, "messages": [{"role": "user", "content": words(4000)}], "max_tokens": 256, "ignore_eos": True},
    ),
    (
        "chat 4070 words max_tokens 16",
        "/v1/chat/completions",
        {"model": M, "messages": [{"role": "user", "content": words(4070)}], "max_tokens": 16, "ignore_eos": True},
    ),
    ("chat 4100 words", "/v1/chat/completions", {"model": M, "messages": [{"role": "user", "content": words(4100)}], "max_tokens": 16}),
    (
        "chat no max_tokens short",
        "/v1/chat/completions",
        {"model": M, "messages": [{"role": "user", "content": "the of"}], "max_completion_tokens": 3, "ignore_eos": True},
    ),
    (
        "stream_options without stream",
        "/v1/completions",
        {"model": M, "prompt": "x", "max_tokens": 3, "stream_options": {"include_usage": True}},
    ),
    ("n=2", "/v1/completions", {"model": M, "prompt": "x", "max_tokens": 3, "n": 2}),
    ("max_tokens 0", "/v1/completions", {"model": M, "prompt": "x", "max_tokens": 0}),
    ("max_tokens -1", "/v1/completions", {"model": M, "prompt": "x", "max_tokens": -1}),
    ("missing prompt", "/v1/completions", {"model": M, "max_tokens": 3}),
    ("chat empty messages", "/v1/chat/completions", {"model": M, "messages": [], "max_tokens": 3}),
]
out = open(sys.argv[1], "w")
for name, path, payload in probes:
    try:
        s, b = post(path, payload)
    except Exception as e:  # noqa
        s, b = -1, repr(e)
    if len(b) > 1500:
        b = b[:1500] + "...(cut)"
    shown = {k: (f"<{len(v)} items>" if isinstance(v, list) and len(v) > 20 else v) for k, v in payload.items()}
    if "messages" in shown:
        shown["messages"] = [
            {**m, "content": (m["content"] if len(m["content"]) < 40 else f"<{len(m['content'].split())} words>")}
            for m in payload["messages"]
        ]
    out.write(f"## {name}\nPOST {path} {json.dumps(shown)}\nHTTP {s}\n{b}\n\n")
s, b = post("/v1/completions", None, raw="{not json")
out.write(f"## bad json\nPOST /v1/completions {{not json\nHTTP {s}\n{b}\n\n")
for p in ("/v1/models", "/version", "/nope"):
    s, b = get(p)
    out.write(f"## GET {p}\nHTTP {s}\n{b[:1500]}\n\n")
out.close()
