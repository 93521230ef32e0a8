// The Jinja interpreter, construct by construct. Expected outputs are what
// jinja2 prints under transformers' settings (trim_blocks, lstrip_blocks);
// tests/openai/test_chat_templates.py checks real templates against jinja2
// itself.
#include "scheduler/server/openai/jinja/template.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem::jinja {
namespace {

using ::testing::HasSubstr;

std::string Render(const std::string& source, const ValueDict& globals = {}) {
  absl::StatusOr<Template> t = Template::Parse(source);
  if (!t.ok()) return "PARSE ERROR: " + std::string(t.status().message());
  absl::StatusOr<std::string> out = t->Render(globals);
  if (!out.ok()) return "ERROR: " + std::string(out.status().message());
  return *out;
}

ValueDict Vars(const char* json) { return Value::FromJson(nlohmann::ordered_json::parse(json)).dict(); }

TEST(JinjaTest, OutputsAndLiterals) {
  EXPECT_EQ(Render("a{{ 1 + 2 }}b"), "a3b");
  EXPECT_EQ(Render("{{ 'x' 'y' }}{{ \"q\\\"\\n\" }}"), "xyq\"\n");
  EXPECT_EQ(Render("{{ none }}{{ True }}{{ false }}{{ 1.0 }}{{ 1e-05 }}{{ 2.5e16 }}{{ 7 // 2 }}{{ -7 // 2 }}{{ 7 / 2 }}"),
            "NoneTrueFalse1.01e-052.5e+163-43.5");
  EXPECT_EQ(Render("{{ [1, 'a', none, {'k': [true]}] }}|{{ ('t',) }}|{{ \"it's\" ~ [\"it's\"] }}"),
            "[1, 'a', None, {'k': [True]}]|('t',)|it's[\"it's\"]");
  EXPECT_EQ(Render("{{ undefined_thing }}|{{ 2 ** 10 }}|{{ 7 % 3 }}|{{ -7 % 3 }}|{{ 'ab' * 2 }}"), "|1024|1|2|abab");
}

TEST(JinjaTest, WhitespaceControlAsTransformersConfiguresIt) {
  // trim_blocks eats the newline after a block; lstrip_blocks the indentation before it.
  EXPECT_EQ(Render("{% if true %}\n  x\n  {% endif %}\ny"), "  x\ny");
  EXPECT_EQ(Render("a  {{- ' b ' -}}  c"), "a b c");
  EXPECT_EQ(Render("a\n  {%- if true %}b{% endif -%}  \n c"), "abc");
  EXPECT_EQ(Render("{% if true +%}\nx{% endif %}"), "\nx");
  EXPECT_EQ(Render("  {%+ if true %}x{% endif %}"), "  x");
  EXPECT_EQ(Render("a {# note #}\n  {#- x -#} b\n"), "a b");  // one trailing newline dropped
  EXPECT_EQ(Render("x\r\ny\r\n\r\n"), "x\ny\n");
}

TEST(JinjaTest, IfElifElseAndTests) {
  const char* t = "{% for x in xs %}{% if x is none %}N{% elif x is string %}S{% elif x is mapping %}M"
                  "{% elif x is number and x is not boolean %}#{% elif x is sequence %}L{% else %}B{% endif %}{% endfor %}";
  EXPECT_EQ(Render(t, Vars(R"({"xs": [null, "s", {"a": 1}, 1, 2.5, [1], true]})")), "NSM##LB");
  EXPECT_EQ(Render("{{ a is defined }}{{ b is undefined }}{{ 3 is odd }}{{ 4 is divisibleby 2 }}{{ 'x' is in 'xy' }}"
                   "{{ 1 is equalto 1 }}{{ 'ab' is lower }}{{ none is iterable }}{{ 'ab' is iterable }}",
                   Vars(R"({"a": 1})")),
            "TrueTrueTrueTrueTrueTrueTrueFalseTrue");
}

TEST(JinjaTest, ForLoops) {
  EXPECT_EQ(Render("{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.first }}"
                   "{{ loop.last }}{{ loop.length }}{{ x }};{% endfor %}"),
            "103TrueFalse3a;212FalseFalse3b;321FalseTrue3c;");
  EXPECT_EQ(Render("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(Render("{% for k, v in d.items() %}{{ k }}={{ v }},{% endfor %}{% for k in d %}{{ k }}{% endfor %}",
                   Vars(R"({"d": {"z": 1, "a": 2}})")),
            "z=1,a=2,za");
  EXPECT_EQ(Render("{% for x in range(10) if x is odd %}{% if x > 6 %}{% break %}{% endif %}{% if x == 3 %}"
                   "{% continue %}{% endif %}{{ x }}{{ loop.length }}{% endfor %}"),
            "1555");
  EXPECT_EQ(Render("{% for x in [1, 2] %}{{ loop.previtem }}-{{ loop.nextitem }}|{{ loop.cycle('a', 'b') }};{% endfor %}"),
            "-2|a;1-|b;");
  // A loop's sets stay in the loop; a namespace carries state out.
  EXPECT_EQ(Render("{% set n = 0 %}{% set ns = namespace(n=0) %}{% for x in [1, 2, 3] %}{% set n = n + x %}"
                   "{% set ns.n = ns.n + x %}{% endfor %}{{ n }} {{ ns.n }}"),
            "0 6");
}

TEST(JinjaTest, SetMacrosAndCallBlocks) {
  EXPECT_EQ(Render("{% set a, b = 1, 'x' %}{{ a }}{{ b }}{% set c %}in {{ b }}{% endset %}[{{ c }}]"), "1x[in x]");
  EXPECT_EQ(Render("{% set u | upper %}abc{% endset %}{{ u }}{% filter replace('a', 'o') %}banana{% endfilter %}"),
            "ABCbonono");
  EXPECT_EQ(Render("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}"
                   "{{ greet('A') }} {{ greet('B', '?') }} {{ greet(punct='.', name='C') }} {{ greet() }}"),
            "Hi A! Hi B? Hi C. Hi !");
  EXPECT_EQ(Render("{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}"
                   "{% call wrap('b') %}bold{% endcall %}"),
            "<b>bold</b>");
  EXPECT_EQ(Render("{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(3) }}"), "321");
}

TEST(JinjaTest, Filters) {
  EXPECT_EQ(Render("{{ '  x ' | trim }}|{{ 'aB' | upper }}{{ 'aB' | lower }}|{{ 'hello wORLD' | capitalize }}|"
                   "{{ 'hello-big wORLD' | title }}|{{ [1, 2] | length }}{{ 'héllo' | length }}|{{ [3, 4] | first }}"
                   "{{ [3, 4] | last }}|{{ [1, 2] | join(', ') }}|{{ 'aaa' | replace('a', 'b', 2) }}|{{ 3 | string }}|"
                   "{{ '42' | int + 1 }}{{ 'x' | int }}{{ 2.7 | int }}|{{ u | default('d') }}{{ '' | default('e', true) }}"),
            "x|ABab|Hello world|Hello-Big World|25|34|1, 2|bba|3|4302|de");
  EXPECT_EQ(Render("{{ d | items | list }}|{{ 'ab' | list }}|{{ xs | selectattr('ok') | map(attribute='n') | join }}|"
                   "{{ xs | rejectattr('ok') | map(attribute='n') | list }}|{{ xs | selectattr('n', 'equalto', 'b') | list "
                   "| length }}|{{ ['a', 'b'] | map('upper') | join }}|{{ [1, 2, 1] | unique | list }}|{{ 'abc' | reverse }}",
                   Vars(R"({"d": {"k": 1}, "xs": [{"n": "a", "ok": true}, {"n": "b", "ok": false}, {"n": "c"}]})")),
            "[('k', 1)]|['a', 'b']|a|['b', 'c']|1|AB|[1, 2]|cba");
  EXPECT_EQ(Render("{{ 'a\\nb\\n\\nc' | indent(2) }}|{{ 'a\\nb' | indent(2, true) }}|{{ '<b>x</b>  y' | striptags }}|"
                   "{{ '<&>' | safe }}"),
            "a\n  b\n\n  c|  a\n  b|x y|<&>");
}

TEST(JinjaTest, ToJsonAsTransformersDefinesIt) {
  const ValueDict v = Vars(R"({"x": {"b": [1, 2.5, null, true], "a": "é\"\n<>"}})");
  EXPECT_EQ(Render("{{ x | tojson }}", v), R"({"b": [1, 2.5, null, true], "a": "é\"\n<>"})");
  EXPECT_EQ(Render("{{ x | tojson(indent=2) }}", v),
            "{\n  \"b\": [\n    1,\n    2.5,\n    null,\n    true\n  ],\n  \"a\": \"é\\\"\\n<>\"\n}");
  EXPECT_EQ(Render("{{ x | tojson(sort_keys=true, ensure_ascii=true, separators=(',', ':')) }}", v),
            R"({"a":"\u00e9\"\n<>","b":[1,2.5,null,true]})");
  EXPECT_THAT(Render("{{ nothing | tojson }}"), HasSubstr("not JSON serializable at line 1, column 12"));
}

