#!/usr/bin/env bash
# The runs behind docs/performance.md's issue 22 tables, in one go on a quiet machine.
#
#   bash bench/perf_tables.sh OUT_DIR [PART...]
#
# PARTs (default: all): modes (full against top-k logits, one board, 16 clients, four sampling
# settings), batches (the default package at concurrency 1/4/8/16: one decode cohort of batch
# 1/4/8/16 each, full and top-k), host (bench/host_cpu.py: CPU per token by process and thread,
# TTFT and TPOT direct against the gateway, time scales 0 and 1), steps (bench/step_gap.py: where
# the host's time between two decode steps goes), workers (4 boards behind a gateway of 1, 2 and 4
# workers). Every calctl bench run writes its JSON into OUT_DIR; `python bench/perf_tables.py
# OUT_DIR` prints the tables from them. PERF_QUICK=1 shrinks every run to a few short requests
# (a smoke check of the script, not figures).
set -euo pipefail
QUICK=${PERF_QUICK:-0}

OUT=${1:?usage: perf_tables.sh OUT_DIR [PART...]}
shift
PARTS=${*:-modes batches host steps workers}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY="$ROOT/.venv/bin/python"
CALCTL="$ROOT/.venv/bin/calctl"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d /tmp/perf-tables.XXXXXX)
mkdir -p "$WORK/run"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

build() {  # build NAME [build-sim flags...]
  local name=$1
  shift
  [ -d "$WORK/models/$name" ] || "$CALCTL" package build-sim --preset qwen3-30b-a3b "$@" "$WORK/models/$name" >/dev/null
}

wait_ready() {  # wait_ready GATEWAY_SOCKET [BOARDS]: until the gateway routes qwen to BOARDS boards (1)
  local want=${2:-1}
  for _ in $(seq 1 600); do
    if curl -s --unix-socket "$1" http://g/ready 2>/dev/null |
      "$PY" -c "import json,sys; sys.exit(json.load(sys.stdin)['models'].get('qwen', 0) < $want)" 2>/dev/null; then
      return 0
    fi
    sleep 0.2
  done
  echo "gateway on $1 never saw $want ready boards" >&2
  return 1
}

start_daemon() {  # start_daemon NAME PACKAGE BOARD: a board daemon on $WORK/NAME.sock, time scale 1
  "$PY" -m calculet.daemon.main --listen "unix:$WORK/$1.sock" --models-root "$WORK/models" \
    --model "qwen=$2" --time-scale 1 --log-level WARNING --board "$3" --runtime-dir "$WORK/run" \
    >"$WORK/$1.daemon.log" 2>&1 &
  PIDS+=($!)
}

serve() {  # serve NAME PACKAGE [gateway flags...]: one board and a gateway on Unix sockets
  local name=$1 package=$2
  shift 2
  start_daemon "$name" "$package" 0
  "$PY" -m calculet.gateway.main --listen "unix:$WORK/$name.gw.sock" --daemon "unix:$WORK/$name.sock" \
    --log-level WARNING "$@" >"$WORK/$name.gateway.log" 2>&1 &
  PIDS+=($!)
  wait_ready "$WORK/$name.gw.sock"
}

stop_all() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  PIDS=()
}

bench() {  # bench JSON_NAME GATEWAY_SOCKET PACKAGE CONCURRENCY REQUESTS [calctl bench flags...]
  local json=$1 gw=$2 package=$3 c=$4 n=$5 out=128
  shift 5
  if [ "$QUICK" = 1 ]; then n=$c out=8; fi
  "$CALCTL" bench --gateway "unix:$gw" --model qwen --concurrency "$c" --requests "$n" --warmup "$c" \
    --prompt-len 16:128 --output-len "$out" --ignore-eos --seed 0 --no-progress \
    --timing-package "$WORK/models/$package" --time-scale 1 "$@" --json "$OUT/$json.json" >/dev/null
  echo "  $json done"
}

