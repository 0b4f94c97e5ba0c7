#!/usr/bin/env bash
# A/B of a kernel change on the GPU machine: the `flashsel` of a base
# revision beside the working tree's, interleaved in one device call.
#
#   bash bench/ab.sh build [REV]     here: builds REV (default HEAD) in a git
#                                    worktree and the working tree, strips
#                                    both binaries into .carry/ab/{base,new}
#                                    (emptied first)
#                                    (two unstripped release binaries exceed
#                                    the device tool's 64 MiB carry)
#   bash bench/ab.sh add NAME        here: the working tree's binary as one
#                                    more variant, .carry/ab/NAME (build the
#                                    next variant's edits, add, repeat: the
#                                    variants of one question in one call)
#   bash bench/ab.sh run GROUPS      there (carry .carry): for ROUNDS rounds
#                                    (default 2), `flashsel bench --backend
#                                    cuda --only GROUPS` of base, then of each
#                                    other variant in the order made (new
#                                    first; VARIANTS="a b" picks them); then
#                                    `flashsel check --only select` of the
#                                    last (CHECK=0 skips it, CHECK_ON=NAME
#                                    picks another; SEED, default 7;
#                                    FILTER=TEXT checks only the cases whose
#                                    description contains TEXT)
#
# Every step runs under its own timeout and writes its log to $OUT before the
# next starts, so a step that hangs costs its timeout, not the call's 600 s,
# and what finished still comes back. The first bench of each binary compiles
# its kernels (~15 s); `flashsel kernels` compiles every arch (~45 s) and is
# not needed.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.."
AB=.carry/ab
case "${1:-}" in
build)
    rev=${2:-HEAD}
    wt=$(mktemp -d /tmp/flashsel-ab.XXXXXX)
    rm -rf "$AB"  # a fresh comparison: no variants of an earlier one
    git worktree add --detach -f "$wt" "$rev" >/dev/null || exit 1
    (cd "$wt" && CARGO_TARGET_DIR=/tmp/flashsel-ab-target cargo build --release -q -p flashsel-cli) || exit 1
    cargo build --release -q -p flashsel-cli || exit 1
    mkdir -p "$AB/base" "$AB/new"
    strip -o "$AB/base/flashsel" /tmp/flashsel-ab-target/release/flashsel
    strip -o "$AB/new/flashsel" target/release/flashsel
    git worktree remove -f "$wt"
    echo "$AB/base: $(git rev-parse --short "$rev"), $AB/new: the working tree; $(du -sh "$AB" | cut -f1) to carry"
    ;;
add)
    name=${2:?"usage: bench/ab.sh add NAME"}
    cargo build --release -q -p flashsel-cli || exit 1
    mkdir -p "$AB/$name"
    strip -o "$AB/$name/flashsel" target/release/flashsel
    echo "$AB/$name: the working tree; variants: $(ls -tr "$AB" | tr '\n' ' ')($(du -sh "$AB" | cut -f1) to carry)"
    ;;
run)
    groups=${2:?"usage: bench/ab.sh run GROUPS (e.g. dsa,qsa-decode)"}
    OUT=${OUT:-/tmp/flashsel-ab}
    mkdir -p "$OUT"
    export FLASHSEL_CACHE_DIR=/tmp/fscache
    start=$(date +%s)
    step() { echo "=== [+$(($(date +%s) - start))s] $*"; }
    variants=${VARIANTS:-$(ls -tr "$AB" | grep -vx base | tr '\n' ' ')}
    last=$(echo $variants | awk '{print $NF}')
    for r in $(seq 1 "${ROUNDS:-2}"); do
        for v in base $variants; do
            step "bench --only $groups: $v, round $r"
            timeout "${BENCH_TIMEOUT:-150}" "$AB/$v/flashsel" bench --backend cuda --only "$groups" \
                >"$OUT/bench-$v-$r.log" 2>&1
            rc=$?
            echo "rc=$rc"
            grep -E "^(select|qsa|dsa|indexer|mla)|cases" "$OUT/bench-$v-$r.log"
            [ "$rc" = 0 ] || tail -3 "$OUT/bench-$v-$r.log"
        done
    done
    if [ "${CHECK:-1}" != 0 ]; then
        on=${CHECK_ON:-$last}
        step "check --only select --seed ${SEED:-7} ${FILTER:+--filter $FILTER}: $on"
        timeout "${CHECK_TIMEOUT:-240}" "$AB/$on/flashsel" check --only select --seed "${SEED:-7}" \
            ${FILTER:+--filter "$FILTER"} >"$OUT/check.log" 2>&1
        echo "rc=$?"
        tail -2 "$OUT/check.log"
    fi
    step done
    ;;
*)
    sed -n '2,29p' "${BASH_SOURCE[0]}"
    exit 2
    ;;
esac
