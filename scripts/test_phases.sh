#!/usr/bin/env bash
# `make test`'s phases, one after another, each timed; the times are printed at the end,
# also when a phase fails (then the later phases do not run and the exit status is the
# failed phase's). Usage: test_phases.sh "name=command" ...
# A command of several parts joined by " ||| " runs them side by side, each into a log of
# its own that is printed, part by part, once all have ended; the phase fails if any part
# does (its status is the first failed part's).
set -uo pipefail

run_side_by_side() {
    local logs=() pids=() part status=0
    local dir; dir=$(mktemp -d)
    local rest=$1 index=0
    while :; do
        part=${rest%% ||| *}
        logs+=("$dir/$index.log")
        bash -c "$part" > "$dir/$index.log" 2>&1 &
        pids+=($!)
        index=$((index + 1))
        [[ $rest == *" ||| "* ]] || break
        rest=${rest#* ||| }
    done
    for index in "${!pids[@]}"; do
        wait "${pids[index]}"
        local part_status=$?
        [[ $status -ne 0 || $part_status -eq 0 ]] || status=$part_status
    done
    for log in "${logs[@]}"; do
        cat "$log"
    done
    rm -rf "$dir"
    return "$status"
}

names=() seconds=() statuses=()
status=0
for phase in "$@"; do
    name=${phase%%=*} command=${phase#*=}
    echo "=== make test: $name: $command"
    start=$(date +%s)
    if [[ $command == *" ||| "* ]]; then
        run_side_by_side "$command"
    else
        bash -c "$command"
    fi
    status=$?
    names+=("$name") seconds+=($(( $(date +%s) - start ))) statuses+=("$status")
    [[ $status -eq 0 ]] || break
done

total=0
echo
echo "=== make test: each phase's time"
for i in "${!names[@]}"; do
    total=$(( total + seconds[i] ))
    outcome=ok
    [[ ${statuses[i]} -eq 0 ]] || outcome="FAILED (exit ${statuses[i]})"
    printf '  %-30s %3d:%02d  %s\n' "${names[i]}" $(( seconds[i] / 60 )) $(( seconds[i] % 60 )) "$outcome"
done
printf '  %-30s %3d:%02d\n' total $(( total / 60 )) $(( total % 60 ))
exit "$status"