build full
build topk --logits-topk 256

for part in $PARTS; do
  case $part in
  modes)
    echo "modes: full against top-k logits, 16 clients (one decode cohort of batch 16)"
    for mode in full topk; do
      serve "modes-$mode" "$mode"
      gw="$WORK/modes-$mode.gw.sock"
      bench "modes-$mode-greedy" "$gw" "$mode" 16 96 --temperature 0
      bench "modes-$mode-topk40" "$gw" "$mode" 16 96 --temperature 0.8 --top-k 40
      bench "modes-$mode-topp" "$gw" "$mode" 16 96 --temperature 0.8 --top-p 0.9
      bench "modes-$mode-t1" "$gw" "$mode" 16 96
      stop_all
    done
    ;;
  batches)
    echo "batches: the default package at 1/4/8/16 clients (server default sampling: T=1)"
    for mode in full topk; do
      serve "batches-$mode" "$mode"
      gw="$WORK/batches-$mode.gw.sock"
      for c in 1 4 8 16; do
        bench "batches-$mode-c$c" "$gw" "$mode" "$c" $((c < 4 ? 12 : 6 * c))
      done
      stop_all
    done
    ;;
  host)
    echo "host: CPU per token, TTFT and TPOT, direct against the gateway"
    "$PY" "$ROOT/bench/host_cpu.py" --tokens 128 --time-scales 0,1 --concurrency 1,16 --repeat 3 \
      >"$OUT/host_cpu.txt" 2>&1
    "$PY" "$ROOT/bench/host_cpu.py" --tokens 32 --time-scales 0 --concurrency 1 --rounds 40 --repeat 3 \
      >"$OUT/host_cpu_ttft.txt" 2>&1
    echo "  host_cpu done"
    ;;
  steps)
    echo "steps: the host's time between two decode steps, in-process"
    "$PY" "$ROOT/bench/step_gap.py" --batches 1,4,8,16 --modes full,topk >"$OUT/step_gap_greedy.txt" 2>&1
    "$PY" "$ROOT/bench/step_gap.py" --batches 16 --modes full,topk --temperature 1 >"$OUT/step_gap_t1.txt" 2>&1
    echo "  step_gap done"
    ;;
  workers)
    echo "workers: 4 boards behind a gateway of 1, 2 and 4 workers, 64 clients"
    for w in 1 2 4; do
      for b in 0 1 2 3; do start_daemon "w$w-b$b" full "$b"; done
      daemons=()
      for b in 0 1 2 3; do daemons+=(--daemon "unix:$WORK/w$w-b$b.sock"); done
      "$PY" -m calculet.gateway.main --listen "unix:$WORK/w$w.gw.sock" "${daemons[@]}" --workers "$w" \
        --log-level WARNING >"$WORK/w$w.gateway.log" 2>&1 &
      gw_pid=$!
      PIDS+=("$gw_pid")
      wait_ready "$WORK/w$w.gw.sock" 4
      n=320 out=128
      if [ "$QUICK" = 1 ]; then n=64 out=8; fi
      "$PY" "$ROOT/bench/process_cpu.py" --pid "$gw_pid" --out "$OUT/workers-$w.cpu.json" -- \
        "$CALCTL" bench --gateway "unix:$WORK/w$w.gw.sock" --model qwen --concurrency 64 --requests "$n" \
        --warmup 64 --prompt-len 16:128 --output-len "$out" --ignore-eos --seed 0 --no-progress \
        --timing-package "$WORK/models/full" --time-scale 1 --json "$OUT/workers-$w.json" >/dev/null
      curl -sf --unix-socket "$WORK/w$w.gw.sock" http://g/metrics >"$OUT/workers-$w.metrics.txt" || true
      echo "  workers $w done"
      stop_all
    done
    ;;
  *)
    echo "unknown part $part" >&2
    exit 2
    ;;
  esac
done
