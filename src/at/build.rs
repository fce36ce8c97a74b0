//! The pod that runs an At's command: pure, from the At.

use crate::api::At;
use crate::kubernetes::restricted::RunAs;
use k8s_openapi::api::core::v1::{
    Container, EmptyDirVolumeSource, Pod, PodSpec, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Resource, ResourceExt};
use std::collections::BTreeMap;

/// The image that runs the command when the spec names none: pinned, Alpine's busybox `/bin/sh`
/// with a numeric non-root USER (101), so it meets `runAsNonRoot` with no UID set in the pod and
/// runs as any UID (OpenShift). The `busybox` image runs as root, which the kubelet refuses
/// there. The image the caches run, so nodes pull nothing more.
pub const DEFAULT_IMAGE: &str = crate::cdncluster::build::DEFAULT_IMAGE;
/// The container's name, as in the original system.
pub const CONTAINER: &str = "busybox";
/// Finalizer the operator sets on every pod it creates, so the pod cannot disappear without the
/// operator seeing it: a pod deleted before it finished is recorded as such, never mistaken for a
/// pod not created yet (which would run the command a second time).
pub const FINALIZER: &str = "cnat.programming-kubernetes.info/run-once";
/// The seed's pod label, `app: <name of the At>`.
pub const APP_LABEL: &str = "app";
pub const NAME_LABEL: &str = "app.kubernetes.io/name";
pub use crate::kubernetes::problems::INSTANCE_LABEL;
/// `app.kubernetes.io/name` of every At pod.
pub const NAME: &str = "at";

/// The label selector of the operator's At pods, for its watch.
pub fn selector() -> String {
    use crate::cdncluster::build::{MANAGED_BY, MANAGED_BY_LABEL};
    format!("{NAME_LABEL}={NAME},{MANAGED_BY_LABEL}={MANAGED_BY}")
}

/// The pod of the At `at_name`.
pub fn pod_name(at_name: &str) -> String {
    format!("{at_name}-pod")
}

pub fn labels(at_name: &str) -> BTreeMap<String, String> {
    use crate::cdncluster::build::{MANAGED_BY, MANAGED_BY_LABEL};
    BTreeMap::from([
        (APP_LABEL.into(), at_name.into()),
        (NAME_LABEL.into(), NAME.into()),
        (INSTANCE_LABEL.into(), at_name.into()),
        (MANAGED_BY_LABEL.into(), MANAGED_BY.into()),
    ])
}

/// The pod that runs `at`'s command once: `/bin/sh -c <command>`, never restarted, owned by the
/// At (deleted with it), held by [`FINALIZER`], with nothing beyond what a shell command needs: no
/// service account token, no host namespaces, no privilege, non-root, read-only root filesystem
/// (with a writable `/tmp`), all capabilities dropped, the runtime's default seccomp profile; the
/// user and groups `run_as` pins (none by default). `default_image` runs the command when the At
/// names no image.
pub fn pod(at: &At, run_as: &RunAs, default_image: &str) -> Pod {
    let name = at.name_any();
    let container = Container {
        name: CONTAINER.into(),
        image: Some(
            at.spec
                .image
                .clone()
                .unwrap_or_else(|| default_image.into()),
        ),
        command: Some(vec!["/bin/sh".into(), "-c".into(), at.spec.command.clone()]),
        security_context: Some(crate::kubernetes::restricted::container()),
        // The command's last lines, kept by the kubelet when it fails.
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        volume_mounts: Some(vec![VolumeMount {
            name: "tmp".into(),
            mount_path: "/tmp".into(),
            ..VolumeMount::default()
        }]),
        ..Container::default()
    };
    Pod {
        metadata: ObjectMeta {
            name: Some(pod_name(&name)),
            namespace: at.namespace(),
            labels: Some(labels(&name)),
            owner_references: at.controller_owner_ref(&()).map(|r| vec![r]),
            finalizers: Some(vec![FINALIZER.into()]),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            restart_policy: Some("Never".into()),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            host_network: Some(false),
            host_pid: Some(false),
            host_ipc: Some(false),
            security_context: Some(crate::kubernetes::restricted::pod(run_as)),
            containers: vec![container],
            volumes: Some(vec![Volume {
                name: "tmp".into(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Volume::default()
            }]),
            ..PodSpec::default()
        }),
        ..Pod::default()
    }
}

/// Whether `pod` is controlled by the At with uid `uid`.
pub fn controlled_by(pod: &Pod, uid: Option<&str>) -> bool {
    uid.is_some_and(|uid| {
        pod.owner_references()
            .iter()
            .any(|r| r.controller == Some(true) && r.kind == "At" && r.uid == uid)
    })
}

