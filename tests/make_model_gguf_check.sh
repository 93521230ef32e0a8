#!/usr/bin/env bash
# Writes models with `tandem make-model` and checks them with llama.cpp's
# own Python reader (tools/check_gguf.py, PyPI gguf). Exits 77 (ctest: skip)
# when the Python environment with gguf is missing.
#
#   make_model_gguf_check.sh TANDEM PYTHON CHECK_GGUF_PY OUT_DIR
set -euo pipefail
tandem=$1 python=$2 check=$3 out=$4

if [[ ! -x "$python" ]]; then
  echo "SKIP: $python not found (tools/setup.sh creates .venv with the gguf package)"
  exit 77
fi
if ! "$python" -c "import gguf, numpy" 2>/dev/null; then
  echo "SKIP: $python has no gguf module (pip install gguf)"
  exit 77
fi
mkdir -p "$out"
sizes="--layers 2 --hidden 64 --heads 4 --kv-heads 2 --intermediate 96 --context 512 --seed 7"
spec="layers=2,hidden=64,heads=4,kv_heads=2,intermediate=96,context=512,vocab=259,rope_base=10000"

# Setting 1: f32, tied embeddings.
"$tandem" make-model --output "$out/f32.gguf" --type f32 $sizes
"$python" "$check" "$out/f32.gguf" --quiet --llama "$spec,type=F32,tied=1"

# Setting 2: q4_1, untied, same seed: the blocks must be byte-identical to
# the reference quantizer applied to the f32 model's weights.
"$tandem" make-model --output "$out/q4_1.gguf" --type q4_1 --no-tied-embeddings $sizes
"$python" "$check" "$out/q4_1.gguf" --quiet --llama "$spec,type=Q4_1,tied=0" --quantized-from "$out/f32.gguf"
