//! The restricted Pod Security Standard, which every pod the operator creates meets: non-root,
//! no privilege escalation, all capabilities dropped, seccomp RuntimeDefault, read-only root
//! filesystem (writable paths are emptyDirs).
//!
//! No user or group is fixed unless asked ([`RunAs`]): the image's numeric USER runs (the
//! kubelet checks `runAsNonRoot` against it), or the platform assigns one. OpenShift's
//! `restricted-v2` SCC gives each pod a UID from its namespace's range and refuses pods that fix
//! another, so a fixed default would keep every pod from starting there.

use k8s_openapi::api::core::v1::{
    Capabilities, PodSecurityContext, SeccompProfile, SecurityContext,
};

/// The largest UID/GID Kubernetes accepts (validation: 0 ≤ id ≤ 2147483647).
const MAX_ID: i64 = i32::MAX as i64;

/// The user and groups of the pods the operator creates (nginx and At pods), for clusters that
/// want them pinned; each unset by default.
#[derive(clap::Args, Debug, Clone, Default, PartialEq, Eq)]
pub struct RunAs {
    /// runAsUser of the pods the operator creates (nginx, At); default: none, the image's USER
    /// or the UID the platform assigns (OpenShift). Not 0: the pods run as non-root.
    #[arg(long = "pod-run-as-user", env = "POD_RUN_AS_USER", value_name = "UID",
          value_parser = clap::value_parser!(i64).range(1..=MAX_ID))]
    pub user: Option<i64>,

    /// runAsGroup of the pods the operator creates; default: none.
    #[arg(long = "pod-run-as-group", env = "POD_RUN_AS_GROUP", value_name = "GID",
          value_parser = clap::value_parser!(i64).range(0..=MAX_ID))]
    pub group: Option<i64>,

    /// fsGroup of the pods the operator creates (group owning their volumes); default: none.
    #[arg(long = "pod-fs-group", env = "POD_FS_GROUP", value_name = "GID",
          value_parser = clap::value_parser!(i64).range(0..=MAX_ID))]
    pub fs_group: Option<i64>,
}

/// The pod-level security context: non-root, as `run_as` pins it (nothing pinned by default).
pub fn pod(run_as: &RunAs) -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: run_as.user,
        run_as_group: run_as.group,
        fs_group: run_as.fs_group,
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            ..SeccompProfile::default()
        }),
        ..PodSecurityContext::default()
    }
}

/// The container-level security context.
pub fn container() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        privileged: Some(false),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            ..Capabilities::default()
        }),
        ..SecurityContext::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        run_as: RunAs,
    }

    fn parse(args: &[&str]) -> Result<RunAs, String> {
        Cli::try_parse_from(std::iter::once("x").chain(args.iter().copied()))
            .map(|cli| cli.run_as)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn nothing_is_pinned_by_default() {
        let psc = pod(&RunAs::default());
        assert_eq!(psc.run_as_non_root, Some(true));
        assert_eq!(
            (psc.run_as_user, psc.run_as_group, psc.fs_group),
            (None, None, None)
        );
        assert_eq!(psc.seccomp_profile.unwrap().type_, "RuntimeDefault");
    }

    #[test]
    fn the_flags_pin_each_id() {
        let run_as = parse(&[
            "--pod-run-as-user=1000680000",
            "--pod-run-as-group=0",
            "--pod-fs-group=1000680000",
        ])
        .unwrap();
        let psc = pod(&run_as);
        assert_eq!(psc.run_as_user, Some(1_000_680_000));
        assert_eq!(psc.run_as_group, Some(0));
        assert_eq!(psc.fs_group, Some(1_000_680_000));
        assert_eq!(psc.run_as_non_root, Some(true));
        assert_eq!(parse(&[]).unwrap(), RunAs::default());
    }

    #[test]
    fn root_and_out_of_range_ids_are_refused() {
        for args in [
            &["--pod-run-as-user=0"][..],
            &["--pod-run-as-user=2147483648"],
            &["--pod-run-as-group=-1"],
            &["--pod-fs-group=nobody"],
        ] {
            let error = parse(args).unwrap_err();
            assert!(error.contains("invalid value"), "{args:?}: {error}");
        }
    }
}
