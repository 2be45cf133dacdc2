#!/usr/bin/env bash
# Install the core and the xnnpack plugin alone into a fresh venv (reusing the
# wheels already downloaded) and check that exactly that backend is visible;
# then the same for the coreml plugin alone (xnnpack uninstalled).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$(mktemp -d)/venv
python3 -m venv "$venv"
"$venv/bin/pip" install -q torch==2.13.0
"$venv/bin/pip" install -q . plugins/xnnpack
got=$("$venv/bin/python" -c 'import edgeplug; print(",".join(edgeplug.backends()))')
echo "backends in a venv with only edgeplug-xnnpack: $got"
test "$got" = "xnnpack"
if "$venv/bin/python" -c 'import edgeplug_vulkan' 2>/dev/null; then
  echo "edgeplug_vulkan must not be installed by edgeplug-xnnpack" >&2; exit 1
fi
"$venv/bin/edgeplug" backends
"$venv/bin/pip" uninstall -q -y edgeplug-xnnpack
"$venv/bin/pip" install -q plugins/coreml
got=$("$venv/bin/python" -c 'import edgeplug; print(",".join(edgeplug.backends()))')
echo "backends in a venv with only edgeplug-coreml: $got"
test "$got" = "coreml"
# coremltools comes with executorch, so Core ML serializes in a plain install
"$venv/bin/python" -c 'import edgeplug, sys; a = edgeplug.get_backend("coreml").availability(); sys.exit(0 if a.ok else f"coreml unavailable alone: {a.reason}")'
"$venv/bin/edgeplug" backends
rm -rf "$(dirname "$venv")"
echo "single-plugin install: OK"
