# syntax=docker/dockerfile:1
# The cdn-operator image: one static binary on an empty base, run as a non-root user, no shell.
#
# Anywhere (Docker, Podman, buildah): the builder stage compiles the binary.
#   docker build -t ghcr.io/anevia/cdn-operator:0.1.0 .
# From binaries built on the host (CI, where no base image can be pulled), one per architecture;
# the platform's TARGETARCH (amd64, arm64) picks the binary:
#   RUSTFLAGS='-C target-feature=+crt-static' cargo build --release --locked --target x86_64-unknown-linux-gnu
#   CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
#     RUSTFLAGS='-C target-feature=+crt-static' cargo build --release --locked --target aarch64-unknown-linux-gnu
#   buildah --storage-driver vfs bud --isolation chroot --build-arg BINARY_FROM=prebuilt --platform linux/arm64 -t cdn-operator .
# Both link glibc statically: the binary needs no libc in the image, nor anything else for what it
# does at run time:
# - Host names (a kubeconfig's server, an OTLP collector's Service): a static glibc cannot load
#   NSS modules, but the glibc linked here (bookworm's 2.36) has its `files` and `dns` backends
#   built in, so /etc/hosts and /etc/resolv.conf, which the container runtime mounts, resolve
#   them (search list and ndots included). Only other NSS sources (LDAP, mDNS) are out of reach.
#   A musl build is not needed for this (and its toolchain is not obtainable where CI runs);
#   scripts/check-artifacts.sh runs this image's filesystem in a chroot with a name in /etc/hosts
#   and one in DNS, so a builder whose glibc lacks them fails there.
# - TLS: Mozilla's CA roots are built into the binary; a private CA is mounted and named by
#   SSL_CERT_FILE (or OTEL_EXPORTER_OTLP_CERTIFICATE for the collector). http:// needs none.

# Which stage provides /cdn-operator: builder (compile here) or prebuilt (copy from the context).
ARG BINARY_FROM=builder
# Set by buildah and BuildKit from --platform (the host's by default): amd64 or arm64.
ARG TARGETARCH

# The toolchain CI builds and tests with.
FROM docker.io/library/rust:1.95-bookworm AS builder
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /src
# The whole crate (.dockerignore leaves out target/ and .git): Cargo.toml may declare tests,
# benches or examples that must exist for the manifest to load.
COPY . .
# The host triple of the builder (x86_64 or aarch64), statically linked.
RUN target="$(rustc -vV | sed -n 's/^host: //p')" \
    && RUSTFLAGS='-C target-feature=+crt-static' cargo build --release --locked --target "$target" \
    && install -D -m 0555 "target/$target/release/cdn-operator" /out/cdn-operator \
    && /out/cdn-operator version

# A stage per architecture, named by TARGETARCH: a scratch stage has no shell to map the name.
FROM scratch AS prebuilt-amd64
COPY --chmod=0555 target/x86_64-unknown-linux-gnu/release/cdn-operator /out/cdn-operator

FROM scratch AS prebuilt-arm64
COPY --chmod=0555 target/aarch64-unknown-linux-gnu/release/cdn-operator /out/cdn-operator

# A stage of this file, not an image: no tag to pin.
# hadolint ignore=DL3006
FROM prebuilt-${TARGETARCH} AS prebuilt

FROM ${BINARY_FROM} AS binary

FROM scratch
LABEL org.opencontainers.image.title="cdn-operator" \
      org.opencontainers.image.description="Kubernetes operator for CDN clusters of nginx (CdnCluster) and one-shot commands (At)" \
      org.opencontainers.image.source="https://github.com/anevia/cdn-operator" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=binary /out/cdn-operator /cdn-operator
# A numeric user (no /etc/passwd needed): 101, the user of the default nginx image, because this
# image is also the sidecar of the nginx pods, which applies purges to the cache files nginx makes
# readable by its own user only (docs/adr/0008-purges-in-place.md).
USER 101:101
EXPOSE 8443 8081
ENTRYPOINT ["/cdn-operator"]
CMD ["run"]
