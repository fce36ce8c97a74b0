//! `cnat.programming-kubernetes.info/v1alpha1` At: run a command once, at a given time.

use super::Condition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The longest name of an At: the pod carries it as its `app` label value.
pub const AT_MAX_NAME_LEN: usize = 63;

/// Runs `command` once, in a pod, when `schedule` is due.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "cnat.programming-kubernetes.info",
    version = "v1alpha1",
    kind = "At",
    plural = "ats",
    doc = "Runs a shell command once, in a pod, at a given time (UTC).",
    namespaced,
    status = "AtStatus",
    derive = "Default",
    printcolumn = r#"{"name":"Schedule","type":"string","jsonPath":".spec.schedule","description":"when the command runs (UTC)"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase","description":"PENDING, RUNNING or DONE"}"#,
    printcolumn = r#"{"name":"Outcome","type":"string","jsonPath":".status.outcome","description":"Succeeded or Failed"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct AtSpec {
    /// When to run the command: an RFC 3339 time such as `2019-04-12T10:12:00Z` (UTC) or
    /// `2019-04-12T12:12:00+02:00`. A time in the past runs at once.
    pub schedule: String,

    /// The command, run once by `/bin/sh -c`, so quotes, pipes and variables behave as in a shell.
    pub command: String,

    /// Container image that runs the command; it must provide `/bin/sh`. Defaults to a pinned
    /// busybox release.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
}

/// What the operator observed of an At.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AtStatus {
    /// `PENDING` until the schedule is due, `RUNNING` while the pod runs, `DONE` once it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,

    /// `Succeeded` or `Failed`, once DONE.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<Outcome>,

    /// Why the command failed: its exit code, or what stopped the pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,

    /// The command's exit code, when it ran to the end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,

    /// The pod that runs the command.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_name: Option<String>,

    /// When the At started running (recorded just before its pod is created).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,

    /// When the command ended: the container's end, else the pod's deletion.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,

    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// `Scheduled` (the schedule is a valid time) and `Ready` (True once DONE, whatever the
    /// outcome).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// The phase of an At, spelled as the original system did.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "UPPERCASE")]
pub enum Phase {
    /// The schedule is not due yet.
    Pending,
    /// The pod runs the command.
    Running,
    /// The pod ended; see `outcome`.
    Done,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "PENDING",
            Phase::Running => "RUNNING",
            Phase::Done => "DONE",
        }
    }

    pub const ALL: [Phase; 3] = [Phase::Pending, Phase::Running, Phase::Done];
}

/// How an At ended.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum Outcome {
    /// The command exited 0.
    Succeeded,
    /// The command exited non-zero, or its pod was lost.
    Failed,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Succeeded => "Succeeded",
            Outcome::Failed => "Failed",
        }
    }

    pub const ALL: [Outcome; 2] = [Outcome::Succeeded, Outcome::Failed];
}
