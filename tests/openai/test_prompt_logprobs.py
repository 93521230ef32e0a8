"""Prompt logprobs (vLLM's prompt_logprobs, both endpoints) and the completions
API's echo against a real `tandem serve`."""
import json
import math
import os
import re
import subprocess

from conftest import BIN, MODEL, SERVED_NAME
from test_openai_api import PROMPT, raw_request

LONG = ("The quick brown fox jumps over the lazy dog while the cat sleeps on the warm windowsill "
        "and the birds sing in the old oak tree behind the red barn at the end of the road.")


def post(server, path, body):
    status, _, payload = raw_request(server, "POST", path, json.dumps(body))
    assert status == 200, payload
    return json.loads(payload)


def tokenize(server, text):
    return post(server, "/tokenize", {"prompt": text})["tokens"]


def completion(server, prompt, **fields):
    return post(server, "/v1/completions", {"model": SERVED_NAME, "prompt": prompt, "max_tokens": 2,
                                            "temperature": 0, **fields})["choices"][0]


def test_prompt_logprobs_score_each_prompt_token(server):
    full = PROMPT + " Paris"
    ids = tokenize(server, full)
    choice = completion(server, full, prompt_logprobs=2)
    scores = choice["prompt_logprobs"]
    assert len(scores) == len(ids) and scores[0] is None
    for token, entry in zip(ids[1:], scores[1:]):
        assert str(token) in entry and 1 <= len(entry) <= 3
        mine = entry[str(token)]
        assert mine["logprob"] <= 0 and mine["rank"] >= 1
        assert sorted(e["rank"] for e in entry.values())[:2] == [1, 2]  # the top 2, and the token
    # The same position scored as the next token of the shorter prompt: the
    # sampler's raw logprob of " Paris" (8-bit activations are per row, so
    # the batch shape changes nothing beyond float noise).
    greedy = completion(server, PROMPT, max_tokens=1, logprobs=1)
    assert greedy["logprobs"]["tokens"][0] == " Paris"
    paris = scores[-1][str(ids[-1])]
    assert paris["rank"] == 1 and paris["decoded_token"] == " Paris"
    assert abs(paris["logprob"] - greedy["logprobs"]["token_logprobs"][0]) < 1e-3
    chat = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1,
                                                  "prompt_logprobs": 0})["choices"][0]
    assert chat["prompt_logprobs"][0] is None and len(chat["prompt_logprobs"]) > 3
    assert all(len(e) == 1 for e in chat["prompt_logprobs"][1:])


def test_prompt_logprobs_do_not_read_the_prefix_cache(server):
    ids = tokenize(server, LONG)
    assert len(ids) > 32  # two full blocks that the first request caches
    plain = completion(server, LONG)
    first = completion(server, LONG, prompt_logprobs=1)
    again = completion(server, LONG, prompt_logprobs=1)
    assert first["text"] == plain["text"] == again["text"]
    assert len(first["prompt_logprobs"]) == len(again["prompt_logprobs"]) == len(ids)
    for a, b in zip(first["prompt_logprobs"][1:], again["prompt_logprobs"][1:]):
        assert a.keys() == b.keys()
        for k in a:
            assert abs(a[k]["logprob"] - b[k]["logprob"]) < 1e-3


def test_echo_prepends_the_prompt(server):
    plain = completion(server, PROMPT, max_tokens=3)
    echoed = completion(server, PROMPT, max_tokens=3, echo=True)
    assert echoed["text"] == PROMPT + plain["text"] and echoed["logprobs"] is None
    scored = completion(server, PROMPT, max_tokens=3, echo=True, logprobs=2)
    lp = scored["logprobs"]
    n = len(tokenize(server, PROMPT))
    assert "".join(lp["tokens"]) == scored["text"] == echoed["text"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == n + 3
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert all(x <= 0 for x in lp["token_logprobs"][1:])
    assert all(lp["tokens"][i] in lp["top_logprobs"][i] for i in range(1, n))
    offsets = [sum(len(t.encode()) for t in lp["tokens"][:i]) for i in range(len(lp["tokens"]))]
    assert lp["text_offset"] == offsets


def test_bad_prompt_logprobs_and_echo_are_named(server):
    chat = {"messages": [{"role": "user", "content": "x"}]}
    for path, body, param in (("/v1/completions", {"prompt": "x", "prompt_logprobs": 21}, "prompt_logprobs"),
                              ("/v1/completions", {"prompt": "x", "prompt_logprobs": "2"}, "prompt_logprobs"),
                              ("/v1/completions", {"prompt": "x", "echo": True, "stream": True}, "echo"),
                              ("/v1/completions", {"prompt": "x", "echo": 1}, "echo"),
                              ("/v1/chat/completions", {**chat, "echo": True}, "echo")):
        status, _, payload = raw_request(server, "POST", path, json.dumps(body))
        assert status == 400, payload
        assert json.loads(payload)["error"]["param"] == param, payload


def test_prompt_logprobs_match_tandem_perplexity(server, tmp_path):
    """The reference: `tandem perplexity` scores the same text in process
    (one chunk, from its second token) with the same model and backend."""
    ids = tokenize(server, LONG)
    scores = completion(server, LONG, max_tokens=1, prompt_logprobs=0)["prompt_logprobs"]
    nll = -sum(entry[str(token)]["logprob"] for token, entry in zip(ids[1:], scores[1:])) / (len(ids) - 1)
    text = tmp_path / "long.txt"
    text.write_text(LONG)
    out = subprocess.run([os.path.join(BIN, "tandem"), "perplexity", "--model", MODEL, "--file", str(text),
                          "--context", "512", "--threads", "1"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    reference = float(re.search(r"perplexity: ([0-9.]+) over (\d+) tokens", out.stdout).group(1))
    assert int(re.search(r"over (\d+) tokens", out.stdout).group(1)) == len(ids) - 1
    # Same logits up to float summation order; the reference prints 4 decimals.
    assert abs(math.exp(nll) - reference) <= 1e-3 * reference, (math.exp(nll), reference)
