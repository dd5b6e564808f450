#!/usr/bin/env bash
# Coverage-guided fuzzing of every parser of outside input (fuzz/: libFuzzer through
# libfuzzer-sys on the stable toolchain, see fuzz/src/lib.rs for why and for each target's
# invariant).
#
#   scripts/fuzz.sh                     short run: every target for 8 s
#   scripts/fuzz.sh --budget 600        long run: every target for 10 minutes
#   scripts/fuzz.sh --budget 120 cri    some targets only
#
# Each target first replays fuzz/regressions/<target>/ (crashes found before, kept as
# regression inputs), then fuzzes from its seeds (written by the target itself from the
# project's fixtures) and its corpus in fuzz/corpus/<target>/. A crash is saved under
# fuzz/artifacts/<target>/ and fails the run. Prints executions and crashes per target.
set -euo pipefail
cd "$(dirname "$0")/.."

budget=8
targets=()
while [ $# -gt 0 ]; do
    case "$1" in
        --budget) budget="$2"; shift 2 ;;
        -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
        *) targets+=("$1"); shift ;;
    esac
done
all=(iptables_save ipset_save manifests validate compile rtnetlink xtables nft_events ipset_list nflog cri)
[ ${#targets[@]} -gt 0 ] || targets=("${all[@]}")

# What cargo-fuzz passes on nightly, minus the sanitizer: rustc's SanitizerCoverage pass with
# libFuzzer's counters, tables and comparison tracing (all stable codegen options).
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks"
export CARGO_TARGET_DIR="$PWD/fuzz/target"
# An explicit --target keeps the flags off build scripts and proc macros (they run on the host).
triple=$(rustc -vV | sed -n "s/^host: //p")
(cd fuzz && cargo build --release --bins --target "$triple" -q)
bin="$CARGO_TARGET_DIR/$triple/release"

failed=0
printf '%-14s %8s %12s %8s %8s\n' target seconds executions exec/s crashes
for t in "${targets[@]}"; do
    corpus="fuzz/corpus/$t" artifacts="fuzz/artifacts/$t" regress="fuzz/regressions/$t"
    mkdir -p "$corpus" "$artifacts"
    NPA_FUZZ_SEEDS="$corpus/seeds" "$bin/$t" -runs=0 "$corpus/seeds" >/dev/null 2>&1
    if [ -d "$regress" ] && [ -n "$(ls -A "$regress")" ]; then
        if ! "$bin/$t" -runs=1 "$regress"/* >"$artifacts/regressions.log" 2>&1; then
            echo "$t: a regression input fails again, see $artifacts/regressions.log"
            failed=1
            continue
        fi
    fi
    log="$artifacts/last-run.log"
    status=0
    "$bin/$t" -max_total_time="$budget" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
        -print_final_stats=1 -artifact_prefix="$artifacts/" "$corpus" "$corpus/seeds" \
        >"$log" 2>&1 || status=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    crashes=0
    if [ "$status" -ne 0 ]; then
        crashes=$(ls "$artifacts" | grep -cE '^(crash|timeout|oom|leak)-' || true)
        failed=1
    fi
    printf '%-14s %8s %12s %8s %8s\n' "$t" "$budget" "${execs:-?}" "${rate:-?}" "$crashes"
    [ "$status" -eq 0 ] || { grep -m3 -E 'panicked|ERROR|SUMMARY' "$log" || true; echo "  log: $log"; }
done
exit $failed