/// Whether `pod` still carries the operator's finalizer.
pub fn held(pod: &Pod) -> bool {
    pod.finalizers().iter().any(|f| f == FINALIZER)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::AtSpec;

    fn at(command: &str, image: Option<&str>) -> At {
        let mut at = At::new(
            "example-at",
            AtSpec {
                schedule: "2019-04-12T10:12:00Z".into(),
                command: command.into(),
                image: image.map(Into::into),
            },
        );
        at.metadata.namespace = Some("ns".into());
        at.metadata.uid = Some("uid-1".into());
        at
    }

    #[test]
    fn name_labels_and_owner() {
        let pod = pod(&at("echo YAY", None), &RunAs::default(), DEFAULT_IMAGE);
        assert_eq!(pod.name_any(), "example-at-pod");
        assert_eq!(pod.namespace().as_deref(), Some("ns"));
        assert_eq!(
            pod.labels().get("app").map(String::as_str),
            Some("example-at")
        );
        assert_eq!(
            pod.labels()
                .get("app.kubernetes.io/managed-by")
                .map(String::as_str),
            Some("cdn-operator")
        );
        let owner = &pod.owner_references()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
            ("At", "example-at", "uid-1")
        );
        assert_eq!(owner.controller, Some(true));
        assert_eq!(
            owner.api_version,
            "cnat.programming-kubernetes.info/v1alpha1"
        );
        assert!(controlled_by(&pod, Some("uid-1")));
        assert!(!controlled_by(&pod, Some("uid-2")));
        assert!(!controlled_by(&pod, None));
        assert!(held(&pod));
    }

    #[test]
    fn the_command_runs_in_a_shell_once() {
        let command = r#"echo "a  b" | tr a-z A-Z; exit 3"#;
        let pod = pod(&at(command, None), &RunAs::default(), DEFAULT_IMAGE);
        let spec = pod.spec.unwrap();
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        let c = &spec.containers[0];
        assert_eq!(c.name, "busybox");
        assert_eq!(c.image.as_deref(), Some(DEFAULT_IMAGE));
        assert_eq!(
            c.command.as_deref(),
            Some(&["/bin/sh".to_string(), "-c".into(), command.into()][..])
        );
        assert_eq!(c.args, None);
    }

    #[test]
    fn the_image_can_be_chosen_and_the_default_is_pinned() {
        let mirrored = "mirror.example/nginx@sha256:0123";
        let image = |at: &At| {
            pod(at, &RunAs::default(), mirrored)
                .spec
                .unwrap()
                .containers[0]
                .image
                .clone()
        };
        assert_eq!(
            image(&at("true", Some("registry.example/tools:1.2"))).as_deref(),
            Some("registry.example/tools:1.2")
        );
        // None named: the operator's default (`--nginx-image`, by digest in a release).
        assert_eq!(image(&at("true", None)).as_deref(), Some(mirrored));
        let (_, tag) = DEFAULT_IMAGE.rsplit_once(':').unwrap();
        assert!(
            tag.chars().next().unwrap().is_ascii_digit(),
            "pinned: {DEFAULT_IMAGE}"
        );
    }

    #[test]
    fn the_pod_gets_nothing_more_than_a_restricted_pod() {
        let spec = pod(&at("id", None), &RunAs::default(), DEFAULT_IMAGE)
            .spec
            .unwrap();
        assert_eq!(spec.automount_service_account_token, Some(false));
        assert_eq!(spec.service_account_name, None);
        assert_eq!(spec.host_network, Some(false));
        assert_eq!(spec.host_pid, Some(false));
        assert_eq!(spec.host_ipc, Some(false));
        let psc = spec.security_context.unwrap();
        assert_eq!(psc.run_as_non_root, Some(true));
        // No fixed UID: OpenShift's restricted-v2 SCC refuses one outside the namespace's range.
        assert_eq!(
            (psc.run_as_user, psc.run_as_group, psc.fs_group),
            (None, None, None)
        );
        assert_eq!(psc.seccomp_profile.unwrap().type_, "RuntimeDefault");
        let sc = spec.containers[0].security_context.clone().unwrap();
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(sc.privileged, Some(false));
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(sc.run_as_non_root, Some(true));
        assert_eq!(sc.capabilities.unwrap().drop, Some(vec!["ALL".to_string()]));
        for volume in spec.volumes.unwrap() {
            assert!(volume.host_path.is_none(), "no host path");
            assert!(volume.empty_dir.is_some());
        }
        assert!(spec.containers[0].ports.is_none());
    }

    #[test]
    fn the_ids_a_cluster_pins_are_set() {
        let run_as = RunAs {
            user: Some(1_000_680_000),
            group: Some(0),
            fs_group: Some(1_000_680_000),
        };
        let psc = pod(&at("id", None), &run_as, DEFAULT_IMAGE)
            .spec
            .unwrap()
            .security_context
            .unwrap();
        assert_eq!(psc, crate::kubernetes::restricted::pod(&run_as));
        assert_eq!(psc.run_as_user, Some(1_000_680_000));
    }

    #[test]
    fn the_selector_matches_the_labels() {
        let labels = labels("x");
        for requirement in selector().split(',') {
            let (k, v) = requirement.split_once('=').unwrap();
            assert_eq!(labels.get(k).map(String::as_str), Some(v));
        }
    }
}
