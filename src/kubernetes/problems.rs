//! Why a workload's pods do not run, in its user's terms: a pod's status (and a Deployment's
//! conditions) → an optional [`Problem`], pure; and the cache of the problems of the pods the
//! operator's children run ([`PodProblems`]), filled by a watch of [`PodSummary`]s. Domain-free.
//!
//! Only reasons that will not go away by waiting are problems: a pod being created, pulling its
//! image or starting is not one. Messages are stable while the cause is the same (no restart
//! counts, back-off durations, pod names or timestamps): a message that changed with every retry
//! would cost a status write and an Event per retry.

use super::index::{Index, Reset};
use super::record::PROGRESS_DEADLINE_EXCEEDED;
use super::records::Key;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::de::IgnoredAny;
use serde::{Deserialize, Deserializer};
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

/// The label naming the instance (the CdnCluster, the At) a pod belongs to.
pub const INSTANCE_LABEL: &str = "app.kubernetes.io/instance";

/// A container restarts and fails again (its last error line or exit code).
pub const CRASH_LOOP_BACK_OFF: &str = "CrashLoopBackOff";
/// A container's image cannot be pulled (the kubelet alternates `ErrImagePull` and
/// `ImagePullBackOff` while it retries: one reason for both).
pub const IMAGE_PULL_BACK_OFF: &str = "ImagePullBackOff";
pub const INVALID_IMAGE_NAME: &str = "InvalidImageName";
/// The kubelet refuses to create a container (`runAsNonRoot` and a root image, a missing
/// ConfigMap or Secret key).
pub const CREATE_CONTAINER_CONFIG_ERROR: &str = "CreateContainerConfigError";
pub const CREATE_CONTAINER_ERROR: &str = "CreateContainerError";
pub const RUN_CONTAINER_ERROR: &str = "RunContainerError";
/// No node can take the pod (resources, selectors, taints, quota).
pub const UNSCHEDULABLE: &str = "Unschedulable";

/// Every reason, most telling first: when several pods have problems, the first reason of this
/// list is reported. A crash tells what the program said; a deadline, only that time passed.
pub const REASONS: [&str; 8] = [
    CRASH_LOOP_BACK_OFF,
    IMAGE_PULL_BACK_OFF,
    INVALID_IMAGE_NAME,
    CREATE_CONTAINER_CONFIG_ERROR,
    CREATE_CONTAINER_ERROR,
    RUN_CONTAINER_ERROR,
    UNSCHEDULABLE,
    PROGRESS_DEADLINE_EXCEEDED,
];

/// Messages are cut to this many characters: a condition's message is read in `kubectl get`.
pub const MESSAGE_MAX: usize = 240;

/// Why pods do not run: a reason of [`REASONS`] and a short message in the user's terms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub reason: &'static str,
    pub message: String,
}

impl Problem {
    fn new(reason: &'static str, message: impl Into<String>) -> Self {
        Problem {
            reason,
            message: truncate(message.into()),
        }
    }

    /// Its place in [`REASONS`]: lower is reported first.
    fn rank(&self) -> usize {
        REASONS
            .iter()
            .position(|r| *r == self.reason)
            .unwrap_or(REASONS.len())
    }
}

/// The reason of [`REASONS`] spelt `text`, if it is one (a condition's reason read back).
pub fn reason(text: &str) -> Option<&'static str> {
    REASONS.iter().copied().find(|r| *r == text)
}

/// The problem of a pod, from its status: the most telling of its containers' (sidecars
/// included), else its scheduling's. `None` for a pod that runs, starts, or is being created.
pub fn of_pod(status: &PodStatus) -> Option<Problem> {
    let containers = status.init_container_statuses.iter().flatten();
    let containers = containers.chain(status.container_statuses.iter().flatten());
    containers
        .filter_map(of_container)
        .min_by_key(Problem::rank)
        .or_else(|| unschedulable(status))
}

