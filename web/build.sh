#!/usr/bin/env bash
# Build the browser app into web/dist/ (static files: serve with any static server, e.g.
# `python3 -m http.server -d web/dist`). No tool downloads binaries: wasm-bindgen's CLI is
# built from crates.io with cargo, at the exact version of the `wasm-bindgen` crate in
# Cargo.lock (the two must match), if it is not installed yet.
#
# Environment: PROFILE (release, the default; `dev` for a quicker, slower build).
set -euo pipefail
cd "$(dirname "$0")/.."
PROFILE=${PROFILE:-release}

rustup target add wasm32-unknown-unknown >/dev/null 2>&1 || true
version=$(grep -A1 '^name = "wasm-bindgen"$' Cargo.lock | sed -n 's/^version = "\(.*\)"/\1/p')
if [ -z "$version" ]; then
    echo "web/build.sh: no wasm-bindgen in Cargo.lock" >&2
    exit 1
fi
# cargo install puts it here, which may not be on PATH.
export PATH="$PATH:${CARGO_HOME:-$HOME/.cargo}/bin"
if ! command -v wasm-bindgen >/dev/null || [ "$(wasm-bindgen --version | awk '{print $2}')" != "$version" ]; then
    echo "web/build.sh: installing wasm-bindgen-cli $version (once; a few minutes)…"
    # Lightly optimized: it runs once per bundle, in seconds either way, and compiles in
    # about half the time (CI builds it on every fresh machine).
    CARGO_PROFILE_RELEASE_OPT_LEVEL=1 cargo install wasm-bindgen-cli --version "$version"
fi

# The library as a cdylib for the browser (SIMD on: .cargo/config.toml).
cargo rustc --lib --profile "$PROFILE" --target wasm32-unknown-unknown \
    --no-default-features --features web --crate-type cdylib
dir=$([ "$PROFILE" = dev ] && echo debug || echo "$PROFILE")
wasm="target/wasm32-unknown-unknown/$dir/grpo_lab.wasm"

rm -rf web/dist
mkdir -p web/dist
# Without the name and producers sections: 16 MB instead of 17.6 (panics still say what).
wasm-bindgen --target web --no-typescript --remove-name-section --remove-producers-section \
    --out-dir web/dist "$wasm"
cp web/index.html web/dist/
size=$(stat -c %s web/dist/grpo_lab_bg.wasm)
gz=$(gzip -9 -c web/dist/grpo_lab_bg.wasm | wc -c)
echo "web/dist: grpo_lab_bg.wasm $((size / 1024)) KiB ($((gz / 1024)) KiB gzipped)"
