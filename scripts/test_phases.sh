#!/usr/bin/env bash
# `make test`'s phases, one after another, each timed; the times are printed at the end,
# also when a phase fails (then the later phases do not run and the exit status is the
# failed phase's). Usage: test_phases.sh "name=command" ...
set -uo pipefail

names=() seconds=() statuses=()
status=0
for phase in "$@"; do
    name=${phase%%=*} command=${phase#*=}
    echo "=== make test: $name: $command"
    start=$(date +%s)
    bash -c "$command"
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
    printf '  %-22s %3d:%02d  %s\n' "${names[i]}" $(( seconds[i] / 60 )) $(( seconds[i] % 60 )) "$outcome"
done
printf '  %-22s %3d:%02d\n' total $(( total / 60 )) $(( total % 60 ))
exit "$status"