fn of_container(c: &ContainerStatus) -> Option<Problem> {
    let name = &c.name;
    let waiting = c.state.as_ref().and_then(|s| s.waiting.as_ref());
    let (reason, detail) = match waiting {
        Some(w) => (
            w.reason.as_deref(),
            w.message.as_deref().unwrap_or_default(),
        ),
        None => (None, ""),
    };
    match reason {
        Some("ErrImagePull" | "ImagePullBackOff") => {
            return Some(Problem::new(
                IMAGE_PULL_BACK_OFF,
                format!("image {} of container {name} cannot be pulled", c.image),
            ))
        }
        Some(
            reason @ (INVALID_IMAGE_NAME
            | CREATE_CONTAINER_CONFIG_ERROR
            | CREATE_CONTAINER_ERROR
            | RUN_CONTAINER_ERROR),
        ) => {
            let reason = self::reason(reason).unwrap_or(CREATE_CONTAINER_ERROR);
            return Some(Problem::new(
                reason,
                format!("container {name} cannot start: {}", kubelet_words(detail)),
            ));
        }
        _ => {}
    }
    // Between two attempts the container is briefly terminated, then running: still the same
    // crash loop until it is ready, or each restart would clear the problem and set it again.
    let last = c.state.as_ref().and_then(|s| s.terminated.as_ref());
    let last = last.or(c.last_state.as_ref().and_then(|s| s.terminated.as_ref()));
    let looping = reason == Some(CRASH_LOOP_BACK_OFF) || (!c.ready && c.restart_count > 0);
    if !looping || (last.is_none() && reason != Some(CRASH_LOOP_BACK_OFF)) {
        return None;
    }
    let message = match last {
        Some(t) if t.reason.as_deref() == Some("OOMKilled") => {
            format!("container {name} is killed for want of memory (OOMKilled)")
        }
        Some(t) => match t.message.as_deref().and_then(last_error_line) {
            Some(line) => format!("container {name} exits with code {}: {line}", t.exit_code),
            None => format!("container {name} exits with code {}", t.exit_code),
        },
        None => format!("container {name} keeps exiting"),
    };
    Some(Problem::new(CRASH_LOOP_BACK_OFF, message))
}

/// The scheduler's verdict on a pod no node can take: its first sentence ("0/3 nodes are
/// available: 3 Insufficient cpu."), the rest being what preemption would not help.
fn unschedulable(status: &PodStatus) -> Option<Problem> {
    let condition = status.conditions.iter().flatten().find(|c| {
        c.type_ == "PodScheduled"
            && c.status == "False"
            && c.reason.as_deref() == Some(UNSCHEDULABLE)
    })?;
    let said = condition.message.as_deref().unwrap_or("no node can run it");
    let first = said.find(". ").map_or(said, |end| &said[..=end]);
    Some(Problem::new(
        UNSCHEDULABLE,
        format!("no node can run the pod: {first}"),
    ))
}

/// Whether the Deployment's rollout exceeded its progress deadline.
pub fn deadline_exceeded(deployment: &Deployment) -> bool {
    let conditions = deployment
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref());
    conditions.into_iter().flatten().any(|c| {
        c.type_ == "Progressing"
            && c.status == "False"
            && c.reason.as_deref() == Some(PROGRESS_DEADLINE_EXCEEDED)
    })
}

/// The problem of a rollout past its deadline, when no pod says more.
pub fn progress_deadline_exceeded() -> Problem {
    Problem::new(
        PROGRESS_DEADLINE_EXCEEDED,
        "the rollout made no progress within its deadline (progressDeadlineSeconds)",
    )
}

/// The kubelet's message without the pod it names (`(pod: "name_namespace(uid)", container: c)`):
/// a new pod would change it.
fn kubelet_words(message: &str) -> &str {
    let message = message
        .find(" (pod: \"")
        .map_or(message, |at| &message[..at]);
    message.trim()
}

/// The line of a container's termination message that says why it stopped: nginx's last
/// `[emerg]`, `[alert]` or `[crit]` line (without its timestamp and process ids, which change
/// with each attempt), else the last line.
pub fn last_error_line(message: &str) -> Option<String> {
    let mut lines = message.lines().map(str::trim).filter(|l| !l.is_empty());
    let severe = ["[emerg]", "[alert]", "[crit]"];
    let nginx = lines
        .clone()
        .filter_map(|l| severe.iter().find_map(|s| l.find(s).map(|at| &l[at..])))
        .next_back();
    let Some(line) = nginx else {
        return lines.next_back().map(String::from);
    };
    // "[emerg] 1#1: host not found…": the pid#tid after the level goes too.
    let (level, rest) = line.split_once(' ').unwrap_or((line, ""));
    let rest = match rest.split_once(": ") {
        Some((ids, said))
            if ids
                .split('#')
                .all(|n| n.bytes().all(|b| b.is_ascii_digit())) =>
        {
            said
        }
        _ => rest,
    };
    Some(format!("nginx: {level} {rest}"))
}

