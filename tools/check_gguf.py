#!/usr/bin/env python3
"""Checks a GGUF file with the reference reader (PyPI `gguf`, llama.cpp's own).

An outside check of what tandem writes: it shares no code with tandem, so a
file that passes here is laid out as llama.cpp expects.

  check_gguf.py MODEL.gguf                         # print what is in it
  check_gguf.py MODEL.gguf --arch llama --tensor-count 20
  check_gguf.py MODEL.gguf --expect-json expect.json
  check_gguf.py MODEL.gguf --llama layers=2,hidden=64,heads=4,kv_heads=2,\\
      intermediate=128,vocab=259,context=256,type=Q4_1,tied=1

--expect-json takes {"architecture": "llama", "tensor_count": 20,
"tensors": {"token_embd.weight": {"type": "Q8_0", "shape": [64, 259]}},
"metadata": {"llama.block_count": 2}}; every part is optional.

--quantized-from F32.gguf requantizes the twin's weights with the reference
quantizer and requires byte-identical blocks.

--llama derives the complete tensor list of a Llama model (names, ggml-order
shapes, types: norms F32, matrices TYPE) and its llama.* metadata, and for
vocab 259 the byte-level tokenizer `tandem make-model` writes; it also
dequantizes every tensor to check the values are those of a sane random
model (norms 1, small finite weights).

Exits 0 when every check passes, 1 with a list of problems otherwise, 2 on
bad usage.
"""

import argparse
import json
import math
import sys

try:
    import numpy as np
    from gguf import GGUFReader, GGUFValueType
except ImportError as e:  # the wrapper turns this into a skipped test
    print(f"check_gguf.py: the gguf package is missing ({e}); pip install gguf", file=sys.stderr)
    sys.exit(77)


def field_value(field):
    """A metadata value as a Python object, for old and new gguf versions."""
    if hasattr(field, "contents"):
        return field.contents()
    kind = field.types[0]
    if kind == GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8")
    if kind == GGUFValueType.ARRAY:
        if len(field.types) > 1 and field.types[-1] == GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8") for i in field.data]
        return [field.parts[i][0].item() for i in field.data]
    return field.parts[field.data[0]][0].item()


