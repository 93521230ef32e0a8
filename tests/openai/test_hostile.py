"""Hostile input to a real `tandem serve`: every case gets its 4xx (a slow
sender gets 408 and a closed connection) and the server goes on serving the
others, including a stream that runs through all of them.

Raw sockets, since no well-behaved client sends these bytes."""
import json
import os
import socket
import threading
import time

import pytest

from conftest import MODEL, SERVED_NAME, Server

REQUEST_TIMEOUT = 1.0  # --http-request-timeout of this file's server


@pytest.fixture(scope="module")
def strict(tmp_path_factory):
    if not os.path.exists(MODEL):
        pytest.skip("model missing")
    s = Server(extra_args=["--http-request-timeout", str(REQUEST_TIMEOUT)], log_name="serve_hostile.log",
               tmp_path=str(tmp_path_factory.mktemp("hostile")))
    yield s
    assert s.proc.poll() is None, s.logs()
    s.stop()
    assert s.proc.returncode == 0, s.logs()


def connect(server):
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    return sock


def read_all(sock):
    """Everything until the server closes (EOF or a reset)."""
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk


def split_response(data):
    """(status, headers dict with lower-case names, body) of one whole response at the start of `data`,
    and the bytes after it."""
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    length = int(headers["content-length"])
    return status, headers, rest[:length], rest[length:]


def exchange(server, raw):
    """Sends `raw` on a new connection; the server's whole answer, until it closes."""
    with connect(server) as sock:
        sock.sendall(raw)
        return read_all(sock)


def http_post(path, body, extra_headers=""):
    if isinstance(body, str):
        body = body.encode()
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{extra_headers}"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body


def expect_error(data, status, message=None, param=None):
    got, headers, body, _ = split_response(data)
    assert got == status, data[:300]
    assert headers["content-type"] == "application/json"
    error = json.loads(body)["error"]
    assert error["code"] == status and error["message"]
    if message is not None:
        assert message in error["message"], error
    if param is not None:
        assert error["param"] == param, error


def completion_ok(server, max_tokens=3):
    data = exchange(server, http_post("/v1/completions", json.dumps(
        {"prompt": "The capital of France is", "max_tokens": max_tokens, "temperature": 0})))
    status, _, body, _ = split_response(data)
    assert status == 200, data[:300]
    return json.loads(body)


@pytest.fixture(scope="module")
def running_stream(strict):
    """A stream that runs while every hostile case is tried; it must finish whole."""
    sock = connect(strict)
    sock.sendall(http_post("/v1/completions", json.dumps(
        {"prompt": "Once upon a time", "max_tokens": 200, "ignore_eos": True, "temperature": 0, "stream": True,
         "stream_options": {"include_usage": True}})))
    received = b""
    while received.count(b"data: ") < 2:
        received += sock.recv(4096)
    yield sock, received
    sock.close()


