"""Structured output (issue 14) on a real `tandem serve` with SmolLM2: every
constrained output parses and validates against its schema (jsonschema),
choices and regexes hold, uncompilable structures get a 400, and the
deferred-sampling path gives the same tokens with async scheduling on and off
at queue depths 1-3 (PP 1 and 2), with structured and free requests mixed;
the step trace shows step N+1 launched before step N's output is processed."""
import concurrent.futures
import json
import os
import re

import jsonschema
import openai
import pytest

from conftest import Server, _require_model

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "city": {"type": "string", "enum": ["Paris", "London", "Rome"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3},
    },
    "required": ["name", "age", "city", "tags"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Describe a person who lives in a European capital, as JSON."}]


def schema_format(schema, name="person"):
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def test_chat_json_schema_validates(client):
    r = client.chat.completions.create(model="smollm2", messages=ASK, max_tokens=120, temperature=0,
                                       response_format=schema_format(PERSON))
    content = r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop", content
    jsonschema.validate(json.loads(content), PERSON)
    # The schema's key order is the output's.
    assert list(json.loads(content)) == ["name", "age", "city", "tags"]


def test_sampled_choices_all_validate(client):
    r = client.chat.completions.create(model="smollm2", messages=ASK, max_tokens=120, temperature=1.0, seed=5,
                                       n=4, response_format=schema_format(PERSON))
    for c in r.choices:
        assert c.finish_reason == "stop", c.message.content
        jsonschema.validate(json.loads(c.message.content), PERSON)


def test_completions_json_schema_and_stream(client):
    schema = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 30},
                                               "sure": {"type": "boolean"}},
              "required": ["answer", "sure"]}
    r = client.completions.create(model="smollm2", prompt="Q: What is the capital of France? A JSON answer:",
                                  max_tokens=60, temperature=0, extra_body={"response_format": schema_format(schema)})
    jsonschema.validate(json.loads(r.choices[0].text), schema)
    stream = client.completions.create(model="smollm2", prompt="Q: Is the sky blue? A JSON answer:", max_tokens=60,
                                       temperature=0, stream=True, extra_body={"guided_json": schema})
    text = "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
    jsonschema.validate(json.loads(text), schema)


def test_json_object(server, client):
    rows = server.metric("tandem:grammar_mask_rows_total")
    steps = server.metric("tandem:grammar_mask_duration_seconds_count")
    # A question with a short answer: asked for a description, the model's greedy path lists keys until
    # max_tokens (a valid JSON prefix, cut by length), and where it stops moves with float rounding.
    ask = [{"role": "user", "content": "What is 2+2? Answer in JSON."}]
    r = client.chat.completions.create(model="smollm2", messages=ask, max_tokens=100, temperature=0,
                                       response_format={"type": "json_object"})
    assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    # The engine built a mask for each of its tokens before sampling it, so before the response came.
    tokens = r.usage.completion_tokens
    assert server.metric("tandem:grammar_mask_rows_total") - rows >= tokens
    assert server.metric("tandem:grammar_mask_duration_seconds_count") - steps >= tokens


def test_guided_choice_regex_grammar(client):
    choices = ["Paris", "London", "Berlin"]
    r = client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "Capital of France?"}],
                                       max_tokens=10, temperature=0.8, seed=1, n=3,
                                       extra_body={"guided_choice": choices})
    for c in r.choices:
        assert c.message.content in choices
    r = client.completions.create(model="smollm2", prompt="Call me at", max_tokens=20, temperature=0.8, seed=2, n=3,
                                  extra_body={"guided_regex": r"\(\d{3}\) \d{3}-\d{4}"})
    for c in r.choices:
        assert re.fullmatch(r"\(\d{3}\) \d{3}-\d{4}", c.text), c.text
    r = client.completions.create(model="smollm2", prompt="Yes or no:", max_tokens=20, temperature=0,
                                  extra_body={"guided_grammar": 'root ::= ("yes" | "no") "!"'})
    assert r.choices[0].text in ("yes!", "no!")
    r = client.completions.create(model="smollm2", prompt="Pick:", max_tokens=10, temperature=0,
                                  extra_body={"structured_outputs": {"choice": ["left", "right"]}})
    assert r.choices[0].text in ("left", "right")


