# The OLM bundle image: build from this directory.
#   buildah bud -f bundle/bundle.Dockerfile -t ghcr.io/anevia/cdn-operator-bundle:v0.1.0 bundle/
# The labels repeat metadata/annotations.yaml (tests/shipped_artifacts.rs checks they agree).
FROM scratch
LABEL operators.operatorframework.io.bundle.mediatype.v1=registry+v1
LABEL operators.operatorframework.io.bundle.manifests.v1=manifests/
LABEL operators.operatorframework.io.bundle.metadata.v1=metadata/
LABEL operators.operatorframework.io.bundle.package.v1=cdn-operator
LABEL operators.operatorframework.io.bundle.channels.v1=alpha
LABEL operators.operatorframework.io.bundle.channel.default.v1=alpha
LABEL operators.operatorframework.io.test.mediatype.v1=scorecard+v1
LABEL operators.operatorframework.io.test.config.v1=tests/scorecard/
LABEL com.redhat.openshift.versions=v4.17
COPY manifests /manifests/
COPY metadata /metadata/
COPY tests/scorecard /tests/scorecard/
