"""The OpenAI-compatible API of a real `tandem serve`, driven by the official
`openai` client (and raw HTTP where the client would hide the bytes)."""
import asyncio
import http.client
import json
import os
import signal
import socket
import subprocess
import time

import openai
import pytest

from conftest import BIN, MODEL, SERVED_NAME, Server

PROMPT = "The capital of France is"
# SmolLM2-135M answers this form with "The capital of France is Paris." by a
# margin (1.6 nats at the first token with 8-bit activations); "What is the
# capital of France?" was a near tie (0.08 nats in float32) that 8-bit
# activations tip to "L'Etoile, ...".
CHAT = [{"role": "user", "content": "Name the capital of France."}]


def raw_request(server, method, path, body=None, headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    data = body if isinstance(body, (bytes, type(None))) else body.encode()
    conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
    resp = conn.getresponse()
    payload = resp.read()
    conn.close()
    return resp.status, resp.getheaders(), payload


def wait_for(predicate, seconds=15):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def ready(server):
    """Whether /ready answers 200 (a refused connection counts as not ready)."""
    try:
        return raw_request(server, "GET", "/ready")[0] == 200
    except OSError:
        return False


def test_health_ready_models(server, client):
    assert raw_request(server, "GET", "/health")[0] == 200
    status, _, body = raw_request(server, "GET", "/ready")
    assert status == 200 and json.loads(body)["ready"] is True
    models = client.models.list()
    assert [m.id for m in models.data] == [SERVED_NAME]


def test_completion(server, client):
    r = client.completions.create(model=SERVED_NAME, prompt=PROMPT, max_tokens=8, temperature=0)
    assert r.object == "text_completion"
    assert "Paris" in r.choices[0].text
    assert r.choices[0].finish_reason in ("length", "stop")
    assert r.usage.prompt_tokens == 5
    assert 1 <= r.usage.completion_tokens <= 8
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_streamed_completion_equals_whole(client):
    whole = client.completions.create(model=SERVED_NAME, prompt=PROMPT, max_tokens=12, temperature=0,
                                   extra_body={"ignore_eos": True})
    chunks = list(client.completions.create(model=SERVED_NAME, prompt=PROMPT, max_tokens=12, temperature=0,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert whole.usage.completion_tokens == 12


def test_chat(client):
    r = client.chat.completions.create(model=SERVED_NAME, messages=CHAT, max_tokens=24, temperature=0)
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert "Paris" in r.choices[0].message.content
    stream = client.chat.completions.create(model=SERVED_NAME, messages=CHAT, max_tokens=24, temperature=0,
                                            stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    content = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert content == r.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == r.choices[0].finish_reason


def test_sse_framing_byte_for_byte(server):
    body = json.dumps({"model": SERVED_NAME, "prompt": PROMPT, "max_tokens": 5, "temperature": 0,
                       "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}})
    status, headers, payload = raw_request(server, "POST", "/v1/completions", body)
    assert status == 200
    assert dict(headers)["Content-Type"] == "text/event-stream"
    text = payload.decode()
    events = text.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    rebuilt = ""
    for event in events[:-2]:
        assert event.startswith("data: ") and "\n" not in event
        obj = json.loads(event[len("data: "):])
        rebuilt += "data: " + json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n\n"
        assert obj["object"] == "text_completion" and obj["model"] == SERVED_NAME
    rebuilt += "data: [DONE]\n\n"
    assert rebuilt == text  # no stray whitespace, fields sorted, one line per event
    usage = json.loads(events[-3][len("data: "):])["usage"]
    assert usage == {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10}


def test_stop_string_is_held_back_and_ends_the_request(server, client):
    full = client.completions.create(model=SERVED_NAME, prompt=PROMPT, max_tokens=24, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    stop = full[len(full) // 2:len(full) // 2 + 3]
    expected = full[:full.index(stop)]
    r = client.completions.create(model=SERVED_NAME, prompt=PROMPT, max_tokens=24, temperature=0, stop=[stop],
                                  extra_body={"ignore_eos": True})
    assert r.choices[0].text == expected
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens < 24
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=SERVED_NAME, prompt=PROMPT, max_tokens=24, temperature=0, stop=stop, stream=True,
        extra_body={"ignore_eos": True}))
    assert streamed == expected
    assert wait_for(lambda: server.metric("tandem:num_requests_running") == 0)


def test_n_seed_and_sampling_parameters(client):
    kwargs = dict(model=SERVED_NAME, prompt="Once upon a time", max_tokens=10, temperature=1.0, top_p=0.9,
                  n=3, seed=1234, presence_penalty=0.5, frequency_penalty=0.5,
                  extra_body={"top_k": 50, "min_p": 0.05, "repetition_penalty": 1.1, "min_tokens": 4})
    a = client.completions.create(**kwargs)
    b = client.completions.create(**kwargs)
    assert sorted(c.index for c in a.choices) == [0, 1, 2]
    assert [c.text for c in a.choices] == [c.text for c in b.choices]  # a seed reproduces
    assert len({c.text for c in a.choices}) > 1  # and the choices differ
    assert a.usage.completion_tokens >= 12


def test_best_of_returns_the_best_candidates_by_cumulative_logprob(client):
    # best_of candidates get seeds seed, seed+1, ...: the same as n=best_of with that seed.
    kwargs = dict(model=SERVED_NAME, prompt="Once upon a time", max_tokens=8, temperature=1.0, seed=77,
                  extra_body={"ignore_eos": True})
    best = client.completions.create(n=2, best_of=5, **kwargs)
    every = client.completions.create(n=5, logprobs=0, **kwargs)
    ranked = sorted(every.choices, key=lambda c: sum(c.logprobs.token_logprobs), reverse=True)
    assert len({c.text for c in every.choices}) > 2  # the ranking means something
    assert [c.text for c in best.choices] == [c.text for c in ranked[:2]]
    assert [c.index for c in best.choices] == [0, 1]
    assert all(c.logprobs is None for c in best.choices)  # asked internally, not returned
    assert best.usage.completion_tokens == 5 * 8  # every candidate's tokens, as OpenAI bills best_of


def test_logprobs(client):
    r = client.completions.create(model=SERVED_NAME, prompt=PROMPT, max_tokens=6, temperature=0, logprobs=3,
                                  extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6
    assert "".join(lp.tokens) == r.choices[0].text
    for logprob, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert logprob <= 0 and len(top) == 3
        assert abs(max(top.values()) - logprob) < 1e-4  # greedy: the sampled token is the top one
    chat = client.chat.completions.create(model=SERVED_NAME, messages=CHAT, max_tokens=4, temperature=0,
                                          logprobs=True, top_logprobs=2)
    content = chat.choices[0].logprobs.content
    assert len(content) >= 1 and all(len(c.top_logprobs) == 2 for c in content)


def _streamed_pieces(client, chat, **kwargs):
    """(text, logprobs entries) of each streamed chunk."""
    pieces = []
    if chat:
        for chunk in client.chat.completions.create(stream=True, **kwargs):
            for c in chunk.choices:
                entries = list(c.logprobs.content) if c.logprobs and c.logprobs.content else []
                pieces.append((c.delta.content or "", entries))
    else:
        for chunk in client.completions.create(stream=True, **kwargs):
            for c in chunk.choices:
                lp = c.logprobs
                entries = list(zip(lp.tokens, lp.token_logprobs, lp.text_offset)) if lp else []
                pieces.append((c.text, entries))
    return pieces


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("prompt,stop", [
    ("Emoji party: \U0001F389\U0001F389 \U0001F389", None),  # each emoji is 3 tokens
    ("In Japanese, hello is", ["(O"]),  # non-ASCII, then a stop string cut out of the middle
])
def test_streamed_logprobs_travel_with_their_text(client, chat, prompt, stop):
    common = dict(model=SERVED_NAME, max_tokens=20, temperature=0, stop=stop, extra_body={"ignore_eos": True})
    if chat:
        common.update(messages=[{"role": "user", "content": prompt}], logprobs=True, top_logprobs=0)
    else:
        common.update(prompt=prompt, logprobs=0)
    pieces = _streamed_pieces(client, chat, **common)
    whole = (client.chat.completions if chat else client.completions).create(**common).choices[0]
    # Byte-level tokens: a chunk's tokens are exactly its text (a character split over tokens goes
    # with its last one). Completions' token strings lose a split character's bytes to U+FFFD, so
    # there each chunk's first text_offset must be where its text starts. The last chunk may carry
    # a token the stop string cut into (its text before the cut went earlier) or one max_tokens cut
    # mid-character (U+FFFD); tokens wholly inside the stop string are dropped.
    sent = b""
    for i, (text, entries) in enumerate(pieces):
        if i + 1 < len(pieces) and chat:
            assert b"".join(bytes(e.bytes) for e in entries).decode("utf-8") == text, pieces
        elif i + 1 < len(pieces) and entries:
            assert entries[0][2] == len(sent), pieces
        sent += text.encode()
    assert sent.decode() == (whole.message.content if chat else whole.text)
    if chat:
        streamed = [(bytes(e.bytes), e.logprob) for _, entries in pieces for e in entries]
        assert streamed == [(bytes(e.bytes), e.logprob) for e in whole.logprobs.content]
    else:
        streamed = [e for _, entries in pieces for e in entries]
        lp = whole.logprobs
        assert streamed == list(zip(lp.tokens, lp.token_logprobs, lp.text_offset))
    assert sum(1 for text, entries in pieces if text and len(entries) > 1) >= (0 if stop else 3)  # held back


@pytest.mark.parametrize("path,body,status,param", [
    ("/v1/completions", "{not json", 400, None),
    ("/v1/completions", '["a list"]', 400, None),
    ("/v1/completions", '{"prompt": 5}', 400, "prompt"),
    ("/v1/completions", '{"prompt": "x", "max_tokens": "ten"}', 400, "max_tokens"),
    ("/v1/completions", '{"prompt": "x", "max_tokens": -1}', 400, "max_tokens"),
    ("/v1/completions", '{"prompt": "x", "temperature": -1}', 400, "temperature"),
    ("/v1/completions", '{"prompt": "x", "top_p": 7}', 400, "top_p"),
    ("/v1/completions", '{"prompt": "x", "n": 100000}', 400, "n"),
    ("/v1/completions", '{"prompt": "x", "logprobs": 1000}', 400, "logprobs"),
    ("/v1/completions", '{"prompt": "x", "max_tokens": 1000000000}', 400, "max_tokens"),
    ("/v1/completions", '{"prompt": [99999999]}', 400, "prompt"),
    ("/v1/completions", '{"prompt": "x", "model": "gpt-4"}', 404, "model"),
    ("/v1/completions", '{"prompt": "x", "echo": true, "stream": true}', 400, "echo"),
    ("/v1/chat/completions", '{"messages": "hi"}', 400, "messages"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": 3}]}', 400, "messages"),
    ("/v1/chat/completions", '{"messages": [{"role": "wizard", "content": "x"}]}', 400, "messages"),
    ("/v1/nothing", "{}", 404, None),
])
def test_bad_input_gets_an_error_object(server, path, body, status, param):
    got, _, payload = raw_request(server, "POST", path, body)
    assert got == status, payload
    error = json.loads(payload)["error"]
    assert error["message"] and error["code"] == status
    assert error["param"] == param


def test_prompt_longer_than_the_context(server, client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=SERVED_NAME, prompt="hello " * 9000, max_tokens=4)
    assert "maximum context length" in str(e.value)


def test_oversized_body_is_413(server):
    got, _, payload = raw_request(server, "POST", "/v1/completions", b'{"prompt": "' + b"a" * (9 << 20) + b'"}')
    assert got == 413
    assert json.loads(payload)["error"]["code"] == 413


def test_wrong_method_is_405(server):
    assert raw_request(server, "GET", "/v1/completions")[0] == 405


def test_a_client_that_disconnects_frees_its_blocks(server):
    sock = socket.create_connection(("127.0.0.1", server.port))
    body = json.dumps({"prompt": PROMPT, "max_tokens": 2000, "ignore_eos": True, "stream": True})
    sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n{body}".encode())
    received = b""
    while received.count(b"data: ") < 3:
        received += sock.recv(4096)
    assert server.metric("tandem:kv_cache_usage_perc") > 0
    aborted = server.metric('tandem:request_success_total{model_name="%s",finished_reason="abort"}' % SERVED_NAME)
    sock.close()
    assert wait_for(lambda: server.metric("tandem:kv_cache_usage_perc") == 0
                    and server.metric("tandem:num_requests_running") == 0), server.metrics()
    assert server.metric('tandem:request_success_total{model_name="%s",finished_reason="abort"}' % SERVED_NAME) \
        == aborted + 1


def test_metrics_have_vllm_names(server, client):
    client.completions.create(model=SERVED_NAME, prompt=PROMPT, max_tokens=3)
    text = server.metrics()
    for name in ["tandem:num_requests_running", "tandem:num_requests_waiting", "tandem:kv_cache_usage_perc",
                 "tandem:prefix_cache_queries_total", "tandem:prefix_cache_hits_total",
                 "tandem:num_preemptions_total", "tandem:request_success_total",
                 "tandem:time_to_first_token_seconds_bucket", "tandem:inter_token_latency_seconds_bucket",
                 "tandem:e2e_request_latency_seconds_bucket", "tandem:request_queue_time_seconds_bucket",
                 "tandem:scheduler_step_duration_seconds_bucket", "tandem:worker_idle_seconds_total",
                 "tandem:wasted_rows_total"]:
        assert name in text, name
    # Histograms carry model_name as well, which vLLM's dashboards filter on.
    assert server.metric('tandem:time_to_first_token_seconds_count{model_name="%s"}' % SERVED_NAME) >= 1
    assert server.metric("tandem:prefix_cache_queries_total") > 0


def test_200_concurrent_streams(server):
    async def main():
        aclient = openai.AsyncOpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0, timeout=300)

        async def one(i):
            stream = await aclient.completions.create(model=SERVED_NAME, prompt=f"Count to {i}:", max_tokens=4,
                                                      temperature=0, stream=True, extra_body={"ignore_eos": True})
            text, finish = "", None
            async for chunk in stream:
                text += chunk.choices[0].text
                finish = chunk.choices[0].finish_reason or finish
            return finish

        results = await asyncio.gather(*(one(i) for i in range(200)), return_exceptions=True)
        await aclient.close()
        return results

    results = asyncio.run(main())
    errors = [r for r in results if isinstance(r, Exception)]
    assert not errors, errors[:3]
    assert results == ["length"] * 200
    assert wait_for(lambda: server.metric("tandem:kv_cache_usage_perc") == 0)


def test_tandem_bench_against_the_server(server, tmp_path):
    result = tmp_path / "bench.json"
    out = subprocess.run([os.path.join(BIN, "tandem"), "bench", "--base-url", server.base, "--tokenizer", MODEL,
                          "--num-prompts", "12", "--random-input-len", "16", "--random-output-len", "8",
                          "--ignore-eos", "--max-concurrency", "4", "--result-file", str(result),
                          "--disable-progress-bar"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    figures = json.loads(result.read_text())
    assert figures["completed"] == 12
    assert figures["total_output_tokens"] == 12 * 8
    assert figures["mean_ttft_ms"] > 0 and figures["output_throughput"] > 0


def test_api_key(tmp_path):
    if not os.path.exists(MODEL):
        pytest.skip("model missing")
    s = Server(extra_args=["--api-key", "sekret"], log_name="serve_key.log", tmp_path=str(tmp_path))
    try:
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=s.base + "/v1", api_key="wrong", max_retries=0).models.list()
        ok = openai.OpenAI(base_url=s.base + "/v1", api_key="sekret", max_retries=0)
        assert ok.completions.create(model=SERVED_NAME, prompt=PROMPT, max_tokens=2).usage.completion_tokens >= 1
        assert raw_request(s, "GET", "/health")[0] == 200  # liveness needs no key
    finally:
        s.stop()


def test_sigterm_drains_requests_in_flight(tmp_path):
    if not os.path.exists(MODEL):
        pytest.skip("model missing")
    s = Server(log_name="serve_drain.log", tmp_path=str(tmp_path))
    try:
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
        conn.request("POST", "/v1/completions", body=json.dumps(
            {"prompt": PROMPT, "max_tokens": 48, "ignore_eos": True, "stream": True,
             "stream_options": {"include_usage": True}}), headers={"Content-Type": "application/json"})
        stream = conn.getresponse()
        assert stream.readline().startswith(b"data: {")
        s.proc.send_signal(signal.SIGTERM)
        # Once /ready says the server drains (503, or the listener is closed)...
        assert wait_for(lambda: not ready(s))
        # ...new requests are refused (503 on an open connection, or no connection at all)...
        try:
            status = raw_request(s, "POST", "/v1/completions", json.dumps({"prompt": "x", "max_tokens": 1}))[0]
        except OSError:
            status = None
        assert status in (503, None)
        # ...while the one in flight runs to its end.
        events = [e for e in stream.read().decode().split("\n\n") if e]
        assert events[-1] == "data: [DONE]"
        usage = json.loads(events[-2][len("data: "):])["usage"]
        assert usage["completion_tokens"] == 48
        assert s.proc.wait(timeout=30) == 0, s.logs()
        assert "draining" in s.logs()
    finally:
        s.stop()


def test_kv_cache_dtype_float32_holds_half_the_blocks(server, tmp_path):
    """--kv-cache-dtype reaches the workers: a float32 cache of the same
    --kv-cache-memory holds half as many blocks as the default half-float one,
    and serves."""
    s = Server(extra_args=["--kv-cache-dtype", "float32"], log_name="serve_f32.log", tmp_path=str(tmp_path))
    try:
        # Both pools hold floor(budget / bytes per block) blocks but the null one.
        half, single = server.metric("tandem:kv_cache_blocks") + 1, s.metric("tandem:kv_cache_blocks") + 1
        assert half == 2 * single, (half, single)
        c = openai.OpenAI(base_url=s.base + "/v1", api_key="unused", max_retries=0, timeout=120)
        out = c.completions.create(model=SERVED_NAME, prompt=PROMPT, max_tokens=8, temperature=0)
        assert out.usage.completion_tokens == 8 or out.choices[0].finish_reason == "stop"
        assert out.choices[0].text
    finally:
        s.stop()
    assert s.proc.returncode == 0, s.logs()
