#!/usr/bin/env bash
# Regenerates the committed Rust code for the Cap'n Proto schemas.
# Needs the `capnp` compiler (Debian: capnproto) and the Rust plugin
# (`cargo install capnpc --version 0.27.0`, which provides `capnpc-rust`).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="$here/../src/rpc/generated"
mkdir -p "$out"
capnp compile --output=rust:"$out" --src-prefix="$here" "$here"/tunnelrpc.capnp "$here"/quic_metadata_protocol.capnp
