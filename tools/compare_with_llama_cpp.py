#!/usr/bin/env python3
"""Greedy decoding of tandem compared with llama.cpp on the same GGUF file.

The strongest outside check available on a CPU machine: llama.cpp (through the
PyPI package llama-cpp-python, which compiles it) and `tandem generate` decode
the same prompts greedily; the script reports, per prompt, whether the prompt
token ids agree and how many generated tokens agree before the first
difference. The two engines compute differently (llama.cpp quantizes the
activations to 8 bits for its Q4_1 and Q8_0 dot products; tandem dequantizes
the weights to float32), so a near tie between two tokens may resolve
differently late in a long continuation.

Not part of ctest (building llama-cpp-python takes minutes):
    pip install llama-cpp-python
    tools/compare_with_llama_cpp.py --tandem build/bin/tandem --max-tokens 32
"""
import argparse
import json
import subprocess
import sys

PROMPTS = [
    "The capital of France is",
    "Water boils at a temperature of",
    "The three primary colors are",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The largest planet in our solar system is",
    "To make a cup of tea, first",
    "1, 2, 3, 4, 5,",
    "The chemical symbol for gold is",
    "In 1492, Christopher Columbus",
]


def llama_cpp_greedy(llm, prompt, max_tokens):
    ids = llm.tokenize(prompt.encode("utf-8"), add_bos=False, special=True)
    out = []
    for token in llm.generate(ids, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0, reset=True):
        if token == llm.token_eos() or len(out) == max_tokens:
            break
        out.append(token)
    return ids, out


def tandem_greedy(binary, model, prompt, max_tokens):
    result = subprocess.run(
        [binary, "generate", "--model", model, "--prompt", prompt, "--max-tokens", str(max_tokens), "--json",
         "--threads", "2"],
        check=True, capture_output=True, text=True)
    answer = json.loads(result.stdout)
    ids = answer["ids"]
    if answer["finish_reason"] == "stop" and ids:
        ids = ids[:-1]  # the EOS token, which llama.cpp does not yield
    return answer["prompt_ids"], ids


def llama_cpp_perplexity(model, path):
    """Perplexity of the whole file as one chunk, every token after the first scored."""
    import math
    from llama_cpp import Llama
    llm = Llama(model_path=model, n_ctx=2048, n_threads=2, verbose=False, logits_all=True)
    tokens = llm.tokenize(open(path, encoding="utf-8").read().encode("utf-8"), add_bos=False, special=True)
    llm.eval(tokens)
    nll = 0.0
    for j in range(len(tokens) - 1):
        row = llm.scores[j]
        top = max(row)
        lse = top + math.log(sum(math.exp(v - top) for v in row))
        nll += lse - row[tokens[j + 1]]
    return math.exp(nll / (len(tokens) - 1)), len(tokens) - 1


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    parser.add_argument("--tandem", default="build/bin/tandem")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--text", default="tests/data/paragraph.txt", help="file for the perplexity comparison")
    args = parser.parse_args()
    try:
        from llama_cpp import Llama
    except ImportError:
        sys.exit("llama-cpp-python is not installed: pip install llama-cpp-python")
    llm = Llama(model_path=args.model, n_ctx=512, n_threads=2, verbose=False, seed=0)
    full = 0
    for prompt in PROMPTS:
        ref_prompt, ref = llama_cpp_greedy(llm, prompt, args.max_tokens)
        got_prompt, got = tandem_greedy(args.tandem, args.model, prompt, args.max_tokens)
        agree = 0
        while agree < min(len(ref), len(got)) and ref[agree] == got[agree]:
            agree += 1
        same = ref_prompt == got_prompt and ref == got
        full += same
        print(f"{'agree' if same else 'DIFFER'}  prompt ids {'equal' if ref_prompt == got_prompt else 'DIFFER'}, "
              f"{agree}/{len(ref)} tokens before the first difference: {prompt!r}")
        if not same:
            print(f"    llama.cpp: {llm.detokenize(ref).decode('utf-8', 'replace')!r}")
            print(f"    tandem:    {llm.detokenize(got).decode('utf-8', 'replace')!r}")
    print(f"{full}/{len(PROMPTS)} prompts: identical greedy tokens ({args.max_tokens} tokens each)")
    ppl, n = llama_cpp_perplexity(args.model, args.text)
    ours = subprocess.run([args.tandem, "perplexity", "--model", args.model, "--file", args.text],
                          check=True, capture_output=True, text=True).stdout.strip()
    print(f"perplexity of {args.text}: llama.cpp {ppl:.4f} over {n} tokens; tandem {ours}")


if __name__ == "__main__":
    main()
