"""Our Jinja interpreter against Python's jinja2 on real chat templates.

Each template in tests/data/chat_templates/ (README.md there names the models
and where the text comes from) renders a set of conversations twice: through
tandem's ChatTemplate (build/bin/chat_template_render) and through PyPI
jinja2 set up as Hugging Face transformers sets it up for
apply_chat_template (ImmutableSandboxedEnvironment, trim_blocks,
lstrip_blocks, loopcontrols, the `generation` block, transformers' tojson,
raise_exception and strftime_now, here with a fixed clock). Both sides get
the messages prepared as vLLM prepares them (text parts joined with "\\n",
tool call arguments parsed from JSON). The outputs must be byte-identical,
and a conversation the template refuses (raise_exception) must be refused by
both. About 1 s.
"""
import copy
import datetime
import json
import os
import subprocess

import pytest

jinja2 = pytest.importorskip("jinja2")
from jinja2 import nodes  # noqa: E402
from jinja2.ext import Extension, loopcontrols  # noqa: E402
from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: E402

from conftest import BIN, ROOT  # noqa: E402

DATA = os.path.join(ROOT, "tests", "data", "chat_templates")
NOW = datetime.datetime(2024, 7, 26, 10, 30, 0)

# The special tokens each model's tokenizer gives the template.
TOKENS = {
    "HuggingFaceTB-SmolLM2-135M-Instruct": ("<|im_start|>", "<|im_end|>"),
    "HuggingFaceTB-SmolLM3-3B": ("", "<|im_end|>"),
    "meta-llama-Llama-3.1-8B-Instruct": ("<|begin_of_text|>", "<|eot_id|>"),
    "meta-llama-Llama-3.2-3B-Instruct": ("<|begin_of_text|>", "<|eot_id|>"),
    "Qwen-Qwen2.5-7B-Instruct": ("", "<|im_end|>"),
    "mistralai-Mistral-Nemo-Instruct-2407": ("<s>", "</s>"),
    "microsoft-Phi-3.5-mini-instruct": ("<s>", "<|endoftext|>"),
    "google-gemma-2-2b-it": ("<bos>", "<eos>"),
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use": ("<|begin_of_text|>", "<|im_end|>"),
    "ibm-granite-granite-3.3-2B-Instruct": ("<|end_of_text|>", "<|end_of_text|>"),
}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}

SYSTEM = {"role": "system", "content": "You are terse. Answer in one line."}
USER = {"role": "user", "content": "Name the capital of France."}
ASSISTANT = {"role": "assistant", "content": "Paris."}
USER2 = {"role": "user", "content": "And of Italy? Use \"quotes\", 'apostrophes', a tab\t, and ünïcödé ✓."}
CALL = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1a2b3c4d5", "type": "function",
     "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}}]}
RESULT = {"role": "tool", "tool_call_id": "call_1a2b3c4d5", "name": "get_weather",
          "content": "{\"temperature\": 21.5, \"sky\": \"clear\"}"}
PARTS = {"role": "user", "content": [{"type": "text", "text": "First part."}, {"type": "text", "text": "Second."}]}

CONVERSATIONS = [
    ([USER], None, {}),
    ([SYSTEM, USER], None, {}),
    ([USER, ASSISTANT, USER2], None, {}),
    ([SYSTEM, USER, ASSISTANT, USER2], None, {}),
    ([SYSTEM, USER, ASSISTANT], None, {}),
    ([PARTS], None, {}),
    ([USER], [WEATHER_TOOL], {}),
    ([SYSTEM, USER], [WEATHER_TOOL], {}),
    ([USER, CALL, RESULT], [WEATHER_TOOL], {}),
    ([SYSTEM, USER, CALL, RESULT, {"role": "assistant", "content": "It is 21.5 C."}, USER2], [WEATHER_TOOL], {}),
    ([SYSTEM, USER2], None, {"date_string": "01 Jan 2025", "enable_thinking": False, "custom_flag": 1}),
    ([USER, USER2], None, {}),
]


class AssistantTracker(Extension):
    """transformers' {% generation %} block; renders its body as it is."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def jinja2_environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[AssistantTracker, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: NOW.strftime(fmt)
    return env


def prepare(messages):
    """vLLM's preparation of OpenAI messages for a chat template."""
    out = []
    for m in copy.deepcopy(messages):
        if isinstance(m.get("content"), list):
            m["content"] = "\n".join(p["text"] for p in m["content"])
        for call in m.get("tool_calls") or []:
            args = call["function"].get("arguments")
            call["function"]["arguments"] = json.loads(args) if args else {}
        out.append(m)
    return out


def render_with_jinja2(compiled, bos, eos, messages, tools, gen, kwargs):
    context = {"messages": prepare(messages), "tools": tools, "documents": None,
               "add_generation_prompt": gen, "bos_token": bos, "eos_token": eos}
    for k, v in kwargs.items():
        context.setdefault(k, v)
    try:
        return {"text": compiled.render(**context)}
    except jinja2.exceptions.TemplateError as e:
        return {"error": str(e)}
    except (TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
        # A template that cannot handle a conversation (e.g. None content
        # concatenated to a string): tandem must fail too, in its own words.
        return {"error": "", "python": repr(e)}


def render_with_tandem(template, bos, eos, cases):
    request = {"template": template, "bos_token": bos, "eos_token": eos,
               "now": [NOW.year, NOW.month, NOW.day, NOW.hour, NOW.minute, NOW.second], "cases": cases}
    out = subprocess.run([os.path.join(BIN, "chat_template_render")], input=json.dumps(request).encode(),
                         capture_output=True, timeout=60, check=True)
    return json.loads(out.stdout)


def template_names():
    return sorted(f[:-len(".jinja")] for f in os.listdir(DATA) if f.endswith(".jinja"))


def test_every_template_has_its_tokens():
    assert set(template_names()) == set(TOKENS), "add the model's bos/eos tokens to TOKENS"
    assert len(TOKENS) >= 10


@pytest.mark.parametrize("name", template_names())
def test_renders_like_jinja2(name):
    with open(os.path.join(DATA, name + ".jinja"), encoding="utf-8") as f:
        template = f.read()
    bos, eos = TOKENS[name]
    cases = [{"messages": m, "tools": t, "add_generation_prompt": gen, "chat_template_kwargs": kw}
             for m, t, kw in CONVERSATIONS for gen in (True, False)]
    ours = render_with_tandem(template, bos, eos, cases)
    compiled = jinja2_environment().from_string(template)
    assert len(ours) == len(cases)
    rendered = 0
    for case, got in zip(cases, ours):
        want = render_with_jinja2(compiled, bos, eos, case["messages"], case["tools"],
                                  case["add_generation_prompt"], case["chat_template_kwargs"])
        where = f"{name}: {json.dumps(case)[:300]}"
        if "error" in want:
            assert "error" in got, f"{where}\njinja2 refused ({want}) but tandem rendered:\n{got.get('text')!r}"
            assert want["error"] in got["error"], f"{where}\njinja2: {want['error']}\ntandem: {got['error']}"
            continue
        assert "text" in got, f"{where}\ntandem failed: {got['error']}"
        assert got["text"] == want["text"], f"{where}\njinja2:\n{want['text']!r}\ntandem:\n{got['text']!r}"
        rendered += 1
    # Some templates refuse system messages (Gemma) or need tools (Hermes'
    # tool_use), but a template that refused nearly all would make this
    # test vacuous.
    assert rendered >= len(cases) // 3, f"{name}: only {rendered} of {len(cases)} cases rendered"
