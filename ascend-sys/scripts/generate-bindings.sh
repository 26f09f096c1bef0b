#!/usr/bin/env bash
# Regenerate ascend-sys/src/bindings/ from wrapper.h's own declarations (needs libclang: apt-get install libclang-dev).
# The toolkit variables are cleared so the committed file never depends on a local CANN install.
set -euo pipefail
cd "$(dirname "$0")/.."
env -u ASCEND_TOOLKIT_HOME -u ASCEND_HOME_PATH ASCEND_SYS_WRITE_BINDINGS="$PWD/src/bindings" cargo build -q -p ascend-sys --features bindgen