TEST(JinjaTest, OperatorsAndMethods) {
  EXPECT_EQ(Render("{{ 'a' in 'cat' }}{{ 2 in [1, 2] }}{{ 'k' not in {'k': 1} }}{{ 1 < 2 < 3 }}{{ 'b' > 'a' }}"
                   "{{ 1 == 1.0 }}{{ not [] }}{{ [] or 'x' }}{{ 0 and 1 }}{{ 'y' if 0 else 'n' }}{{ 'y' if 0 }}"),
            "TrueTrueFalseTrueTrueTrueTruex0n");
  EXPECT_EQ(Render("{{ 'abcde'[1:] }}{{ 'abcde'[::-1] }}{{ 'abcde'[-2:] }}{{ [1, 2, 3][:-1] }}{{ 'héllo'[1] }}"
                   "{{ [1, 2, 3][::2] }}{{ [1][5] }}"),
            "bcdeedcbade[1, 2]é[1, 3]");
  EXPECT_EQ(Render("{{ ' x '.strip() }}|{{ 'xxyxx'.lstrip('x') }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|"
                   "{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'c')) }}|{{ 'hello world'.title() }}|"
                   "{{ 'aXb'.replace('X', '-') }}|{{ d.get('a') }}{{ d.get('z', 0) }}{{ d.get('q') }}|{{ d.keys() | list }}"
                   "{{ d.values() | list }}|{{ '-'.join(['a', 'b']) }}",
                   Vars(R"({"d": {"a": 1}})")),
            "x|yxx|['a', 'b', '', 'c']|['a', 'b']|TrueTrue|Hello World|a-b|10None|['a'][1]|a-b");
  EXPECT_EQ(Render("{{ m.content }}|{{ m['content'] }}|{{ m.nope }}|{{ m.nope is defined }}|{{ none.x }}",
                   Vars(R"({"m": {"content": "c"}})")),
            "c|c||False|");
}