CASES = {
    # The HTTP layer.
    "header over 16 KiB": (b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (20 << 10) + b"\r\n\r\n",
                           431, "headers are larger than 16384 bytes", None),
    "2,000 header fields": (b"GET /health HTTP/1.1\r\nHost: x\r\n"
                            + b"".join(b"X-%d: v\r\n" % i for i in range(2000)) + b"\r\n", 431, None, None),
    "URL over 16 KiB": (b"GET /" + b"u" * (20 << 10) + b" HTTP/1.1\r\nHost: x\r\n\r\n", 431, None, None),
    "chunked body over 8 MiB": (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                                + (b"100000\r\n" + b"a" * (1 << 20) + b"\r\n") * 9 + b"0\r\n\r\n",
                                413, None, None),
    "not HTTP": (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 100, 400, "malformed HTTP", None),
    "bad chunk size": (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                       b"zz\r\n{}\r\n0\r\n\r\n", 400, "malformed HTTP", None),
    "two Content-Lengths": (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
                            b"Content-Length: 3\r\n\r\n{}", 400, "malformed HTTP", None),
    # The body.
    "invalid UTF-8 in the prompt": (http_post("/v1/completions", b'{"prompt": "caf\xe9"}'), 400,
                                    "not valid UTF-8", None),
    "invalid UTF-8 in a stop string": (http_post("/v1/completions", b'{"prompt": "x", "stop": ["\xc3("]}'), 400,
                                       "not valid UTF-8", None),
    "invalid UTF-8 in a message": (http_post("/v1/chat/completions",
                                             b'{"messages": [{"role": "user", "content": "\xed\xa0\x80"}]}'),
                                   400, "not valid UTF-8", None),
    "a lone surrogate escaped": (http_post("/v1/completions", b'{"prompt": "\\ud800"}'), 400, "not valid JSON",
                                 None),
    "arrays nested 100,000 deep": (http_post("/v1/completions", "[" * 100000 + "]" * 100000), 400,
                                   "deeper than 64", None),
    "an unknown field nested 65 deep": (http_post("/v1/completions", '{"prompt": "x", "extra": '
                                                  + "{\"a\": " * 65 + "1" + "}" * 65 + "}"),
                                        400, "deeper than 64", None),
    "n of 100,000": (http_post("/v1/completions", '{"prompt": "x", "n": 100000}'), 400, None, "n"),
    "n of 128 times 3 prompts": (http_post("/v1/completions", '{"prompt": ["a", "b", "c"], "n": 128}'), 400,
                                 "at most 256", "n"),
    "logprobs of 1,000": (http_post("/v1/completions", '{"prompt": "x", "logprobs": 1000}'), 400, None,
                          "logprobs"),
    "top_logprobs of 2^31": (http_post("/v1/chat/completions", '{"messages": [{"role": "user", "content": "x"}], '
                                                               '"logprobs": true, "top_logprobs": 2147483648}'),
                             400, None, "top_logprobs"),
    "max_tokens of 2^64": (http_post("/v1/completions", '{"prompt": "x", "max_tokens": 18446744073709551616}'),
                           400, None, "max_tokens"),
    "max_tokens of 1e400": (http_post("/v1/completions", '{"prompt": "x", "max_tokens": 1e400}'), 400,
                            "not valid JSON", None),
    "max_tokens past the context": (http_post("/v1/completions", '{"prompt": "x", "max_tokens": 16777216}'), 400,
                                    "maximum context length", "max_tokens"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_each_hostile_case_gets_its_4xx_and_the_server_goes_on(strict, running_stream, name):
    raw, status, message, param = CASES[name]
    expect_error(exchange(strict, raw), status, message, param)
    assert completion_ok(strict)["usage"]["completion_tokens"] >= 1


@pytest.mark.parametrize("start", [
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ",                        # in the header
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n",  # in the body
])
def test_a_slow_sender_gets_408_and_is_disconnected(strict, running_stream, start):
    """It trickles a byte every 50 ms (never silent for long): the bound is on the whole request, not on
    each read. Others are served meanwhile."""
    sock = connect(strict)
    began = time.monotonic()
    sock.sendall(start)
    stop = threading.Event()

    def trickle():
        # The scenario itself is bytes spaced in time; it stops once the server closes.
        try:
            while not stop.wait(0.05):
                sock.sendall(b"a")
        except OSError:
            pass

    sender = threading.Thread(target=trickle)
    sender.start()
    completion_ok(strict)
    data = read_all(sock)
    elapsed = time.monotonic() - began
    stop.set()
    sender.join()
    sock.close()
    expect_error(data, 408, "did not arrive within")
    assert REQUEST_TIMEOUT <= elapsed < REQUEST_TIMEOUT + 10
    completion_ok(strict)


def test_a_sender_that_stops_mid_request_is_disconnected(strict):
    with connect(strict) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{\"pro")
        expect_error(read_all(sock), 408)


def test_pipelined_requests_are_answered_in_order(strict):
    bodies = [{"prompt": "The capital of France is", "max_tokens": n, "temperature": 0, "ignore_eos": True}
              for n in (3, 1, 2)]
    raw = b"".join(http_post("/v1/completions", json.dumps(b)).replace(b"Connection: close\r\n", b"")
                   for b in bodies)
    raw += b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    data = exchange(strict, raw)
    for b in bodies:
        status, _, body, data = split_response(data)
        assert status == 200, body
        assert json.loads(body)["usage"]["completion_tokens"] == b["max_tokens"]
    status, _, body, data = split_response(data)
    assert (status, json.loads(body), data) == (200, {"status": "ok"}, b"")


def test_the_largest_n_is_served(strict):
    data = exchange(strict, http_post("/v1/completions", json.dumps(
        {"prompt": "Hi", "n": 128, "max_tokens": 2, "ignore_eos": True, "seed": 1})))
    status, _, body, _ = split_response(data)
    assert status == 200, body
    answer = json.loads(body)
    assert sorted(c["index"] for c in answer["choices"]) == list(range(128))
    assert answer["usage"]["completion_tokens"] == 256


def test_the_stream_ran_through_everything(strict, running_stream):
    """Last in this file: the stream begun before the hostile cases ends whole."""
    sock, received = running_stream
    received += read_all(sock)
    head, _, chunked = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ")
    body = b""
    while True:
        size_line, _, chunked = chunked.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        body, chunked = body + chunked[:size], chunked[size + 2:]
    events = [e for e in body.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    usage = json.loads(events[-2][len(b"data: "):])["usage"]
    assert usage["completion_tokens"] == 200
    assert not any(b'"error"' in e for e in events)
