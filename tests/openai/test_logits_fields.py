"""Request fields that reach the worker's logits, against a real `tandem serve`:
OpenAI's logit_bias and vLLM's bad_words (both endpoints)."""
import json

from conftest import SERVED_NAME
from test_openai_api import CHAT, PROMPT, raw_request


def greedy(client, **extra):
    return client.completions.create(model=SERVED_NAME, prompt=PROMPT, max_tokens=8, temperature=0, logprobs=1,
                                     extra_body={"ignore_eos": True, **extra}).choices[0]


def token_id(server, text):
    status, _, body = raw_request(server, "POST", "/tokenize",
                                  json.dumps({"prompt": text, "add_special_tokens": False}))
    assert status == 200, body
    tokens = json.loads(body)["tokens"]
    assert len(tokens) == 1, tokens
    return tokens[0]


def test_logit_bias_moves_the_greedy_choice(server, client):
    free = greedy(client)
    first = free.logprobs.tokens[0]
    # -100 on the greedy first token: another one comes first.
    banned = greedy(client, logit_bias={str(token_id(server, first)): -100})
    assert banned.logprobs.tokens[0] != first
    # +100 on a token the model would not pick: it comes first, and its
    # reported logprob is the raw one (far below the free choice's).
    forced = greedy(client, logit_bias={str(token_id(server, " banana")): 100})
    assert forced.logprobs.tokens[0] == " banana"
    assert forced.logprobs.token_logprobs[0] < free.logprobs.token_logprobs[0] - 5
    chat = client.chat.completions.create(model=SERVED_NAME, messages=CHAT, max_tokens=3, temperature=0,
                                          logit_bias={str(token_id(server, " banana")): 100})
    assert chat.choices[0].message.content.startswith(" banana")


def test_bad_words_remove_a_word_from_greedy_output(client):
    free = greedy(client)
    assert "Paris" in free.text
    without = greedy(client, bad_words=["Paris"])
    assert "Paris" not in without.text and without.text != free.text
    # A word of several tokens: its last token is banned only after the others.
    word = "".join(free.logprobs.tokens[:2])
    assert word.strip() and word in free.text
    cut = greedy(client, bad_words=[word])
    assert word not in cut.text
    assert cut.logprobs.tokens[0] == free.logprobs.tokens[0]
    chat = client.chat.completions.create(model=SERVED_NAME, messages=CHAT, max_tokens=12, temperature=0,
                                          extra_body={"bad_words": ["Paris"]})
    assert "Paris" not in chat.choices[0].message.content


def test_bad_logit_bias_and_bad_words_are_named(server):
    for path, field in (("/v1/completions", '"prompt": "x"'),
                        ("/v1/chat/completions", '"messages": [{"role": "user", "content": "x"}]')):
        for extra, param in (('"logit_bias": {"99999999": 1}', "logit_bias"),
                             ('"logit_bias": {"12": 101}', "logit_bias"),
                             ('"logit_bias": {"twelve": 1}', "logit_bias"),
                             ('"bad_words": "Paris"', "bad_words")):
            status, _, payload = raw_request(server, "POST", path, "{" + field + ", " + extra + "}")
            assert status == 400, payload
            assert json.loads(payload)["error"]["param"] == param, payload
