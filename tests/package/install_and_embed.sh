#!/usr/bin/env bash
# install_and_embed.sh BUILD_DIR SOURCE_DIR TETRA_BIN: installs libtetra and the tetra binary
# from BUILD_DIR into a temporary prefix, builds examples/embed against it, and compares its
# greedy text with the CLI's on the tiny fixture model.
set -euo pipefail
build=$1 src=$2 tetra=$3
model="$src/tests/fixtures/qwen3_moe-tiny"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cmake --install "$build" --prefix "$work/prefix" >"$work/install.log"
test -f "$work/prefix/include/tetra/runtime/generate.h" || { echo "headers were not installed"; exit 1; }
test ! -e "$work/prefix/include/tetra/ops/cuda" || { echo "the CUDA headers must stay out of the package"; exit 1; }
test -x "$work/prefix/bin/tetra" || { echo "the tetra binary was not installed"; exit 1; }
"$work/prefix/bin/tetra" inspect --model "$src/tests/fixtures/qwen3_moe-tiny" >/dev/null ||
  { echo "the installed tetra binary does not run"; exit 1; }
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S "$src/examples/embed" -B "$work/build" "${generator[@]}" -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_BUILD_TYPE=Release >"$work/configure.log" 2>&1 || { cat "$work/configure.log"; exit 1; }
cmake --build "$work/build" >"$work/build.log" 2>&1 || { tail -40 "$work/build.log"; exit 1; }

prompt="def main():"
got=$("$work/build/embed" "$model" "$prompt" 8)
want=$("$tetra" generate --model "$model" --prompt "$prompt" --max-new-tokens 8 --json |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["text"])')
if [[ "$got" != "$want" ]]; then
  echo "embed printed:    $(printf %q "$got")"
  echo "tetra generate:   $(printf %q "$want")"
  exit 1
fi
echo "embedded generation matches tetra generate: $(printf %q "$got")"