@pytest.mark.parametrize("body,says", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}}},
     "no-such-type"),
    ({"guided_regex": "(unclosed"}, "guided_regex"),
    ({"guided_grammar": "root ::= missing_rule"}, "guided_grammar"),
    ({"response_format": {"type": "yaml"}}, "unknown response_format type 'yaml'"),
])
def test_bad_structures_get_400(client, body, says):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="smollm2", prompt="x", max_tokens=5, extra_body=body)
    assert e.value.status_code == 400
    assert says in str(e.value), str(e.value)
    # The server still serves.
    assert client.completions.create(model="smollm2", prompt="x", max_tokens=2).choices


# --- the deferred-sampling path: same tokens whatever the queue depth --------------------------------------------

SMALL = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "rank": {"type": "integer"},
                                          "big": {"type": "boolean"}},
         "required": ["city", "rank", "big"]}
PROMPTS = ["Paris is", "The best city", "Rome was", "London has", "In Berlin", "Madrid"]


def mixed_batch(base):
    """Three structured and three free requests at once, greedy."""
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)

    def one(i):
        extra = {"response_format": schema_format(SMALL, "small")} if i % 2 == 0 else {}
        r = client.completions.create(model="smollm2", prompt=PROMPTS[i], max_tokens=40, temperature=0,
                                      extra_body=extra)
        return r.choices[0].text

    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        return list(pool.map(one, range(len(PROMPTS))))


def deferred_samples(trace_path):
    """(scheduled step, the step before it) pairs where a structured step's forward
    was launched before its predecessor's output was processed."""
    processed, overlaps = set(), []
    with open(trace_path) as f:
        for line in f:
            event = json.loads(line)
            seq = int(event["step"].get("step_seq", 0))
            if event["event"] == "output":
                processed.add(seq)
            elif event["step"].get("pending_structured_output_tokens") and seq - 1 not in processed:
                overlaps.append((seq, seq - 1))
    return overlaps


def test_async_equals_sync_at_depths_1_to_3(tmp_path):
    _require_model()
    results, overlaps = {}, {}
    for pp in (1, 2):
        for async_on in (True, False):
            trace = os.path.join(tmp_path, f"trace-pp{pp}-{async_on}.jsonl")
            args = ["--pipeline-parallel-size", str(pp), "--async-scheduling" if async_on else "--no-async-scheduling",
                    "--trace-steps", trace]
            s = Server(extra_args=args, log_name=f"serve-pp{pp}-{async_on}.log", tmp_path=str(tmp_path))
            try:
                results[(pp, async_on)] = mixed_batch(s.base)
            finally:
                s.stop()
            overlaps[(pp, async_on)] = deferred_samples(trace)
    reference = results[(1, False)]  # queue depth 1
    for i, text in enumerate(reference):
        if i % 2 == 0:
            jsonschema.validate(json.loads(text), SMALL)
    for key, texts in results.items():
        assert texts == reference, key
    # At PP 1 with async scheduling (queue depth 2) every decode step of a structured request is planned
    # and launched while its predecessor is in flight, and only its sampling waits. At PP 2 a request
    # decodes every other step, and whether its previous step is still in flight when the next is planned
    # depends on timing, so only equal outputs are asserted there. Synchronous scheduling never has a
    # step in flight when it plans the next.
    assert overlaps[(1, True)], overlaps
    assert not overlaps[(1, False)] and not overlaps[(2, False)], overlaps


# --- tool calling: arguments constrained by the function's schema --------------------------------------------------

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"]}
TIME = {"type": "object", "properties": {"timezone": {"type": "string", "enum": ["UTC", "CET"]}},
        "required": ["timezone"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather forecast for a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "The time now", "parameters": TIME}}]
WEATHER_ASK = [{"role": "user", "content": "What will the weather be in Paris for the next 3 days?"}]


