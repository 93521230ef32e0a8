"""/tokenize and /detokenize as vLLM serves them, on the session's `tandem serve` (SmolLM2).

The chat form renders the model's chat template (our Jinja interpreter) and
must give exactly the tokens of that prompt; the expected ids come from the
reference tokenizer figures in common/tokenizer/smollm2_tokenizer_test.cc.
"""
import http.client
import json

import pytest

from conftest import SERVED_NAME

SMOLLM2_SYSTEM = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
                  "Face<|im_end|>\n")


def post(server, path, body):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request("POST", path, body=body if isinstance(body, str) else json.dumps(body),
                 headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    data = json.loads(r.read().decode())
    conn.close()
    return r.status, data


def test_tokenize_prompt_round_trips(server):
    status, body = post(server, "/tokenize", {"model": SERVED_NAME, "prompt": "Hello, world!"})
    assert status == 200, body
    assert body["count"] == len(body["tokens"]) > 0
    assert body["max_model_len"] > 0
    assert body["token_strs"] is None
    status, back = post(server, "/detokenize", {"tokens": body["tokens"]})
    assert status == 200, back
    assert back == {"prompt": "Hello, world!"}
    # Special-token text in a prompt stays text, as /v1/completions encodes it.
    _, special = post(server, "/tokenize", {"prompt": "<|im_end|>"})
    assert 2 not in special["tokens"] and special["count"] > 1
    _, strs = post(server, "/tokenize", {"prompt": "Hi there", "return_token_strs": True})
    assert "".join(strs["token_strs"]).replace("Ġ", " ") == "Hi there"


def test_tokenize_chat_renders_the_template(server):
    messages = [{"role": "user", "content": "hi"}]
    status, with_prompt = post(server, "/tokenize", {"messages": messages})
    assert status == 200, with_prompt
    # "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n" by the reference tokenizer.
    assert with_prompt["tokens"][-10:] == [1, 4093, 198, 6004, 2, 198, 1, 520, 9531, 198]
    _, text = post(server, "/detokenize", {"tokens": with_prompt["tokens"]})
    assert text["prompt"] == SMOLLM2_SYSTEM + "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    status, without = post(server, "/tokenize", {"messages": messages, "add_generation_prompt": False})
    assert status == 200
    assert without["tokens"] == with_prompt["tokens"][:-4]
    # An explicit system message replaces the template's default.
    _, own = post(server, "/tokenize", {"messages": [{"role": "system", "content": "Be brief."}] + messages})
    _, own_text = post(server, "/detokenize", {"tokens": own["tokens"]})
    assert own_text["prompt"].startswith("<|im_start|>system\nBe brief.<|im_end|>\n")


@pytest.mark.parametrize("path,body,param", [
    ("/tokenize", "not json", None),
    ("/tokenize", {}, "prompt"),
    ("/tokenize", {"prompt": "x", "messages": [{"role": "user", "content": "x"}]}, "prompt"),
    ("/tokenize", {"prompt": 3}, "prompt"),
    ("/tokenize", {"prompt": "x", "add_special_tokens": "yes"}, "add_special_tokens"),
    ("/tokenize", {"messages": [{"role": "wizard", "content": "x"}]}, "messages"),
    ("/tokenize", {"messages": []}, "messages"),
    ("/tokenize", {"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": 1}, "add_generation_prompt"),
    ("/detokenize", {"tokens": [1, -1]}, "tokens"),
    ("/detokenize", {"tokens": [10 ** 9]}, "tokens"),
    ("/detokenize", {"tokens": "1 2"}, "tokens"),
    ("/detokenize", {}, "tokens"),
])
def test_bad_input_is_a_400_naming_the_field(server, path, body, param):
    status, error = post(server, path, body)
    assert status == 400, error
    assert error["error"]["message"]
    assert error["error"]["param"] == param


def test_unknown_model_and_method(server):
    status, error = post(server, "/tokenize", {"model": "other", "prompt": "x"})
    assert status == 404 and error["error"]["param"] == "model"
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request("GET", "/tokenize")
    r = conn.getresponse()
    assert r.status == 405
    conn.close()


def test_chat_template_flag_overrides_the_models(tmp_path):
    """--chat-template FILE replaces the GGUF's template (here Phi-3.5's, a non-ChatML one)."""
    import os
    import subprocess

    from conftest import BIN, MODEL, ROOT, Server
    template = os.path.join(ROOT, "tests", "data", "chat_templates", "microsoft-Phi-3.5-mini-instruct.jinja")
    server = Server(["--chat-template", template], log_name="chat_template.log", tmp_path=str(tmp_path))
    try:
        status, body = post(server, "/tokenize", {"messages": [{"role": "system", "content": "S"},
                                                               {"role": "user", "content": "hi"}]})
        assert status == 200, body
        _, text = post(server, "/detokenize", {"tokens": body["tokens"]})
        assert text["prompt"] == "<|system|>\nS<|end|>\n<|user|>\nhi<|end|>\n<|assistant|>\n"
    finally:
        server.stop()
    # A file that is missing, or that does not parse, stops the start with a message.
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}")
    for path, why in ((str(tmp_path / "missing.jinja"), "cannot read"), (str(bad), "'for' is never closed")):
        r = subprocess.run([os.path.join(BIN, "tandem"), "serve", "--model", MODEL, "--port", "0",
                            "--grpc-port", "0", "--chat-template", path],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode != 0
        assert "--chat-template" in r.stderr and why in r.stderr, r.stderr[-2000:]
