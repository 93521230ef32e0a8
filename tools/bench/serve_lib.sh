# Sourced by the serving benchmarks (serve_bench.sh, serve_cpu.sh).

# A free TCP port on 127.0.0.1.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# start_serve BIN LOG PORT [tandem serve flags]: starts `BIN/tandem serve` with
# its OpenAI API on PORT, output to LOG, sets $serve to its pid and stops it
# on exit, and returns once /ready answers (exits 1 with the log if it dies).
start_serve() {
  local bin=$1 log=$2 port=$3
  shift 3
  "$bin/tandem" serve --port "$port" "$@" > "$log" 2>&1 &
  serve=$!
  trap 'kill $serve 2>/dev/null; wait $serve 2>/dev/null || true' EXIT
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$port/ready" > /dev/null && return 0
    kill -0 "$serve" 2>/dev/null || { cat "$log"; exit 1; }
    sleep 0.2
  done
}