def test_named_tool_call(client):
    r = client.chat.completions.create(model="smollm2", messages=WEATHER_ASK, max_tokens=60, temperature=0,
                                       tools=TOOLS, tool_choice={"type": "function",
                                                                 "function": {"name": "get_weather"}})
    message = r.choices[0].message
    assert message.content is None and len(message.tool_calls) == 1, message
    call = message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    assert r.choices[0].finish_reason == "stop"
    # Streamed: the call comes whole in the last chunk.
    stream = client.chat.completions.create(model="smollm2", messages=WEATHER_ASK, max_tokens=60, temperature=0,
                                            tools=TOOLS, stream=True,
                                            tool_choice={"type": "function", "function": {"name": "get_weather"}})
    calls = [tc for chunk in stream if chunk.choices for tc in (chunk.choices[0].delta.tool_calls or [])]
    assert [c.function.arguments for c in calls] == [call.function.arguments]


def test_required_tool_calls(client):
    r = client.chat.completions.create(model="smollm2", messages=WEATHER_ASK, max_tokens=120, temperature=0.7,
                                       seed=3, n=3, tools=TOOLS, tool_choice="required")
    schemas = {"get_weather": WEATHER, "get_time": TIME}
    # SmolLM2, not shown the tools (the chat template's part), may list calls until max_tokens: such a
    # choice is text; every finished list is a valid one.
    finished = [c for c in r.choices if c.finish_reason == "tool_calls"]
    assert finished, r.choices
    for choice in r.choices:
        assert choice.finish_reason in ("tool_calls", "length"), choice
        assert (choice.message.tool_calls is not None) == (choice.finish_reason == "tool_calls"), choice
    for choice in finished:
        for call in choice.message.tool_calls:
            jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])


def test_tool_choice_auto_is_refused_without_the_flags(client):
    for extra in ({}, {"tool_choice": "auto"}):  # tools alone mean "auto"
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="smollm2", messages=WEATHER_ASK, max_tokens=10, tools=TOOLS, **extra)
        assert "--enable-auto-tool-choice" in str(e.value) and e.value.body["param"] == "tool_choice"


HERMES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "chat_templates",
                      "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja")


def test_tool_choice_auto_with_the_hermes_parser(tmp_path):
    """vLLM's --enable-auto-tool-choice --tool-call-parser hermes with a Hermes template: free output,
    <tool_call> blocks parsed into message.tool_calls. SmolLM2 may not call tools by itself (the
    parser's cases are in tool_call_parser_test); this checks the plumbing and the response shape."""
    _require_model()
    server = Server(["--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--chat-template", HERMES],
                    tmp_path=str(tmp_path))
    try:
        client = openai.OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0, timeout=120)
        # A conversation that has already called the tool once, so the model has the format before it.
        messages = [
            {"role": "user", "content": "What is the weather in Rome?"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
                "name": "get_weather", "arguments": json.dumps({"city": "Rome", "days": 1})}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 25 C"},
            {"role": "assistant", "content": "It is sunny in Rome, 25 C."},
            *WEATHER_ASK]
        for kwargs in ({}, {"tool_choice": "auto"}):
            r = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=60, temperature=0,
                                               tools=TOOLS, **kwargs)
            choice = r.choices[0]
            calls = choice.message.tool_calls or []
            assert choice.finish_reason == ("tool_calls" if calls else choice.finish_reason)
            assert choice.finish_reason in ("stop", "length", "tool_calls"), choice
            assert calls or choice.message.content, choice
            for call in calls:
                assert call.type == "function" and call.id.startswith("call_")
                assert call.function.name in ("get_weather", "get_time")
                assert isinstance(json.loads(call.function.arguments), dict)
        # Streamed: the same message, the calls as one delta at the end.
        stream = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=60, temperature=0,
                                                tools=TOOLS, stream=True)
        chunks = [c.choices[0] for c in stream if c.choices]
        streamed_calls = [tc for c in chunks for tc in (c.delta.tool_calls or [])]
        assert [tc.function.arguments for tc in streamed_calls] == [c.function.arguments for c in calls]
        assert "".join(c.delta.content or "" for c in chunks) == (choice.message.content or "")
        assert chunks[-1].finish_reason == choice.finish_reason
    finally:
        server.stop()
    with pytest.raises(RuntimeError, match="tool-call-parser"):
        Server(["--enable-auto-tool-choice", "--tool-call-parser", "mistral"], tmp_path=str(tmp_path),
               log_name="bad.log")