TEST(JinjaTest, ErrorsNameTheirPosition) {
  EXPECT_EQ(Render("{{ 1 +\n }}"), "PARSE ERROR: unexpected end of tag at line 2, column 2");
  EXPECT_EQ(Render("ab\n{% if %}{% endif %}"), "PARSE ERROR: unexpected end of tag at line 2, column 7");
  EXPECT_EQ(Render("{% for x in y %}"), "PARSE ERROR: 'for' is never closed at line 1, column 1");
  EXPECT_EQ(Render("{% endfor %}"), "PARSE ERROR: unexpected 'endfor' at line 1, column 1");
  EXPECT_EQ(Render("{% break %}"), "PARSE ERROR: 'break' outside a loop at line 1, column 1");
  EXPECT_EQ(Render("{{ x | nosuchfilter }}"), "ERROR: no filter named 'nosuchfilter' at line 1, column 6");
  EXPECT_EQ(Render("{{ 'a'.nosuchmethod() }}"), "ERROR: 'str' object has no method 'nosuchmethod' at line 1, column 20");
  EXPECT_EQ(Render("\n  {{ x.y }}"), "ERROR: 'x' is undefined at line 2, column 7");
  EXPECT_EQ(Render("{{ 1 + 'a' }}"), "ERROR: unsupported operand type(s) for +: 'int' and 'str' at line 1, column 6");
  EXPECT_EQ(Render("{{ 1 // 0 }}"), "ERROR: division by zero at line 1, column 6");
  EXPECT_EQ(Render("{{ [1].append(2) }}"), "ERROR: access to attribute 'append' of 'list' object is unsafe (lists are "
                                         "immutable in a chat template) at line 1, column 14");
  EXPECT_EQ(Render("{% set x = 1 %}{% set x.y = 2 %}"),
            "ERROR: cannot assign attribute 'y' on 'x': only a namespace() takes attribute assignments at line 1, column 16");
}

