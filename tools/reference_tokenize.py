#!/usr/bin/env python3
"""Reference token ids for tandem's tokenizer tests.

Rebuilds a GGUF model's byte-level BPE tokenizer with the PyPI `tokenizers`
package (Hugging Face's Rust implementation) from the file's own
tokenizer.ggml.* metadata, and prints the ids of the given strings. The
`transformers` AutoTokenizer needs the hub and is not available offline, so
this reconstruction is the reference that
common/tokenizer/smollm2_tokenizer_test.cc was written against.

  pip install tokenizers gguf
  python3 tools/reference_tokenize.py --model models/SmolLM2-135M-Instruct.Q4_1.gguf \
      "Hello world" "12345 and 3.14"
  python3 tools/reference_tokenize.py --model ... --cpp --strings-json strings.json

Supported tokenizer.ggml.pre values: "smollm" (digits split one by one, then
the GPT-2 pattern), "gpt2" and "default" (the GPT-2 pattern).
"""

import argparse
import json
import sys
import unicodedata

import gguf
import tokenizers
from tokenizers import decoders, models, pre_tokenizers

# GGUF token types. Control (and unknown) tokens are HF special added
# tokens, matched only when parsing specials; user-defined ones are HF
# added tokens that are not special, matched in any text.
_UNKNOWN = 2
_CONTROL = 3
_USER_DEFINED = 4


def _field_strings(reader, key):
    field = reader.fields[key]
    return [bytes(field.parts[i]).decode("utf-8") for i in field.data]


def _field_ints(reader, key):
    field = reader.fields[key]
    return [int(field.parts[i][0]) for i in field.data]


def _field_string(reader, key):
    field = reader.fields[key]
    return bytes(field.parts[field.data[0]]).decode("utf-8")


def build_tokenizer(model_path, parse_special=True):
    """Returns a tokenizers.Tokenizer equivalent to the GGUF file's tokenizer.

    With parse_special=False the control tokens are left out, so their
    strings encode as plain text (tandem's Encode(..., parse_special=false)).
    """
    reader = gguf.GGUFReader(model_path)
    model = _field_string(reader, "tokenizer.ggml.model")
    if model != "gpt2":
        sys.exit(f"tokenizer.ggml.model {model!r} is not byte-level BPE")
    pre = (_field_string(reader, "tokenizer.ggml.pre")
           if "tokenizer.ggml.pre" in reader.fields else "default")
    tokens = _field_strings(reader, "tokenizer.ggml.tokens")
    types = (_field_ints(reader, "tokenizer.ggml.token_type")
             if "tokenizer.ggml.token_type" in reader.fields else [1] * len(tokens))
    merges = [tuple(m.split(" ", 1)) for m in _field_strings(reader, "tokenizer.ggml.merges")]

    vocab = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    tok = tokenizers.Tokenizer(models.BPE(vocab, merges))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "smollm":
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level])
    elif pre in ("gpt2", "default"):
        tok.pre_tokenizer = byte_level
    else:
        sys.exit(f"tokenizer.ggml.pre {pre!r} is not supported by this script")
    tok.decoder = decoders.ByteLevel()
    added = []
    for t, ty in zip(tokens, types):
        if not t:
            continue
        if ty in (_CONTROL, _UNKNOWN) and parse_special:
            added.append(tokenizers.AddedToken(t, special=True, normalized=False))
        elif ty == _USER_DEFINED:
            added.append(tokenizers.AddedToken(t, special=False, normalized=False))
    tok.add_tokens(added)
    return tok


def _cpp_string(text):
    """A C++17 string literal for `text`: visible characters as UTF-8,
    invisible ones (controls, spaces other than ' ', joiners, combining
    marks) as escapes."""
    simple = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r"}
    out = []
    for c in text:
        if c in simple:
            out.append(simple[c])
        elif " " <= c <= "~":
            out.append(c)
        elif ord(c) < 0x80:
            out.append(f"\\{ord(c):03o}")  # octal: never swallows a following digit
        elif unicodedata.category(c)[0] in "LNPS":
            out.append(c)
        elif ord(c) <= 0xFFFF:
            out.append(f"\\u{ord(c):04X}")
        else:
            out.append(f"\\U{ord(c):08X}")
    return '"' + "".join(out) + '"'


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="GGUF file")
    parser.add_argument("--strings-json", help="JSON file with a list of strings")
    parser.add_argument("--no-special", action="store_true",
                        help="encode special-token strings as plain text")
    parser.add_argument("--cpp", action="store_true",
                        help="print C++ {text, {ids}} initializers")
    parser.add_argument("texts", nargs="*")
    args = parser.parse_args()

    texts = list(args.texts)
    if args.strings_json:
        with open(args.strings_json, encoding="utf-8") as f:
            texts += json.load(f)
    tok = build_tokenizer(args.model, parse_special=not args.no_special)
    for text in texts:
        ids = tok.encode(text, add_special_tokens=False).ids
        if tok.decode(ids, skip_special_tokens=False) != text:
            # Expected where the text has bytes that no token stands for.
            print(f"warning: round trip differs for {text!r}", file=sys.stderr)
        if args.cpp:
            print(f"    {{{_cpp_string(text)}, {{{', '.join(map(str, ids))}}}}},")
        else:
            print(json.dumps({"text": text, "ids": ids}, ensure_ascii=False))
    print(f"# tokenizers {tokenizers.__version__}, {args.model}", file=sys.stderr)


if __name__ == "__main__":
    main()
