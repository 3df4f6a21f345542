#!/usr/bin/env bash
# hubnorm against its peers (faiss, numpy, POT, scipy), with the machine's f32 peak.
#
#   benches/peers/run.sh --sizes dev,10k --threads 1,2        # see benches/peers/README.md
#   benches/peers/run.sh --summarize benches/runs/2025-11-23  # regenerate summary.md from raw.csv
#
# Environment:
#   HUBNORM_BIN          use this hubnorm binary instead of building one (cargo build --release)
#   CARGO_TARGET_DIR     honoured by the build; the binary is $CARGO_TARGET_DIR/release/hubnorm
#   HUBNORM_BENCH_VENV   the Python virtual environment (default ~/.cache/hubnorm/bench-venv)
#   HUBNORM_BENCH_PYTHON the interpreter that creates it (default python3.11)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
venv="${HUBNORM_BENCH_VENV:-$HOME/.cache/hubnorm/bench-venv}"
python="${HUBNORM_BENCH_PYTHON:-python3.11}"
req="$here/requirements.txt"

# 1. the virtual environment, reinstalled when requirements.txt changes
if [ ! -x "$venv/bin/python" ]; then
    command -v "$python" >/dev/null || { echo "error: $python not found (set HUBNORM_BENCH_PYTHON)" >&2; exit 2; }
    echo "creating $venv ($("$python" --version 2>&1))" >&2
    "$python" -m venv "$venv"
fi
stamp="$venv/.hubnorm-bench-requirements"
want="$(sha256sum "$req" | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
    echo "installing $(grep -v '^#' "$req" | tr '\n' ' ')into $venv" >&2
    "$venv/bin/python" -m pip install --quiet --upgrade pip
    "$venv/bin/python" -m pip install --quiet -r "$req"
    echo "$want" > "$stamp"
fi

# 2. hubnorm (not needed to regenerate a summary)
summarize=0
for arg in "$@"; do
    case "$arg" in --summarize|--summarize=*|-h|--help) summarize=1 ;; esac
done
if [ "$summarize" = 0 ] && [ -z "${HUBNORM_BIN:-}" ]; then
    echo "building hubnorm (cargo build --release)" >&2
    (cd "$repo" && cargo build --release --quiet)
    target="${CARGO_TARGET_DIR:-target}"
    case "$target" in /*) ;; *) target="$repo/$target" ;; esac
    HUBNORM_BIN="$target/release/hubnorm"
fi
export HUBNORM_BIN="${HUBNORM_BIN:-}"

# 3. the benchmark
export PYTHONDONTWRITEBYTECODE=1
exec "$venv/bin/python" "$here/bench.py" "$@"
