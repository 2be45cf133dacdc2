#!/usr/bin/env bash
# QNN for real without a device: fetch the onnxruntime-qnn wheel (Qualcomm's
# x86-64 QNN libraries), lay them out as a QNN SDK folder in a temporary
# directory, and run the qnn plugin's saver-mode tests against them
# (plugins/qnn/tests/test_saver.py, test_saver_cli.py): every partition through ExecuTorch's QNN op
# builders and Qualcomm's QNN interface, recorded by QNN's saver backend.
#
# Fails (never skips) when the layout step fails or the libraries do not load.
# Usage: .ci/qnn_saver.sh [pytest args...]   (PY: the python with edgeplug installed)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
WHEEL_SPEC=${QNN_WHEEL_SPEC:-onnxruntime-qnn>=2.3.0}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

lay_out() {
  # (set -e does not hold inside a function called from `if`: each step says it failed)
  "$PY" -m pip download -q --no-deps --only-binary=:all: -d "$work/wheel" "$WHEEL_SPEC" || return 1
  local wheel
  wheel=$(ls "$work"/wheel/onnxruntime_qnn-*.whl) || return 1
  "$PY" -m zipfile -e "$wheel" "$work/unpacked" || return 1
  local pkg="$work/unpacked/onnxruntime_qnn" libs="$work/unpacked/onnxruntime_qnn.libs"
  local dest="$work/sdk/lib/x86_64-linux-clang"
  mkdir -p "$dest" || return 1
  cp "$pkg"/libQnn*.so "$dest"/ || return 1
  # ExecuTorch opens the HTP preparer under the SDK's name for it
  cp "$pkg"/libHtpPrepare.so "$dest"/libQnnHtpPrepare.so || return 1
  # the wheel's own libc++/libunwind, which the QNN libraries link by their hashed names
  cp "$libs"/* "$dest"/ || return 1
  for lib in libQnnSaver.so libQnnSystem.so libQnnHtp.so libQnnHtpPrepare.so; do
    test -s "$dest/$lib" || { echo "qnn_saver: $wheel has no $lib" >&2; return 1; }
  done
}

if ! lay_out; then
  echo "qnn_saver: laying out the QNN libraries from $WHEEL_SPEC failed" >&2
  exit 1
fi

export QNN_SDK_ROOT="$work/sdk"
export LD_LIBRARY_PATH="$QNN_SDK_ROOT/lib/x86_64-linux-clang${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export EDGEPLUG_QNN_SAVER_DIR="$work/saver"
export EDGEPLUG_QNN_SAVER_REQUIRED=1  # the tests fail instead of skipping if the libraries do not load
mkdir -p "$EDGEPLUG_QNN_SAVER_DIR"
echo "qnn_saver: QNN libraries from $(basename "$(ls "$work"/wheel/*.whl)") under \$QNN_SDK_ROOT/lib/x86_64-linux-clang"
"$PY" -m pytest -q -p no:cacheprovider plugins/qnn/tests/test_saver.py plugins/qnn/tests/test_saver_cli.py "$@"