TEST(JinjaTest, BoundsHostileTemplates) {
  // Deep nesting is refused while parsing, not by the stack.
  EXPECT_THAT(Render("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}"), HasSubstr("nested too deeply"));
  EXPECT_THAT(Render("{{ " + std::string(5000, '-') + "1 }}"), HasSubstr("nested too deeply"));
  std::string blocks;
  for (int i = 0; i < 500; ++i) blocks += "{% if true %}";
  EXPECT_THAT(Render(blocks), HasSubstr("blocks nested too deeply"));
  // Unbounded recursion and work end with an error.
  EXPECT_THAT(Render("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}"), HasSubstr("nest too deeply"));
  RenderLimits few_steps;
  few_steps.max_steps = 100000;
  absl::StatusOr<Template> loops =
      Template::Parse("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}");
  ASSERT_TRUE(loops.ok());
  EXPECT_THAT(loops->Render({}, few_steps).status().message(), HasSubstr("step limit"));
  EXPECT_THAT(Render("{{ range(1000000) }}"), HasSubstr("range() is limited"));
  // Arithmetic at int64's edges errs or stops instead of overflowing or spinning.
  EXPECT_EQ(Render("{{ 1 ** 9223372036854775807 }}{{ (-1) ** 3 }}{{ 0 ** 0 }}"), "1-11");
  EXPECT_THAT(Render("{{ 3 ** 100 }}"), HasSubstr("integer overflow"));
  EXPECT_EQ(Render("{{ range(0, 9223372036854775807, 4611686018427387904) | length }}"), "2");
  EXPECT_EQ(Render("{{ 'abc'[::-9223372036854775807] }}{{ 1e300 | int }}{{ 'x' * -1 }}"), "c0");
  EXPECT_THAT(Render("{{ 'ab' * 9223372036854775807 }}"), HasSubstr("repetition too large"));
  RenderLimits small;
  small.max_output_bytes = 1000;
  absl::StatusOr<Template> t = Template::Parse("{% for i in range(1000) %}xxxxxxxxxx{% endfor %}");
  ASSERT_TRUE(t.ok());
  EXPECT_THAT(t->Render({}, small).status().message(), HasSubstr("output is too large"));
}

TEST(JinjaTest, GlobalsAndCallables) {
  ValueDict globals = Vars(R"({"n": 2})");
  globals.emplace_back("twice", Value::Callable([](CallArgs& args) -> absl::StatusOr<Value> {
                         if (args.positional.empty()) return absl::InvalidArgumentError("twice() needs an argument");
                         return Value::Int(args.positional[0].as_int() * 2);
                       }));
  EXPECT_EQ(Render("{{ twice(n) }}{% set n = 5 %}{{ twice(n) }}", globals), "410");
  EXPECT_EQ(Render("\n{{ twice() }}", globals), "ERROR: twice() needs an argument at line 2, column 9");
  EXPECT_EQ(Render("{{ dict(a=1, b='x') | tojson }}{{ namespace(a=1).a }}"), "{\"a\": 1, \"b\": \"x\"}1");
}

}  // namespace
}  // namespace tandem::jinja
