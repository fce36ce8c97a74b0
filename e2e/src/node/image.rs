//! The images the node tests run, named by environment variables (present in the node's
//! container runtime, since no registry answers), and their references split as the chart and
//! kustomize's `images:` take them. Depends on no other file of `node`.

/// The operator's image, present in the node's container runtime (e.g. `localhost/cdn-operator:e2e`).
pub const OPERATOR_IMAGE_ENV: &str = "CDN_E2E_OPERATOR_IMAGE";
/// The nginx image of the CDN's pods, the At pods and the tests' origin (e.g. `localhost/cdn-nginx:1.30`).
pub const NGINX_IMAGE_ENV: &str = "CDN_E2E_NGINX_IMAGE";
/// Busybox without nginx (the node's sandbox image, e.g. `localhost/cdn-e2e-pause:1`): a
/// CdnCluster running it crash-loops (`cksum: not found`, exit 127). Only the test of pods that
/// cannot run needs it.
pub const PAUSE_IMAGE_ENV: &str = "CDN_E2E_PAUSE_IMAGE";
/// The nginx image run as root (`USER 0:0`, e.g. `localhost/cdn-nginx-root:1.30`): refused under
/// `runAsNonRoot`. Only the test of pods that cannot run needs it.
pub const ROOT_IMAGE_ENV: &str = "CDN_E2E_ROOT_IMAGE";

/// An image reference split as the chart and kustomize's `images:` take it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageRef {
    /// The registry host (and port), when the reference names one; else empty.
    pub registry: String,
    pub repository: String,
    pub tag: String,
    /// `sha256:…`, or empty.
    pub digest: String,
}

impl ImageRef {
    /// Splits `reference` (`[registry/]repository[:tag][@digest]`). The first path component is
    /// a registry when it has a `.` or a `:`, or is `localhost`, as the container runtimes read
    /// it. A reference must pin a tag other than `latest`, or a digest: the operator's pods take
    /// Kubernetes' default pull policy, which is `Always` for `latest` (no registry answers here).
    pub fn parse(reference: &str) -> Result<ImageRef, String> {
        let (name, digest) = match reference.split_once('@') {
            Some((name, digest)) => (name, digest.to_string()),
            None => (reference, String::new()),
        };
        let slash = name.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match name[slash..].rfind(':') {
            Some(i) => (&name[..slash + i], name[slash + i + 1..].to_string()),
            None => (name, String::new()),
        };
        let (registry, repository) = match name.split_once('/') {
            Some((first, rest))
                if first.contains('.') || first.contains(':') || first == "localhost" =>
            {
                (first.to_string(), rest.to_string())
            }
            _ => (String::new(), name.to_string()),
        };
        if repository.is_empty() || reference.chars().any(char::is_whitespace) {
            return Err(format!("`{reference}` is not an image reference"));
        }
        if digest.is_empty() && (tag.is_empty() || tag == "latest") {
            return Err(format!(
                "`{reference}` must name a tag other than `latest` (or a digest): the pods pull \
                 `latest` Always, and no registry is reachable"
            ));
        }
        Ok(ImageRef {
            registry,
            repository,
            tag,
            digest,
        })
    }

    /// `registry/repository`, or the repository alone.
    pub fn name(&self) -> String {
        if self.registry.is_empty() {
            self.repository.clone()
        } else {
            format!("{}/{}", self.registry, self.repository)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(registry: &str, repository: &str, tag: &str, digest: &str) -> ImageRef {
        ImageRef {
            registry: registry.into(),
            repository: repository.into(),
            tag: tag.into(),
            digest: digest.into(),
        }
    }

    #[test]
    fn image_references_split_as_the_chart_takes_them() {
        let digest = format!("sha256:{}", "a".repeat(64));
        let cases = [
            (
                "localhost/cdn-operator:e2e",
                image("localhost", "cdn-operator", "e2e", ""),
            ),
            (
                "localhost/cdn-nginx:1.30",
                image("localhost", "cdn-nginx", "1.30", ""),
            ),
            (
                "registry.example.com:5000/team/cdn-operator:0.2.0",
                image(
                    "registry.example.com:5000",
                    "team/cdn-operator",
                    "0.2.0",
                    "",
                ),
            ),
            (
                "anevia/cdn-operator:dev",
                image("", "anevia/cdn-operator", "dev", ""),
            ),
            ("cdn-operator:e2e", image("", "cdn-operator", "e2e", "")),
            (
                &format!("ghcr.io/anevia/cdn-operator@{digest}"),
                image("ghcr.io", "anevia/cdn-operator", "", &digest),
            ),
        ];
        for (reference, expected) in cases {
            let parsed = ImageRef::parse(reference).unwrap();
            assert_eq!(parsed, expected, "{reference}");
            let rebuilt = match (parsed.tag.is_empty(), parsed.digest.is_empty()) {
                (false, true) => format!("{}:{}", parsed.name(), parsed.tag),
                (true, false) => format!("{}@{}", parsed.name(), parsed.digest),
                _ => unreachable!(),
            };
            assert_eq!(rebuilt, reference);
        }
        for refused in ["localhost/cdn-operator", "cdn-operator:latest", "", "a b:1"] {
            assert!(ImageRef::parse(refused).is_err(), "{refused}");
        }
    }
}
