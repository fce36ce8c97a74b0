# The catalog image: opm serves the file-based catalog of olm/catalog/ over gRPC.
#   buildah bud -f olm/catalog.Dockerfile -t ghcr.io/anevia/cdn-operator-catalog:v0.1.0 olm/
FROM quay.io/operator-framework/opm:v1.47.0
ENTRYPOINT ["/bin/opm"]
CMD ["serve", "/configs", "--cache-dir=/tmp/cache"]
COPY catalog /configs
# Pre-build the cache so that the catalog pod starts fast and fails the build on a bad catalog.
RUN ["/bin/opm", "serve", "/configs", "--cache-dir=/tmp/cache", "--cache-only"]
LABEL operators.operatorframework.io.index.configs.v1=/configs