/// `message` cut to [`MESSAGE_MAX`] characters, with an ellipsis when cut.
fn truncate(message: String) -> String {
    match message.char_indices().nth(MESSAGE_MAX) {
        None => message,
        Some((at, _)) => format!("{}…", message[..at].trim_end()),
    }
}

/// A pod as the watch's readers read it, straight from the watch's bytes: its name, uid,
/// namespace and instance label, its [`Problem`], and where it can be reached; nothing else is
/// kept (see [`super::compact`] for why).
#[derive(Clone, Debug)]
pub struct PodSummary {
    pub metadata: ObjectMeta,
    pub problem: Option<Problem>,
    /// Being deleted: on its way out, what it says no longer counts ([`PodSummary::counted`]).
    pub leaving: bool,
    /// Controlled by a StatefulSet.
    pub stateful: bool,
    /// Its address while it runs (phase `Running`, an IP).
    pub running_at: Option<std::net::IpAddr>,
    /// Its containers' named ports (the init containers' included: sidecars are).
    pub ports: Vec<(String, u16)>,
}

impl PodSummary {
    /// The summary of `pod`.
    pub fn of(pod: &Pod) -> Self {
        serde_json::from_value(serde_json::to_value(pod).expect("pods serialize"))
            .expect("a serialized pod is a JSON map")
    }

    /// Its problem, unless it is leaving.
    pub fn counted(&self) -> Option<&Problem> {
        self.problem.as_ref().filter(|_| !self.leaving)
    }

    /// The instance (label [`INSTANCE_LABEL`]) the pod belongs to.
    pub fn instance(&self) -> Option<&str> {
        let labels = self.metadata.labels.as_ref()?;
        labels.get(INSTANCE_LABEL).map(String::as_str)
    }
}

impl<'de> Deserialize<'de> for PodSummary {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Default, Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Meta {
            #[serde(default)]
            name: Option<String>,
            #[serde(default)]
            namespace: Option<String>,
            #[serde(default)]
            uid: Option<String>,
            #[serde(default)]
            resource_version: Option<String>,
            #[serde(default)]
            labels: Option<BTreeMap<String, String>>,
            #[serde(default)]
            deletion_timestamp: Option<IgnoredAny>,
            #[serde(default)]
            owner_references: Vec<Owner>,
        }
        #[derive(Deserialize)]
        struct Owner {
            #[serde(default)]
            kind: String,
            #[serde(default)]
            controller: Option<bool>,
        }
        #[derive(Default, Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Spec {
            #[serde(default)]
            init_containers: Vec<Container>,
            #[serde(default)]
            containers: Vec<Container>,
        }
        #[derive(Deserialize)]
        struct Container {
            #[serde(default)]
            ports: Vec<Port>,
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Port {
            #[serde(default)]
            name: Option<String>,
            container_port: i32,
        }
        #[derive(Deserialize)]
        struct Parts {
            #[serde(default)]
            metadata: Meta,
            #[serde(default)]
            spec: Spec,
            #[serde(default)]
            status: Option<PodStatus>,
        }
        let Parts {
            metadata,
            spec,
            status,
        } = Parts::deserialize(deserializer)?;
        let problem = status.as_ref().and_then(of_pod);
        let running_at = status
            .filter(|s| s.phase.as_deref() == Some("Running"))
            .and_then(|s| s.pod_ip?.parse().ok());
        let ports = (spec.init_containers.into_iter())
            .chain(spec.containers)
            .flat_map(|c| c.ports)
            .filter_map(|p| Some((p.name?, u16::try_from(p.container_port).ok()?)))
            .collect();
        let instance = metadata.labels.and_then(|mut l| l.remove(INSTANCE_LABEL));
        Ok(PodSummary {
            metadata: ObjectMeta {
                name: metadata.name,
                namespace: metadata.namespace,
                uid: metadata.uid,
                resource_version: metadata.resource_version,
                labels: instance.map(|i| BTreeMap::from([(INSTANCE_LABEL.to_string(), i)])),
                ..ObjectMeta::default()
            },
            problem,
            leaving: metadata.deletion_timestamp.is_some(),
            stateful: (metadata.owner_references.iter())
                .any(|o| o.controller == Some(true) && o.kind == "StatefulSet"),
            running_at,
            ports,
        })
    }
}

