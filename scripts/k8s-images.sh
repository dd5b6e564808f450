#!/usr/bin/env bash
# The images a cluster on this machine needs, made without a registry or a Docker engine
# (issue 36; called by `scripts/k8s.sh build|images`, which builds the binaries first):
#   - base images: Debian 12 (debootstrap, minbase) as debian:12-slim, and that plus the Rust
#     toolchain at the crate's rust-version as rust:1.89.0-slim-bookworm;
#   - registry.k8s.io/pause and registry.k8s.io/e2e-test-images/agnhost under the tags the e2e
#     binary asks for (its --list-images), agnhost also under network-policy-api's tag (its
#     suite runs `/bin/bash -c`, so agnhost sits on the Debian base);
#   - registry.k8s.io/conformance:v<k8s> (e2e.test, ginkgo, kubectl and go-runner, as
#     upstream's test/conformance/image lays them out) and sonobuoy/sonobuoy:v<version>: what
#     `sonobuoy run --plugin e2e` starts;
#   - the agent, built from deploy/Dockerfile over those bases (buildah bud). With
#     NETPOL_AGENT_BINARY=<path> (the test command passes its own `cargo build --release`
#     binary), the Dockerfile's `build` stage is replaced by that binary (buildah's
#     --build-context build=<dir>: the stage is skipped, its Rust toolchain image is not
#     needed) and the runtime stage is the Dockerfile's, unchanged; the binary must run in
#     that stage (same Debian release, so the same glibc), which is checked, and a binary that
#     does not is refused by name, never shipped.
# Each is saved as a docker-archive tarball in target/k8s/images/ (list.txt names them), for
# `ctr -n k8s.io images import` on every node. Stamps as in k8s.sh: unchanged inputs, no work.
#
#   bash scripts/k8s-images.sh [--k8s VERSION]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
k8s_args=()
if [ "${1:-}" = --k8s ]; then k8s_args=(--k8s "$2"); fi
eval "$(bash scripts/k8s.sh paths "${k8s_args[@]}")"
# shellcheck source=../e2e/k8s/versions.env
source e2e/k8s/versions.env
OUT=$(dirname "$IMAGES_DIR")
mkdir -p "$IMAGES_DIR"
export BUILDAH_ISOLATION=chroot
# The agent's version: its image tag (deploy/kustomization.yaml names the same).
AGENT_VERSION=$(awk -F'"' '/^version *=/ { print $2; exit }' Cargo.toml)
AGENT_IMAGE=${NETPOL_AGENT_IMAGE:-ghcr.io/netpol-agent/netpol-agent:v$AGENT_VERSION}
# network-policy-api v0.2.0's conformance manifests name agnhost 2.45.
NPA_AGNHOST=2.45
RUST_IMAGE=docker.io/library/rust:1.89.0-slim-bookworm
DEBIAN_IMAGE=docker.io/library/debian:12-slim

# This machine's trust store, lent to the build steps that fetch over TLS (rustup, cargo):
# a network that inspects TLS (as this project's machines' does) signs with a CA only the
# host trusts. It is mounted for those steps only, never copied into an image.
CA_FILE=/etc/ssl/certs/ca-certificates.crt
TRUST=()
[ -f "$CA_FILE" ] && TRUST=(-v "$CA_FILE:/etc/ssl/certs/ca-certificates.crt:ro")

say() { echo "=== k8s-images.sh: $*"; }
die() { echo "k8s-images.sh: $*" >&2; exit 1; }