def gpt2_byte_alphabet():
    """GPT-2's bytes_to_unicode, in byte order."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    chars, extra = [], 0
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def llama_expectations(spec):
    """Expected tensors and metadata of a Llama model described by `spec`."""
    p = dict(item.split("=", 1) for item in spec.split(",") if item)
    layers, hidden, heads = int(p["layers"]), int(p["hidden"]), int(p["heads"])
    kv_heads = int(p.get("kv_heads", heads))
    inter, vocab = int(p["intermediate"]), int(p["vocab"])
    qtype = p.get("type", "F32").upper()
    tied = p.get("tied", "1") in ("1", "true")
    head_dim = hidden // heads
    tensors = {"token_embd.weight": (qtype, [hidden, vocab]), "output_norm.weight": ("F32", [hidden])}
    if not tied:
        tensors["output.weight"] = (qtype, [hidden, vocab])
    for i in range(layers):
        b = f"blk.{i}."
        tensors[b + "attn_norm.weight"] = ("F32", [hidden])
        tensors[b + "attn_q.weight"] = (qtype, [hidden, heads * head_dim])
        tensors[b + "attn_k.weight"] = (qtype, [hidden, kv_heads * head_dim])
        tensors[b + "attn_v.weight"] = (qtype, [hidden, kv_heads * head_dim])
        tensors[b + "attn_output.weight"] = (qtype, [heads * head_dim, hidden])
        tensors[b + "ffn_norm.weight"] = ("F32", [hidden])
        tensors[b + "ffn_gate.weight"] = (qtype, [hidden, inter])
        tensors[b + "ffn_up.weight"] = (qtype, [hidden, inter])
        tensors[b + "ffn_down.weight"] = (qtype, [inter, hidden])
    metadata = {
        "general.architecture": "llama",
        "llama.block_count": layers,
        "llama.embedding_length": hidden,
        "llama.feed_forward_length": inter,
        "llama.attention.head_count": heads,
        "llama.attention.head_count_kv": kv_heads,
        "llama.vocab_size": vocab,
        "llama.rope.dimension_count": head_dim,
    }
    if "context" in p:
        metadata["llama.context_length"] = int(p["context"])
    if "rope_base" in p:
        metadata["llama.rope.freq_base"] = float(p["rope_base"])
    return tensors, metadata, vocab


class Checker:
    def __init__(self, reader):
        self.reader = reader
        self.problems = []
        self.tensors = {t.name: t for t in reader.tensors}

    def expect(self, ok, message):
        if not ok:
            self.problems.append(message)

    def metadata(self, key):
        field = self.reader.fields.get(key)
        return None if field is None else field_value(field)

    def check_metadata(self, expected):
        for key, want in expected.items():
            got = self.metadata(key)
            if isinstance(want, float) and isinstance(got, (int, float)):
                self.expect(math.isclose(got, want, rel_tol=1e-6), f"{key} is {got}, expected {want}")
            else:
                self.expect(got == want, f"{key} is {got!r}, expected {want!r}")

    def check_tensors(self, expected, exact_set):
        for name, (qtype, shape) in expected.items():
            t = self.tensors.get(name)
            if t is None:
                self.problems.append(f"tensor {name} is missing")
                continue
            got_shape = [int(d) for d in t.shape]
            self.expect(t.tensor_type.name == qtype, f"tensor {name} has type {t.tensor_type.name}, expected {qtype}")
            self.expect(got_shape == list(shape), f"tensor {name} has shape {got_shape}, expected {list(shape)}")
        if exact_set:
            for name in sorted(set(self.tensors) - set(expected)):
                self.problems.append(f"unexpected tensor {name}")

    def check_byte_tokenizer(self, vocab):
        tokens = self.metadata("tokenizer.ggml.tokens") or []
        types = self.metadata("tokenizer.ggml.token_type") or []
        self.expect(len(tokens) == vocab, f"{len(tokens)} tokens, expected {vocab}")
        self.expect(len(types) == len(tokens), f"{len(types)} token types for {len(tokens)} tokens")
        self.expect(tokens[:256] == gpt2_byte_alphabet(), "the first 256 tokens are not GPT-2's byte alphabet")
        self.expect(tokens[256:259] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                    f"special tokens are {tokens[256:259]}")
        self.expect(list(types[:256]) == [1] * 256, "byte tokens are not all type 1 (normal)")
        self.expect(list(types[256:259]) == [3, 3, 3], f"special token types are {list(types[256:259])}")
        self.check_metadata({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt2",
                             "tokenizer.ggml.bos_token_id": 256, "tokenizer.ggml.eos_token_id": 256,
                             "tokenizer.ggml.add_bos_token": False, "tokenizer.ggml.merges": []})
        template = self.metadata("tokenizer.chat_template") or ""
        self.expect("<|im_start|>" in template and "add_generation_prompt" in template,
                    "tokenizer.chat_template is not ChatML")

    def check_quantized_from(self, float_path):
        """Each quantized tensor must be byte-identical to the reference
        quantizer's output for the same tensor in `float_path` (an F32 twin
        written with the same seed and sizes)."""
        try:
            from gguf.quants import quantize
        except ImportError:
            print("note: this gguf has no gguf.quants.quantize; quantization not checked")
            return
        twin = {t.name: t for t in GGUFReader(float_path).tensors}
        compared = 0
        for name, t in self.tensors.items():
            if t.tensor_type.name == "F32" or name not in twin:
                continue
            x = np.asarray(twin[name].data, dtype=np.float32).reshape(-1, int(t.shape[0]))
            want = np.asarray(quantize(x, t.tensor_type)).reshape(-1).view(np.uint8)
            got = np.asarray(t.data).reshape(-1).view(np.uint8)
            differ = int((want != got).sum()) if want.size == got.size else got.size
            self.expect(differ == 0, f"tensor {name}: {differ} of {got.size} bytes differ from gguf.quants.quantize")
            compared += 1
        self.expect(compared > 0, f"no quantized tensor to compare with {float_path}")
        print(f"{compared} quantized tensors are byte-identical to gguf.quants.quantize of {float_path}"
              if not self.problems else f"compared {compared} quantized tensors with {float_path}")

    def check_values(self):
        """Dequantizes every tensor: norms must be 1, weights small and random."""
        try:
            from gguf.quants import dequantize
        except ImportError:
            print("note: this gguf has no gguf.quants.dequantize; values not checked")
            return
        for name, t in self.tensors.items():
            values = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float64).reshape(-1)
            self.expect(values.size == int(t.n_elements), f"tensor {name}: {values.size} values dequantized")
            if not np.all(np.isfinite(values)):
                self.problems.append(f"tensor {name} has non-finite values")
            elif name.endswith("norm.weight"):
                self.expect(np.all(values == 1.0), f"norm {name} is not all 1.0")
            else:
                std = float(values.std())
                self.expect(0.005 < std < 0.05 and abs(float(values.mean())) < 0.01,
                            f"tensor {name} has mean {values.mean():.4f} std {std:.4f}, expected ~N(0, 0.02)")


def main():
    parser = argparse.ArgumentParser(description="Check a GGUF file with the reference gguf reader.")
    parser.add_argument("path")
    parser.add_argument("--arch", help="expected general.architecture")
    parser.add_argument("--tensor-count", type=int, help="expected number of tensors")
    parser.add_argument("--expect-json", help="JSON file of expectations (see the module docstring)")
    parser.add_argument("--llama", help="derive every expectation of a Llama model: layers=,hidden=,heads=,...")
    parser.add_argument("--quantized-from", metavar="F32_GGUF",
                        help="an F32 twin (same seed and sizes): quantized tensors must match the reference quantizer")
    parser.add_argument("--quiet", action="store_true", help="print only problems and the verdict")
    args = parser.parse_args()

    reader = GGUFReader(args.path)
    c = Checker(reader)
    arch = c.metadata("general.architecture")
    version = c.metadata("GGUF.version")
    print(f"{args.path}: GGUF v{version}, architecture {arch}, {len(reader.tensors)} tensors")
    if not args.quiet:
        for t in reader.tensors:
            print(f"  {t.name:32s} {t.tensor_type.name:5s} {[int(d) for d in t.shape]}")

    if args.arch is not None:
        c.expect(arch == args.arch, f"architecture is {arch!r}, expected {args.arch!r}")
    if args.tensor_count is not None:
        c.expect(len(reader.tensors) == args.tensor_count,
                 f"{len(reader.tensors)} tensors, expected {args.tensor_count}")
    if args.expect_json:
        with open(args.expect_json) as f:
            spec = json.load(f)
        if "architecture" in spec:
            c.expect(arch == spec["architecture"], f"architecture is {arch!r}, expected {spec['architecture']!r}")
        if "tensor_count" in spec:
            c.expect(len(reader.tensors) == spec["tensor_count"],
                     f"{len(reader.tensors)} tensors, expected {spec['tensor_count']}")
        c.check_tensors({k: (v["type"], v["shape"]) for k, v in spec.get("tensors", {}).items()}, exact_set=False)
        c.check_metadata(spec.get("metadata", {}))
    if args.llama:
        tensors, metadata, vocab = llama_expectations(args.llama)
        c.expect(len(reader.tensors) == len(tensors), f"{len(reader.tensors)} tensors, expected {len(tensors)}")
        c.check_tensors(tensors, exact_set=True)
        c.check_metadata(metadata)
        if vocab == 259:
            c.check_byte_tokenizer(vocab)
        c.check_values()
    if args.quantized_from:
        c.check_quantized_from(args.quantized_from)

    for problem in c.problems:
        print(f"PROBLEM: {problem}")
    print("FAIL" if c.problems else "OK")
    return 1 if c.problems else 0


if __name__ == "__main__":
    sys.exit(main())