impl Resource for PodSummary {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        Pod::kind(&())
    }

    fn group(_: &()) -> Cow<'_, str> {
        Pod::group(&())
    }

    fn version(_: &()) -> Cow<'_, str> {
        Pod::version(&())
    }

    fn plural(_: &()) -> Cow<'_, str> {
        Pod::plural(&())
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// The problems of pods, by instance (`namespace/instance`): only pods that have one are kept,
/// so pods that run cost nothing. Cheap to clone: every clone reads the same cache.
#[derive(Clone, Default)]
pub struct PodProblems {
    by_instance: Arc<RwLock<HashMap<Key, Pods>>>,
}

/// The problems of an instance's pods, by pod name.
type Pods = BTreeMap<Box<str>, Problem>;

impl PodProblems {
    /// The most telling problem of the pods of `namespace/instance` (ties: the first pod by name).
    pub fn worst(&self, namespace: &str, instance: &str) -> Option<Problem> {
        let all = self.by_instance.read().expect("never poisoned");
        let pods = all.get(&Key::new(namespace, instance))?;
        pods.values().min_by_key(|p| p.rank()).cloned()
    }

    /// How many instances have a pod with a problem.
    pub fn len(&self) -> usize {
        self.by_instance.read().expect("never poisoned").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Replaces what the cache holds with `pods`, as a watch's (re)list does.
    pub fn fill(&self, pods: impl IntoIterator<Item = PodSummary>) {
        let mut writer = self.writer();
        writer.reset(Reset::Begin);
        for pod in pods {
            writer.reset(Reset::Listed(&pod));
        }
        writer.reset(Reset::Done);
    }

    /// The one writer of this cache.
    pub fn writer(&self) -> PodProblemsWriter {
        PodProblemsWriter {
            problems: self.clone(),
            listing: None,
        }
    }
}

/// Fills [`PodProblems`] from watch events.
pub struct PodProblemsWriter {
    problems: PodProblems,
    /// The pods of a (re)list so far: they replace the cache at its end.
    listing: Option<HashMap<Key, Pods>>,
}

/// Sets (or clears) `pod`'s problem in `all`; returns whether it changed.
fn set(all: &mut HashMap<Key, Pods>, pod: &PodSummary, problem: Option<&Problem>) -> bool {
    let (Some(instance), Some(name)) = (pod.instance(), pod.metadata.name.as_deref()) else {
        return false;
    };
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    let key = Key::new(namespace, instance);
    match problem {
        Some(problem) => {
            let pods = all.entry(key).or_default();
            pods.insert(name.into(), problem.clone()).as_ref() != Some(problem)
        }
        None => {
            let Some(pods) = all.get_mut(&key) else {
                return false;
            };
            let removed = pods.remove(name).is_some();
            if pods.is_empty() {
                all.remove(&key);
            }
            removed
        }
    }
}

impl Index<PodSummary> for PodProblemsWriter {
    /// Changed only when the pod's problem did: a pod that starts, restarts in the same loop or
    /// becomes ready reconciles nothing (its Deployment's counts do).
    fn apply(&mut self, pod: &PodSummary) -> bool {
        let mut all = self.problems.by_instance.write().expect("never poisoned");
        set(&mut all, pod, pod.counted())
    }

    fn delete(&mut self, pod: &PodSummary) {
        let mut all = self.problems.by_instance.write().expect("never poisoned");
        set(&mut all, pod, None);
    }

    fn reset(&mut self, step: Reset<'_, PodSummary>) {
        match step {
            Reset::Begin => self.listing = Some(HashMap::new()),
            Reset::Listed(pod) => {
                if let Some(listing) = &mut self.listing {
                    set(listing, pod, pod.counted());
                }
            }
            Reset::Done => {
                if let Some(mut listed) = self.listing.take() {
                    listed.shrink_to_fit();
                    *self.problems.by_instance.write().expect("never poisoned") = listed;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
