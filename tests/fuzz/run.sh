#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + libFuzzer) in build-fuzz/ and
# runs each for FUZZ_SECONDS (default 30) from its seed corpus
# (tests/fuzz/seeds/<target>/), two at a time. Prints each target's exec
# count; exits non-zero on a crash, a failed oracle or an input that runs
# longer than 10 s. Skips (exit 0) when clang is absent, unless CI=true.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$ROOT}  # ccache hits across clones (tests/run.sh)
BUILD=${SPECSTREAM_FUZZ_BUILD:-$ROOT/build-fuzz}
SECONDS_PER_TARGET=${FUZZ_SECONDS:-30}

if ! command -v clang++ >/dev/null; then
  if [[ "${CI:-}" == "true" ]]; then echo "fuzz: clang++ missing" >&2; exit 1; fi
  echo "fuzz: clang++ not found, skipping"; exit 0
fi

cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_COMPILER=clang++ -DSPECSTREAM_BUILD_FUZZERS=ON -DSPECSTREAM_FUZZ_ONLY=ON \
  -DSPECSTREAM_BUILD_TESTS=OFF >/dev/null
TARGETS=(safetensors_fuzz tokenizer_fuzz job_spec_fuzz hf_config_fuzz stream_request_fuzz gguf_fuzz)
cmake --build "$BUILD" --target "${TARGETS[@]}"

run() {
  local name=$1; shift
  local corpus="$BUILD/corpus/$name"
  mkdir -p "$corpus"
  cp -n "$ROOT"/tests/fuzz/seeds/"$name"/* "$corpus"/ 2>/dev/null || true
  local log="$BUILD/$name.log"
  if ! "$BUILD/tests/fuzz/$name" -max_total_time="$SECONDS_PER_TARGET" -print_final_stats=1 \
        -rss_limit_mb=4096 -timeout=10 "$@" "$corpus" >"$log" 2>&1; then
    tail -50 "$log" >&2
    echo "fuzz: $name FAILED" >&2
    return 1
  fi
  local execs
  execs=$(grep -m1 'stat::number_of_executed_units' "$log" | awk '{print $2}')
  echo "fuzz: $name ran ${SECONDS_PER_TARGET}s, ${execs} execs, no crash"
}

# Two at a time, each keeping one core: three rounds of FUZZ_SECONDS.
failed=0
for ((i = 0; i < ${#TARGETS[@]}; i += 2)); do
  pids=()
  for name in "${TARGETS[@]:i:2}"; do
    run "$name" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
done
exit "$failed"