need=()
command -v buildah >/dev/null || need+=(buildah)
command -v debootstrap >/dev/null || need+=(debootstrap)
if [ ${#need[@]} -gt 0 ]; then
  say "installing ${need[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null \
    || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null; }
fi

hash_of() { { cat "$0"; for f in "$@"; do echo "== $f"; cat "$f"; done; } | sha256sum | cut -c1-16; }
stamped() { [ -f "$1" ] && [ "$(cat "$1")" = "$2" ]; }

# Saves image(s) (first one names the file) as one docker-archive tarball.
save() {
  local file=$1
  shift
  rm -f "$IMAGES_DIR/$file"
  local refs=()
  for t in "$@"; do refs+=("$t"); done
  # buildah writes one tag per archive; the others are added at import by the cluster script
  # (list.txt: file, then every name it carries).
  buildah push -q "${refs[0]}" "docker-archive:$IMAGES_DIR/$file:${refs[0]}" >/dev/null
  grep -v "^$file " "$IMAGES_DIR/list.txt" 2>/dev/null >"$IMAGES_DIR/list.new" || true
  echo "$file ${refs[*]}" >>"$IMAGES_DIR/list.new"
  mv "$IMAGES_DIR/list.new" "$IMAGES_DIR/list.txt"
}

# --- base images -------------------------------------------------------------------------
rootfs_tar=$OUT/rootfs/bookworm-minbase.tar
if [ ! -s "$rootfs_tar" ]; then
  say "debootstrap bookworm (minbase)"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  debootstrap --variant=minbase bookworm "$work/root" http://deb.debian.org/debian >"$OUT/rootfs-debootstrap.log" 2>&1 \
    || die "debootstrap failed; its log: $OUT/rootfs-debootstrap.log"
  rm -rf "$work/root"/var/cache/apt/archives/*.deb "$work/root"/var/lib/apt/lists/* \
    "$work/root"/usr/share/doc/* "$work/root"/usr/share/man/*
  echo "deb http://deb.debian.org/debian bookworm main" >"$work/root/etc/apt/sources.list"
  echo "deb http://deb.debian.org/debian-security bookworm-security main" >>"$work/root/etc/apt/sources.list"
  mkdir -p "$OUT/rootfs"
  tar -C "$work/root" --numeric-owner -cf "$rootfs_tar.tmp" .
  mv "$rootfs_tar.tmp" "$rootfs_tar"
  rm -rf "$work"
  trap - EXIT
fi

base_hash=$(sha256sum "$rootfs_tar" | cut -c1-16)
if ! stamped "$IMAGES_DIR/.debian" "$base_hash"; then
  say "$DEBIAN_IMAGE from the debootstrap root"
  c=$(buildah from scratch)
  buildah add -q "$c" "$rootfs_tar" / >/dev/null
  buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --cmd /bin/bash "$c"
  buildah commit -q --rm "$c" "$DEBIAN_IMAGE" >/dev/null
  echo "$base_hash" >"$IMAGES_DIR/.debian"
fi

rust_hash=$(echo "$base_hash rust 1.89.0" | sha256sum | cut -c1-16)
if [ -z "${NETPOL_AGENT_BINARY:-}" ] && ! stamped "$IMAGES_DIR/.rust" "$rust_hash"; then
  say "$RUST_IMAGE (Debian 12 + rustup's 1.89.0, minimal profile)"
  c=$(buildah from --pull-never "$DEBIAN_IMAGE")
  buildah config --env RUSTUP_HOME=/usr/local/rustup --env CARGO_HOME=/usr/local/cargo \
    --env PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$c"
  buildah run "$c" -- sh -c 'apt-get update -qq && apt-get install -y -qq --no-install-recommends ca-certificates curl gcc libc6-dev >/dev/null && rm -rf /var/lib/apt/lists/*' \
    || die "the Rust base image: apt-get failed"
  buildah run "${TRUST[@]}" "$c" -- sh -c 'curl -sSf --retry 3 https://static.rust-lang.org/rustup/dist/x86_64-unknown-linux-gnu/rustup-init -o /tmp/rustup-init \
    && chmod +x /tmp/rustup-init && /tmp/rustup-init -y -q --no-modify-path --profile minimal --default-toolchain 1.89.0 \
    && rm /tmp/rustup-init && rustc --version' || die "the Rust base image: rustup failed"
  buildah commit -q --rm "$c" "$RUST_IMAGE" >/dev/null
  echo "$rust_hash" >"$IMAGES_DIR/.rust"
fi

# --- pause, agnhost --------------------------------------------------------------------------
h=$(hash_of "$K8S_BIN/pause")
if ! stamped "$IMAGES_DIR/.pause-$PAUSE_VERSION" "$h"; then
  say "registry.k8s.io/pause:$PAUSE_VERSION"
  c=$(buildah from scratch)
  buildah copy -q "$c" "$K8S_BIN/pause" /pause >/dev/null
  buildah config --entrypoint '["/pause"]' --user 65535:65535 "$c"
  buildah commit -q --rm "$c" "registry.k8s.io/pause:$PAUSE_VERSION" >/dev/null
  save "pause-$PAUSE_VERSION.tar" "registry.k8s.io/pause:$PAUSE_VERSION"
  echo "$h" >"$IMAGES_DIR/.pause-$PAUSE_VERSION"
fi

h=$(echo "$base_hash $(hash_of "$K8S_BIN/agnhost")" | sha256sum | cut -c1-16)
if ! stamped "$IMAGES_DIR/.agnhost-$AGNHOST_VERSION" "$h"; then
  say "registry.k8s.io/e2e-test-images/agnhost:$AGNHOST_VERSION (and :$NPA_AGNHOST)"
  c=$(buildah from --pull-never "$DEBIAN_IMAGE")
  buildah copy -q "$c" "$K8S_BIN/agnhost" /agnhost >/dev/null
  # As upstream's image: /agnhost is the entrypoint and `pause` the default command (a
  # container that names no command, like network-policy-api's clients, just stays up).
  buildah config --cmd '' "$c"
  buildah config --entrypoint '["/agnhost"]' --cmd pause "$c"
  buildah commit -q --rm "$c" "registry.k8s.io/e2e-test-images/agnhost:$AGNHOST_VERSION" >/dev/null
  save "agnhost-$AGNHOST_VERSION.tar" "registry.k8s.io/e2e-test-images/agnhost:$AGNHOST_VERSION" \
    "registry.k8s.io/e2e-test-images/agnhost:$NPA_AGNHOST"
  echo "$h" >"$IMAGES_DIR/.agnhost-$AGNHOST_VERSION"
fi

# --- sonobuoy and its e2e plugin -------------------------------------------------------------
h=$(echo "$base_hash $(hash_of "$K8S_BIN/e2e.test" "$K8S_BIN/ginkgo" "$K8S_BIN/kubectl" "$K8S_BIN/go-runner")" | sha256sum | cut -c1-16)
if ! stamped "$IMAGES_DIR/.conformance-$K8S_VERSION" "$h"; then
  say "registry.k8s.io/conformance:v$K8S_VERSION"
  c=$(buildah from --pull-never "$DEBIAN_IMAGE")
  buildah copy -q "$c" "$K8S_BIN/e2e.test" "$K8S_BIN/ginkgo" "$K8S_BIN/kubectl" /usr/local/bin/ >/dev/null
  buildah copy -q "$c" "$K8S_BIN/go-runner" /usr/local/bin/kubeconformance >/dev/null
  buildah copy -q "$c" "$K8S_BIN/go-runner" /gorunner >/dev/null
  buildah copy -q "$c" "$K8S_BIN/go-runner" /run_e2e.sh >/dev/null
  buildah config --cmd '' --env 'E2E_FOCUS=\[Conformance\]' --env E2E_SKIP= --env E2E_PROVIDER=local \
    --env E2E_PARALLEL=1 --env E2E_VERBOSITY=4 --env RESULTS_DIR=/tmp/results --env KUBECONFIG= "$c"
  buildah config --entrypoint '["kubeconformance"]' "$c"
  buildah commit -q --rm "$c" "registry.k8s.io/conformance:v$K8S_VERSION" >/dev/null
  save "conformance-$K8S_VERSION.tar" "registry.k8s.io/conformance:v$K8S_VERSION"
  echo "$h" >"$IMAGES_DIR/.conformance-$K8S_VERSION"
fi

h=$(echo "$base_hash $(hash_of "$SONOBUOY_BIN/sonobuoy")" | sha256sum | cut -c1-16)
if ! stamped "$IMAGES_DIR/.sonobuoy" "$h"; then
  say "docker.io/sonobuoy/sonobuoy:v$SONOBUOY_VERSION"
  c=$(buildah from --pull-never "$DEBIAN_IMAGE")
  buildah copy -q "$c" "$SONOBUOY_BIN/sonobuoy" /sonobuoy >/dev/null
  buildah config --cmd '' --workingdir / "$c"
  buildah config --entrypoint '["/sonobuoy"]' "$c"
  buildah commit -q --rm "$c" "docker.io/sonobuoy/sonobuoy:v$SONOBUOY_VERSION" >/dev/null
  save "sonobuoy-$SONOBUOY_VERSION.tar" "docker.io/sonobuoy/sonobuoy:v$SONOBUOY_VERSION"
  echo "$h" >"$IMAGES_DIR/.sonobuoy"
fi

# --- the agent, from deploy/Dockerfile -------------------------------------------------------
build_ctx=()
if [ -n "${NETPOL_AGENT_BINARY:-}" ]; then
  [ -x "$NETPOL_AGENT_BINARY" ] || die "NETPOL_AGENT_BINARY=$NETPOL_AGENT_BINARY: no such executable"
  ctx=$OUT/agent-binary
  rm -rf "$ctx" && mkdir -p "$ctx"
  # As the build stage leaves it: stripped, at /netpol-agent.
  strip -o "$ctx/netpol-agent" "$NETPOL_AGENT_BINARY"
  build_ctx=(--build-context "build=$ctx")
  h=$(echo "$base_hash prebuilt $(hash_of "$ctx/netpol-agent" deploy/Dockerfile)" | sha256sum | cut -c1-16)
  how="deploy/Dockerfile's runtime stage and $NETPOL_AGENT_BINARY"
else
  sources=$(git ls-files -co --exclude-standard Cargo.toml Cargo.lock build.rs src benches e2e/Cargo.toml e2e/src deploy/Dockerfile .dockerignore | sort)
  # shellcheck disable=SC2086
  h=$(echo "$rust_hash $base_hash $(hash_of $sources)" | sha256sum | cut -c1-16)
  how="deploy/Dockerfile"
fi
if ! stamped "$IMAGES_DIR/.agent" "$h"; then
  say "$AGENT_IMAGE from $how"
  start=$SECONDS
  commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
  buildah bud -q --layers --pull-never "${TRUST[@]}" "${build_ctx[@]}" -f deploy/Dockerfile \
    --build-arg RUST_IMAGE="$RUST_IMAGE" --build-arg DEBIAN_IMAGE="$DEBIAN_IMAGE" \
    --build-arg TARGETARCH=amd64 --build-arg NETPOL_GIT_COMMIT="$commit" \
    -t "$AGENT_IMAGE" . >"$OUT/agent-image-build.log" 2>&1 \
    || { tail -30 "$OUT/agent-image-build.log" >&2; die "the agent's image did not build; log: $OUT/agent-image-build.log"; }
  # The binary must start in the image (a prebuilt one linked against a newer glibc would not).
  c=$(buildah from --pull-never "$AGENT_IMAGE")
  version=$(buildah run "$c" -- /usr/local/bin/netpol-agent --version 2>&1) \
    || { buildah rm "$c" >/dev/null; die "the agent's image does not run its binary: $version"; }
  buildah rm "$c" >/dev/null
  save "netpol-agent.tar" "$AGENT_IMAGE"
  say "$AGENT_IMAGE ($version) built in $((SECONDS - start)) s; $(du -h "$IMAGES_DIR/netpol-agent.tar" | cut -f1) as an archive"
  echo "$h" >"$IMAGES_DIR/.agent"
fi
say "images: $(awk '{ print $1 }' "$IMAGES_DIR/list.txt" | tr '\n' ' ')"
