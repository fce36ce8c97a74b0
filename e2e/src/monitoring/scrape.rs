//! The `scrape_configs` entries the Prometheus Operator writes for ServiceMonitors and
//! PodMonitors (its `pkg/prometheus/promcfg.go`), so that a Prometheus run by the test scrapes
//! the shipped monitors as kube-prometheus-stack would: a selector that misses the pods, a wrong
//! port name or job label shows there as it would in a cluster. The operator's defaults: the
//! relabeling selector mechanism, the `endpoints` role for ServiceMonitors, one shard, no scrape
//! class, a Prometheus 2.42. That Prometheus runs on this machine, not in a pod: what differs is
//! an explicit [`Environment`]. A field this conversion does not know is an error naming it,
//! never dropped: a monitor it cannot render faithfully is not tested as if it could.

use super::duration;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::path::Path;

/// The token of the Prometheus pod's ServiceAccount, which a ServiceMonitor names
/// (`bearerTokenFile`) to scrape with Prometheus's own identity.
pub const SERVICE_ACCOUNT_TOKEN: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";

/// Reads a key of a Secret or ConfigMap: (namespace, `"Secret"` or `"ConfigMap"`, name, key) to
/// its text.
pub type Resolve<'a> = dyn Fn(&str, &str, &str, &str) -> Result<String, String> + 'a;

/// What differs between Prometheus in a pod and the test's Prometheus on this machine.
pub struct Environment<'a> {
    /// Every `kubernetes_sd_configs` entry's `kubeconfig_file` (in a pod, Prometheus uses its
    /// in-cluster configuration).
    pub kubeconfig: &'a Path,
    /// Stands for [`SERVICE_ACCOUNT_TOKEN`]: a file holding the token of the ServiceAccount
    /// Prometheus runs as. Other `bearerTokenFile` paths are kept as written.
    pub token_file: &'a Path,
    /// The keys of Secrets and ConfigMaps, which the operator reads from the API: it inlines
    /// `authorization.credentials` and writes the TLS CA, certificate and key to files.
    pub resolve: &'a Resolve<'a>,
    /// Where those TLS files go (the operator's `/etc/prometheus/certs` in the pod).
    pub assets_dir: &'a Path,
    /// Divides every interval and scrape timeout (1: as shipped), so that a test sees in
    /// seconds what runs in minutes.
    pub time_scale: u32,
}

/// The documents of a multi-document YAML text (a `helm template` or `kubectl kustomize`
/// output), without the empty ones (comments only, `---` at the end).
pub fn yaml_documents(text: &str) -> Result<Vec<Value>, String> {
    serde_yaml::Deserializer::from_str(text)
        .map(|document| Value::deserialize(document).map_err(|e| e.to_string()))
        .filter(|document| !matches!(document, Ok(Value::Null)))
        .collect()
}

/// The `scrape_configs` entries for the ServiceMonitors and PodMonitors among `objects` (other
/// kinds are skipped), in the operator's order: ServiceMonitors, then PodMonitors, each by
/// `namespace/name`, one entry per endpoint.
pub fn scrape_configs(objects: &[Value], env: &Environment) -> Result<Vec<Value>, String> {
    if env.time_scale == 0 {
        return Err("time_scale 0: durations are divided by it".into());
    }
    let mut monitors = BTreeMap::new();
    for object in objects {
        let kind = match object["kind"].as_str() {
            Some("ServiceMonitor") => Kind::ServiceMonitor,
            Some("PodMonitor") => Kind::PodMonitor,
            _ => continue,
        };
        let monitor = Monitor::read(kind, object, env)?;
        let key = (kind, format!("{}/{}", monitor.namespace, monitor.name));
        if monitors.contains_key(&key) {
            return Err(format!("{} {} is given twice", kind.name(), key.1));
        }
        monitors.insert(key, monitor);
    }
    Ok(monitors
        .values()
        .flat_map(|monitor| {
            (0..monitor.endpoints.len()).map(|index| monitor.scrape_config(index, env))
        })
        .collect())
}

/// Prometheus's label name for a Kubernetes label key (what the service discovery writes).
fn sanitize_label_name(key: &str) -> String {
    key.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    ServiceMonitor,
    PodMonitor,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::ServiceMonitor => "ServiceMonitor",
            Kind::PodMonitor => "PodMonitor",
        }
    }

    fn job_prefix(self) -> &'static str {
        match self {
            Kind::ServiceMonitor => "serviceMonitor",
            Kind::PodMonitor => "podMonitor",
        }
    }

    fn role(self) -> &'static str {
        match self {
            Kind::ServiceMonitor => "endpoints",
            Kind::PodMonitor => "pod",
        }
    }

    /// The discovered object whose labels the monitor's selector and jobLabel read.
    fn selected(self) -> &'static str {
        match self {
            Kind::ServiceMonitor => "service",
            Kind::PodMonitor => "pod",
        }
    }

    fn endpoints_field(self) -> &'static str {
        match self {
            Kind::ServiceMonitor => "endpoints",
            Kind::PodMonitor => "podMetricsEndpoints",
        }
    }

    /// The meta label holding the name of a target's port.
    fn port_label(self) -> &'static str {
        match self {
            Kind::ServiceMonitor => "__meta_kubernetes_endpoint_port_name",
            Kind::PodMonitor => "__meta_kubernetes_pod_container_port_name",
        }
    }
}

/// The meta label of the label `key` of a discovered `object` (`service`, `pod`).
fn label_of(object: &str, key: &str) -> String {
    format!(
        "__meta_kubernetes_{object}_label_{}",
        sanitize_label_name(key)
    )
}

/// The meta label saying that a discovered `object` has the label `key`, even empty.
fn label_present(object: &str, key: &str) -> String {
    format!(
        "__meta_kubernetes_{object}_labelpresent_{}",
        sanitize_label_name(key)
    )
}

/// A JSON object read key by key: the keys no reader took are the ones this conversion does not
/// support, and [`Fields::finish`] names the first of them. Nulls count as absent, as Kubernetes
/// reads them.
struct Fields<'a> {
    path: String,
    map: &'a Map<String, Value>,
    taken: Vec<String>,
}

impl<'a> Fields<'a> {
    fn new(value: &'a Value, path: String) -> Result<Fields<'a>, String> {
        match value {
            Value::Object(map) => Ok(Fields {
                path,
                map,
                taken: Vec::new(),
            }),
            _ => Err(format!("{path} is not an object")),
        }
    }

    /// The path of `key` in the monitor.
    fn at(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.into()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    /// Takes `key` unread: what it holds does not change the scrape.
    fn skip(&mut self, key: &str) {
        self.taken.push(key.into());
    }

    fn get(&mut self, key: &str) -> Option<&'a Value> {
        self.taken.push(key.into());
        self.map.get(key).filter(|value| !value.is_null())
    }

    fn string(&mut self, key: &str) -> Result<Option<&'a str>, String> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(text)) => Ok(Some(text)),
            Some(_) => Err(format!("{} is not a string", self.at(key))),
        }
    }

    /// A string that Kubernetes leaves out when empty (`omitempty`).
    fn text(&mut self, key: &str) -> Result<Option<&'a str>, String> {
        Ok(self.string(key)?.filter(|text| !text.is_empty()))
    }

    fn boolean(&mut self, key: &str) -> Result<Option<bool>, String> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(value)) => Ok(Some(*value)),
            Some(_) => Err(format!("{} is not a boolean", self.at(key))),
        }
    }

    fn object(&mut self, key: &str) -> Result<Option<Fields<'a>>, String> {
        let path = self.at(key);
        self.get(key)
            .map(|value| Fields::new(value, path))
            .transpose()
    }

    /// The items of a list, none when absent.
    fn list(&mut self, key: &str) -> Result<&'a [Value], String> {
        match self.get(key) {
            None => Ok(&[]),
            Some(Value::Array(items)) => Ok(items),
            Some(_) => Err(format!("{} is not a list", self.at(key))),
        }
    }

    fn strings(&mut self, key: &str) -> Result<Vec<String>, String> {
        let path = self.at(key);
        self.list(key)?
            .iter()
            .enumerate()
            .map(|(i, item)| match item {
                Value::String(text) => Ok(text.clone()),
                _ => Err(format!("{path}[{i}] is not a string")),
            })
            .collect()
    }

    fn finish(self) -> Result<(), String> {
        match self.map.keys().find(|key| !self.taken.contains(key)) {
            Some(key) => Err(format!("{} is not supported", self.at(key))),
            None => Ok(()),
        }
    }
}

/// A monitor, read into what its scrape configurations need.
struct Monitor {
    kind: Kind,
    namespace: String,
    name: String,
    job_label: Option<String>,
    /// The keep and drop relabelings of its selector.
    selector: Vec<Value>,
    /// The namespaces it looks in; `None`: all.
    namespaces: Option<Vec<String>>,
    target_labels: Vec<String>,
    pod_target_labels: Vec<String>,
    endpoints: Vec<Endpoint>,
}

/// One endpoint of a monitor, its scrape settings already in Prometheus's terms.
struct Endpoint {
    port: Option<String>,
    filter_running: bool,
    /// `honor_labels`, intervals, path, scheme, TLS, credentials.
    settings: Map<String, Value>,
    relabelings: Vec<Value>,
    metric_relabelings: Vec<Value>,
}

impl Monitor {
    fn read(kind: Kind, object: &Value, env: &Environment) -> Result<Monitor, String> {
        let metadata = &object["metadata"];
        let name = metadata["name"].as_str().unwrap_or_default();
        let namespace = metadata["namespace"].as_str().unwrap_or_default();
        let context = |error: String| format!("{} {namespace}/{name}: {error}", kind.name());
        if name.is_empty() || namespace.is_empty() {
            return Err(context(
                "metadata.name and metadata.namespace must be set (render with a namespace)".into(),
            ));
        }
        Monitor::read_spec(kind, object, namespace, name, env).map_err(context)
    }

    fn read_spec(
        kind: Kind,
        object: &Value,
        namespace: &str,
        name: &str,
        env: &Environment,
    ) -> Result<Monitor, String> {
        let mut top = Fields::new(object, String::new())?;
        top.skip("kind");
        top.skip("metadata");
        if top.string("apiVersion")? != Some("monitoring.coreos.com/v1") {
            return Err("apiVersion is not monitoring.coreos.com/v1".into());
        }
        let mut spec = top
            .object("spec")?
            .ok_or_else(|| "spec is missing".to_string())?;
        top.finish()?;
        let job_label = spec.text("jobLabel")?.map(str::to_owned);
        let selector = match spec.object("selector")? {
            Some(selector) => selector_relabelings(kind, selector)?,
            None => Vec::new(),
        };
        let namespaces = match spec.object("namespaceSelector")? {
            Some(mut selector) => {
                let any = selector.boolean("any")?.unwrap_or(false);
                let names = selector.strings("matchNames")?;
                selector.finish()?;
                match (any, names.is_empty()) {
                    (true, _) => None,
                    (false, true) => Some(vec![namespace.to_owned()]),
                    (false, false) => Some(names),
                }
            }
            None => Some(vec![namespace.to_owned()]),
        };
        let target_labels = match kind {
            Kind::ServiceMonitor => spec.strings("targetLabels")?,
            Kind::PodMonitor => Vec::new(),
        };
        let pod_target_labels = spec.strings("podTargetLabels")?;
        let path = spec.at(kind.endpoints_field());
        let endpoints = spec
            .list(kind.endpoints_field())?
            .iter()
            .enumerate()
            .map(|(i, endpoint)| {
                let fields = Fields::new(endpoint, format!("{path}[{i}]"))?;
                read_endpoint(kind, namespace, fields, env)
            })
            .collect::<Result<_, _>>()?;
        spec.finish()?;
        Ok(Monitor {
            kind,
            namespace: namespace.into(),
            name: name.into(),
            job_label,
            selector,
            namespaces,
            target_labels,
            pod_target_labels,
            endpoints,
        })
    }

    fn scrape_config(&self, index: usize, env: &Environment) -> Value {
        let endpoint = &self.endpoints[index];
        let mut discovery = Map::new();
        discovery.insert("role".into(), self.kind.role().into());
        if let Some(names) = &self.namespaces {
            discovery.insert("namespaces".into(), json!({ "names": names }));
        }
        discovery.insert(
            "kubeconfig_file".into(),
            env.kubeconfig.display().to_string().into(),
        );
        let mut config = endpoint.settings.clone();
        config.insert(
            "job_name".into(),
            format!(
                "{}/{}/{}/{index}",
                self.kind.job_prefix(),
                self.namespace,
                self.name
            )
            .into(),
        );
        config.insert("kubernetes_sd_configs".into(), json!([discovery]));
        config.insert("relabel_configs".into(), self.relabelings(endpoint).into());
        if !endpoint.metric_relabelings.is_empty() {
            config.insert(
                "metric_relabel_configs".into(),
                endpoint.metric_relabelings.clone().into(),
            );
        }
        config.into()
    }

    /// The operator's relabelings, in its order: the job name kept aside, the selector, the
    /// port, the target's labels, the job, the endpoint, the user's, then sharding.
    fn relabelings(&self, endpoint: &Endpoint) -> Vec<Value> {
        let selected = self.kind.selected();
        let mut rules = vec![copy("job", "__tmp_prometheus_job_name")];
        let port_filter = endpoint.port.as_ref().map(|port| {
            json!({"action": "keep", "source_labels": [self.kind.port_label()], "regex": port})
        });
        match self.kind {
            Kind::ServiceMonitor => {
                rules.extend(self.selector.iter().cloned());
                rules.extend(port_filter);
                let target = [
                    "__meta_kubernetes_endpoint_address_target_kind",
                    "__meta_kubernetes_endpoint_address_target_name",
                ];
                for (kind, label) in [("Node", "node"), ("Pod", "pod")] {
                    rules.push(json!({
                        "source_labels": target,
                        "separator": ";",
                        "regex": format!("{kind};(.*)"),
                        "replacement": "${1}",
                        "target_label": label,
                    }));
                }
                rules.extend([
                    copy("__meta_kubernetes_namespace", "namespace"),
                    copy("__meta_kubernetes_service_name", "service"),
                    copy("__meta_kubernetes_pod_name", "pod"),
                    copy("__meta_kubernetes_pod_container_name", "container"),
                ]);
                if endpoint.filter_running {
                    rules.push(running_filter());
                }
                for label in &self.target_labels {
                    rules.push(label_copy(&label_of("service", label), label));
                }
                for label in &self.pod_target_labels {
                    rules.push(label_copy(&label_of("pod", label), label));
                }
                rules.push(json!({
                    "source_labels": ["__meta_kubernetes_service_name"],
                    "target_label": "job",
                    "replacement": "${1}",
                }));
            }
            Kind::PodMonitor => {
                if endpoint.filter_running {
                    rules.push(running_filter());
                }
                rules.extend(self.selector.iter().cloned());
                rules.extend(port_filter);
                rules.extend([
                    copy("__meta_kubernetes_namespace", "namespace"),
                    copy("__meta_kubernetes_pod_container_name", "container"),
                    copy("__meta_kubernetes_pod_name", "pod"),
                ]);
                for label in &self.pod_target_labels {
                    rules.push(label_copy(&label_of("pod", label), label));
                }
                rules.push(json!({
                    "target_label": "job",
                    "replacement": format!("{}/{}", self.namespace, self.name),
                }));
            }
        }
        if let Some(label) = &self.job_label {
            rules.push(json!({
                "source_labels": [label_of(selected, label)],
                "target_label": "job",
                "regex": "(.+)",
                "replacement": "${1}",
            }));
        }
        if let Some(port) = &endpoint.port {
            rules.push(json!({"target_label": "endpoint", "replacement": port}));
        }
        rules.extend(endpoint.relabelings.iter().cloned());
        rules.extend(sharding());
        rules
    }
}

fn copy(source: &str, target: &str) -> Value {
    json!({"source_labels": [source], "target_label": target})
}

/// A target label from a label of the discovered object, when it has a value.
fn label_copy(source: &str, key: &str) -> Value {
    json!({
        "source_labels": [source],
        "target_label": sanitize_label_name(key),
        "regex": "(.+)",
        "replacement": "${1}",
    })
}

/// Drops the targets of pods that ended (`filterRunning`, true by default).
fn running_filter() -> Value {
    json!({
        "action": "drop",
        "source_labels": ["__meta_kubernetes_pod_phase"],
        "regex": "(Failed|Succeeded)",
    })
}

/// The operator's sharding for its one shard: `$(SHARD)` is already 0, as its config reloader
/// writes it.
fn sharding() -> [Value; 3] {
    [
        json!({
            "source_labels": ["__address__", "__tmp_hash"],
            "target_label": "__tmp_hash",
            "regex": "(.+);",
            "replacement": "$1",
            "action": "replace",
        }),
        json!({
            "source_labels": ["__tmp_hash"],
            "target_label": "__tmp_hash",
            "modulus": 1,
            "action": "hashmod",
        }),
        json!({
            "source_labels": ["__tmp_hash", "__tmp_disable_sharding"],
            "regex": "0;|.+;.+",
            "action": "keep",
        }),
    ]
}

/// The keep and drop relabelings of a label selector: `matchLabels` by key, then
/// `matchExpressions` in order. The operator writes label values into the regular expressions
/// unescaped: so does this.
fn selector_relabelings(kind: Kind, mut selector: Fields) -> Result<Vec<Value>, String> {
    let object = kind.selected();
    let mut rules = Vec::new();
    if let Some(labels) = selector.object("matchLabels")? {
        let mut keys: Vec<&String> = labels.map.keys().collect();
        keys.sort();
        for key in keys {
            let value = labels.map[key]
                .as_str()
                .ok_or_else(|| format!("{} is not a string", labels.at(key)))?;
            rules.push(json!({
                "action": "keep",
                "source_labels": [label_of(object, key), label_present(object, key)],
                "regex": format!("({value});true"),
            }));
        }
    }
    let path = selector.at("matchExpressions");
    for (i, expression) in selector.list("matchExpressions")?.iter().enumerate() {
        let mut expression = Fields::new(expression, format!("{path}[{i}]"))?;
        let key = expression
            .text("key")?
            .ok_or_else(|| format!("{} is missing", expression.at("key")))?;
        let operator = expression.string("operator")?.unwrap_or_default();
        let values = expression.strings("values")?;
        let with_value = [label_of(object, key), label_present(object, key)];
        let present_only = [label_present(object, key)];
        let (action, sources, regex) = match operator {
            "In" | "NotIn" if values.is_empty() => {
                return Err(format!("{}: {operator} needs values", expression.path));
            }
            "Exists" | "DoesNotExist" if !values.is_empty() => {
                return Err(format!("{}: {operator} takes no values", expression.path));
            }
            "In" => (
                "keep",
                &with_value[..],
                format!("({});true", values.join("|")),
            ),
            "NotIn" => (
                "drop",
                &with_value[..],
                format!("({});true", values.join("|")),
            ),
            "Exists" => ("keep", &present_only[..], "true".into()),
            "DoesNotExist" => ("drop", &present_only[..], "true".into()),
            _ => {
                return Err(format!(
                    "{}: operator {operator:?} is not In, NotIn, Exists or DoesNotExist",
                    expression.path
                ));
            }
        };
        rules.push(json!({"action": action, "source_labels": sources, "regex": regex}));
        expression.finish()?;
    }
    selector.finish()?;
    Ok(rules)
}

fn read_endpoint(
    kind: Kind,
    namespace: &str,
    mut fields: Fields,
    env: &Environment,
) -> Result<Endpoint, String> {
    let mut settings = Map::new();
    let port = fields.text("port")?.map(str::to_owned);
    let honor_labels = fields.boolean("honorLabels")?.unwrap_or(false);
    settings.insert("honor_labels".into(), honor_labels.into());
    if let Some(honor) = fields.boolean("honorTimestamps")? {
        settings.insert("honor_timestamps".into(), honor.into());
    }
    let interval = fields.text("interval")?;
    let timeout = fields.text("scrapeTimeout")?;
    for (field, text, setting) in [
        ("interval", interval, "scrape_interval"),
        ("scrapeTimeout", timeout, "scrape_timeout"),
    ] {
        if let Some(text) = text {
            let value = duration::scale(text, env.time_scale)
                .map_err(|error| format!("{}: {error}", fields.at(field)))?;
            settings.insert(setting.into(), value.into());
        }
    }
    // The operator refuses the monitor then (the interval alone is compared with Prometheus's
    // global one, which is not known here).
    if let (Some(interval), Some(timeout)) = (interval, timeout) {
        if duration::parse(timeout)? > duration::parse(interval)? {
            return Err(format!(
                "{}: scrapeTimeout {timeout} is greater than interval {interval}",
                fields.path
            ));
        }
    }
    if let Some(path) = fields.text("path")? {
        settings.insert("metrics_path".into(), path.into());
    }
    if let Some(scheme) = fields.text("scheme")? {
        let scheme = scheme.to_ascii_lowercase();
        if scheme != "http" && scheme != "https" {
            return Err(format!("{} is not http or https", fields.at("scheme")));
        }
        settings.insert("scheme".into(), scheme.into());
    }
    if let Some(tls) = fields.object("tlsConfig")? {
        if let Some(tls) = tls_config(kind, namespace, tls, env)? {
            settings.insert("tls_config".into(), tls.into());
        }
    }
    // Only ServiceMonitors have it (a file of the Prometheus pod).
    if kind == Kind::ServiceMonitor {
        if let Some(file) = fields.text("bearerTokenFile")? {
            let file = if file == SERVICE_ACCOUNT_TOKEN {
                env.token_file.display().to_string()
            } else {
                file.to_owned()
            };
            settings.insert("bearer_token_file".into(), file.into());
        }
    }
    if let Some(authorization) = fields.object("authorization")? {
        if settings.contains_key("bearer_token_file") {
            return Err(format!(
                "{}: authorization and bearerTokenFile together, which Prometheus refuses",
                fields.path
            ));
        }
        let authorization = read_authorization(namespace, authorization, env)?;
        settings.insert("authorization".into(), authorization);
    }
    let relabelings = relabel_configs(&mut fields, "relabelings")?;
    let metric_relabelings = relabel_configs(&mut fields, "metricRelabelings")?;
    let filter_running = fields.boolean("filterRunning")?.unwrap_or(true);
    fields.finish()?;
    Ok(Endpoint {
        port,
        filter_running,
        settings,
        relabelings,
        metric_relabelings,
    })
}

/// `authorization` with its credentials inlined, as the operator writes it.
fn read_authorization(
    namespace: &str,
    mut authorization: Fields,
    env: &Environment,
) -> Result<Value, String> {
    let kind = authorization.text("type")?.unwrap_or("Bearer").trim();
    if kind.eq_ignore_ascii_case("basic") {
        return Err(format!(
            "{}: the operator refuses type Basic (basicAuth is the field for it)",
            authorization.path
        ));
    }
    let credentials = authorization
        .object("credentials")?
        .ok_or_else(|| format!("{} is missing", authorization.at("credentials")))?;
    let (_, _, credentials) = read_key(namespace, "Secret", credentials, env)?;
    authorization.finish()?;
    Ok(json!({"type": kind, "credentials": credentials}))
}

/// `tls_config`; `None` for a PodMonitor's empty one, which the operator leaves out (a
/// ServiceMonitor's gives an empty `tls_config`).
fn tls_config(
    kind: Kind,
    namespace: &str,
    mut tls: Fields,
    env: &Environment,
) -> Result<Option<Map<String, Value>>, String> {
    let mut config = Map::new();
    if let Some(skip) = tls.boolean("insecureSkipVerify")? {
        config.insert("insecure_skip_verify".into(), skip.into());
    }
    let ca = tls_asset(namespace, &mut tls, "ca", env)?;
    let cert = tls_asset(namespace, &mut tls, "cert", env)?;
    let key = match tls.object("keySecret")? {
        Some(selector) => Some(write_key(namespace, "Secret", selector, env)?),
        None => None,
    };
    for (setting, file) in [("ca_file", &ca), ("cert_file", &cert), ("key_file", &key)] {
        if let Some(file) = file {
            config.insert(setting.into(), file.clone().into());
        }
    }
    if let Some(name) = tls.text("serverName")? {
        config.insert("server_name".into(), name.into());
    }
    for (field, setting) in [("minVersion", "min_version"), ("maxVersion", "max_version")] {
        if let Some(version) = tls.text(field)? {
            if !["TLS10", "TLS11", "TLS12", "TLS13"].contains(&version) {
                return Err(format!("{} is not TLS10 to TLS13", tls.at(field)));
            }
            config.insert(setting.into(), version.into());
        }
    }
    // Files of the Prometheus pod, kept as written; only ServiceMonitors have them.
    let (mut has_cert, mut has_key) = (cert.is_some(), key.is_some());
    if kind == Kind::ServiceMonitor {
        for (field, setting, from_object) in [
            ("caFile", "ca_file", ca.is_some()),
            ("certFile", "cert_file", cert.is_some()),
            ("keyFile", "key_file", key.is_some()),
        ] {
            if let Some(file) = tls.text(field)? {
                if from_object {
                    return Err(format!(
                        "{}: both {field} and the Secret or ConfigMap it stands for",
                        tls.path
                    ));
                }
                has_cert |= field == "certFile";
                has_key |= field == "keyFile";
                config.insert(setting.into(), file.into());
            }
        }
    }
    if has_cert != has_key {
        return Err(format!(
            "{}: a client certificate needs its key and a key its certificate",
            tls.path
        ));
    }
    tls.finish()?;
    Ok((kind == Kind::ServiceMonitor || !config.is_empty()).then_some(config))
}

/// The file holding the Secret's or ConfigMap's key that `field` (`ca`, `cert`) names, if it
/// names one.
fn tls_asset(
    namespace: &str,
    tls: &mut Fields,
    field: &str,
    env: &Environment,
) -> Result<Option<String>, String> {
    let Some(mut reference) = tls.object(field)? else {
        return Ok(None);
    };
    let secret = reference.object("secret")?;
    let config_map = reference.object("configMap")?;
    reference.finish()?;
    match (secret, config_map) {
        (Some(_), Some(_)) => Err(format!("{}: both a Secret and a ConfigMap", tls.at(field))),
        (Some(selector), None) => write_key(namespace, "Secret", selector, env).map(Some),
        (None, Some(selector)) => write_key(namespace, "ConfigMap", selector, env).map(Some),
        (None, None) => Ok(None),
    }
}

/// The name, key and text of the key a `{name, key}` selector names, through
/// [`Environment::resolve`].
fn read_key<'a>(
    namespace: &str,
    kind: &str,
    mut selector: Fields<'a>,
    env: &Environment,
) -> Result<(&'a str, &'a str, String), String> {
    let mut required = |field: &str| {
        selector
            .text(field)?
            .ok_or_else(|| format!("{} is missing", selector.at(field)))
    };
    let (name, key) = (required("name")?, required("key")?);
    let path = selector.path.clone();
    selector.finish()?;
    let text = (env.resolve)(namespace, kind, name, key)
        .map_err(|error| format!("{path}: {kind} {namespace}/{name}, key {key}: {error}"))?;
    Ok((name, key, text))
}

/// Writes the key a selector names to a file of [`Environment::assets_dir`], named as the
/// operator names its TLS assets (`0_` Secrets, `1_` ConfigMaps), and returns its path.
fn write_key(
    namespace: &str,
    kind: &str,
    selector: Fields,
    env: &Environment,
) -> Result<String, String> {
    let (name, key, text) = read_key(namespace, kind, selector, env)?;
    let source = if kind == "Secret" { 0 } else { 1 };
    let path = env
        .assets_dir
        .join(format!("{source}_{namespace}_{name}_{key}"));
    std::fs::create_dir_all(env.assets_dir)
        .and_then(|()| std::fs::write(&path, text))
        .map_err(|error| format!("writing {}: {error}", path.display()))?;
    Ok(path.display().to_string())
}

/// The relabeling actions the CRDs accept, lowercased as the operator writes them.
const ACTIONS: [&str; 11] = [
    "replace",
    "keep",
    "drop",
    "hashmod",
    "labelmap",
    "labeldrop",
    "labelkeep",
    "lowercase",
    "uppercase",
    "keepequal",
    "dropequal",
];

/// A list of the CRDs' RelabelConfig (camelCase) as Prometheus's relabel configs.
fn relabel_configs(fields: &mut Fields, key: &str) -> Result<Vec<Value>, String> {
    let path = fields.at(key);
    fields
        .list(key)?
        .iter()
        .enumerate()
        .map(|(i, rule)| relabel_config(Fields::new(rule, format!("{path}[{i}]"))?))
        .collect()
}

fn relabel_config(mut rule: Fields) -> Result<Value, String> {
    let mut config = Map::new();
    let sources = rule.strings("sourceLabels")?;
    if !sources.is_empty() {
        config.insert("source_labels".into(), sources.into());
    }
    if let Some(separator) = rule.string("separator")? {
        config.insert("separator".into(), separator.into());
    }
    if let Some(target) = rule.text("targetLabel")? {
        config.insert("target_label".into(), target.into());
    }
    if let Some(regex) = rule.text("regex")? {
        config.insert("regex".into(), regex.into());
    }
    match rule.get("modulus") {
        None => {}
        Some(modulus) => match modulus.as_u64() {
            Some(0) => {}
            Some(modulus) => {
                config.insert("modulus".into(), modulus.into());
            }
            None => return Err(format!("{} is not a whole number", rule.at("modulus"))),
        },
    }
    if let Some(replacement) = rule.string("replacement")? {
        config.insert("replacement".into(), replacement.into());
    }
    if let Some(action) = rule.text("action")? {
        let action = action.to_ascii_lowercase();
        if !ACTIONS.contains(&action.as_str()) {
            return Err(format!(
                "{} {action:?} is not a relabeling action",
                rule.at("action")
            ));
        }
        config.insert("action".into(), action.into());
    }
    rule.finish()?;
    Ok(config.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use cdn_operator::api::{CdnCluster, CdnClusterSpec, Role};
    use cdn_operator::cdncluster::build;
    use std::path::PathBuf;
    use std::process::Command;

    const KUBECONFIG: &str = "/test/kubeconfig";
    const TOKEN: &str = "/test/token";

    fn nothing(namespace: &str, kind: &str, name: &str, key: &str) -> Result<String, String> {
        Err(format!("no {kind} {namespace}/{name} with {key} here"))
    }

    fn convert_with(
        objects: &[Value],
        resolve: &Resolve,
        assets_dir: &Path,
        time_scale: u32,
    ) -> Result<Vec<Value>, String> {
        let env = Environment {
            kubeconfig: Path::new(KUBECONFIG),
            token_file: Path::new(TOKEN),
            resolve,
            assets_dir,
            time_scale,
        };
        scrape_configs(objects, &env)
    }

    fn convert(objects: &[Value]) -> Result<Vec<Value>, String> {
        convert_with(objects, &nothing, Path::new("/nonexistent"), 1)
    }

    fn yaml(text: &str) -> Vec<Value> {
        yaml_documents(text).unwrap()
    }

    /// The documents of a shipped file, in `namespace` as kustomize puts them.
    fn shipped(path: &str, namespace: &str) -> Vec<Value> {
        let path = crate::repository_root().join(path);
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let mut documents = yaml(&text);
        for document in &mut documents {
            document["metadata"]["namespace"] = namespace.into();
        }
        documents
    }

    /// The operator's sharding rules, written out.
    fn sharding_rules() -> [Value; 3] {
        [
            json!({"source_labels": ["__address__", "__tmp_hash"], "target_label": "__tmp_hash",
                   "regex": "(.+);", "replacement": "$1", "action": "replace"}),
            json!({"source_labels": ["__tmp_hash"], "target_label": "__tmp_hash", "modulus": 1,
                   "action": "hashmod"}),
            json!({"source_labels": ["__tmp_hash", "__tmp_disable_sharding"],
                   "regex": "0;|.+;.+", "action": "keep"}),
        ]
    }

    /// The relabelings of the shipped ServiceMonitor (kustomize's, OLM's).
    fn operator_relabelings() -> Vec<Value> {
        let target = [
            "__meta_kubernetes_endpoint_address_target_kind",
            "__meta_kubernetes_endpoint_address_target_name",
        ];
        let mut rules = vec![
            json!({"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"}),
            json!({"action": "keep",
                   "source_labels": ["__meta_kubernetes_service_label_app_kubernetes_io_component",
                                     "__meta_kubernetes_service_labelpresent_app_kubernetes_io_component"],
                   "regex": "(metrics);true"}),
            json!({"action": "keep",
                   "source_labels": ["__meta_kubernetes_service_label_app_kubernetes_io_name",
                                     "__meta_kubernetes_service_labelpresent_app_kubernetes_io_name"],
                   "regex": "(cdn-operator);true"}),
            json!({"action": "keep", "source_labels": ["__meta_kubernetes_endpoint_port_name"],
                   "regex": "metrics"}),
            json!({"source_labels": target, "separator": ";", "regex": "Node;(.*)",
                   "replacement": "${1}", "target_label": "node"}),
            json!({"source_labels": target, "separator": ";", "regex": "Pod;(.*)",
                   "replacement": "${1}", "target_label": "pod"}),
            json!({"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"}),
            json!({"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"}),
            json!({"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"}),
            json!({"source_labels": ["__meta_kubernetes_pod_container_name"],
                   "target_label": "container"}),
            json!({"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"],
                   "regex": "(Failed|Succeeded)"}),
            json!({"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job",
                   "replacement": "${1}"}),
            json!({"source_labels": ["__meta_kubernetes_service_label_app_kubernetes_io_name"],
                   "target_label": "job", "regex": "(.+)", "replacement": "${1}"}),
            json!({"target_label": "endpoint", "replacement": "metrics"}),
        ];
        rules.extend(sharding_rules());
        rules
    }

    #[test]
    fn the_kustomize_service_monitor_scrapes_the_metrics_service_with_prometheus_token() {
        let objects = shipped(
            "kustomize/components/prometheus/service_monitor.yaml",
            "cdn-operator",
        );
        assert_eq!(
            convert(&objects).unwrap(),
            [json!({
                "job_name": "serviceMonitor/cdn-operator/cdn-operator/0",
                "honor_labels": true,
                "kubernetes_sd_configs": [{
                    "role": "endpoints",
                    "namespaces": {"names": ["cdn-operator"]},
                    "kubeconfig_file": KUBECONFIG,
                }],
                "scrape_interval": "30s",
                "metrics_path": "/metrics",
                "scheme": "https",
                "tls_config": {"insecure_skip_verify": true},
                "bearer_token_file": TOKEN,
                "relabel_configs": operator_relabelings(),
            })]
        );
    }

    #[test]
    fn the_kustomize_pod_monitor_scrapes_the_metrics_sidecars_in_every_namespace() {
        let objects = shipped(
            "kustomize/components/prometheus/pod_monitor.yaml",
            "cdn-operator",
        );
        let mut rules = vec![
            json!({"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"}),
            json!({"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"],
                   "regex": "(Failed|Succeeded)"}),
            json!({"action": "keep",
                   "source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_managed_by",
                                     "__meta_kubernetes_pod_labelpresent_app_kubernetes_io_managed_by"],
                   "regex": "(cdn-operator);true"}),
            json!({"action": "keep",
                   "source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_name",
                                     "__meta_kubernetes_pod_labelpresent_app_kubernetes_io_name"],
                   "regex": "(cdncluster);true"}),
            json!({"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                   "regex": "metrics"}),
            json!({"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"}),
            json!({"source_labels": ["__meta_kubernetes_pod_container_name"],
                   "target_label": "container"}),
            json!({"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"}),
            json!({"target_label": "job", "replacement": "cdn-operator/cdn-operator-cdnclusters"}),
            json!({"source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_name"],
                   "target_label": "job", "regex": "(.+)", "replacement": "${1}"}),
            json!({"target_label": "endpoint", "replacement": "metrics"}),
        ];
        rules.extend(sharding_rules());
        assert_eq!(
            convert(&objects).unwrap(),
            [json!({
                "job_name": "podMonitor/cdn-operator/cdn-operator-cdnclusters/0",
                "honor_labels": false,
                "kubernetes_sd_configs": [{"role": "pod", "kubeconfig_file": KUBECONFIG}],
                "scrape_interval": "30s",
                "metrics_path": "/metrics",
                "relabel_configs": rules,
            })]
        );
    }

    #[test]
    fn the_olm_service_monitor_inlines_the_scraper_token_from_its_secret() {
        let objects = shipped(
            "olm/monitoring/prometheus-operator/service_monitor.yaml",
            "cdn-operator",
        );
        let resolve = |namespace: &str, kind: &str, name: &str, key: &str| {
            let wanted = (
                "cdn-operator",
                "Secret",
                "cdn-operator-metrics-scraper-token",
                "token",
            );
            if (namespace, kind, name, key) == wanted {
                Ok("scraper-token".to_string())
            } else {
                nothing(namespace, kind, name, key)
            }
        };
        let configs = convert_with(&objects, &resolve, Path::new("/nonexistent"), 1).unwrap();
        assert_eq!(
            configs,
            [json!({
                "job_name": "serviceMonitor/cdn-operator/cdn-operator/0",
                "honor_labels": true,
                "kubernetes_sd_configs": [{
                    "role": "endpoints",
                    "namespaces": {"names": ["cdn-operator"]},
                    "kubeconfig_file": KUBECONFIG,
                }],
                "scrape_interval": "30s",
                "metrics_path": "/metrics",
                "scheme": "https",
                "tls_config": {"insecure_skip_verify": true},
                "authorization": {"type": "Bearer", "credentials": "scraper-token"},
                "relabel_configs": operator_relabelings(),
            })]
        );
        // A token the API does not give is an error, as the operator skips the monitor then.
        let error = convert(&objects).unwrap_err();
        assert!(
            error.starts_with(
                "ServiceMonitor cdn-operator/cdn-operator: spec.endpoints[0].authorization.credentials: \
                 Secret cdn-operator/cdn-operator-metrics-scraper-token, key token: "
            ),
            "{error}"
        );
    }

    const SELECTOR: &str = r#"
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata: {name: m, namespace: ns}
spec:
  selector:
    matchLabels: {tier: web, app.kubernetes.io/part-of: shop}
    matchExpressions:
      - {key: app.kubernetes.io/name, operator: In, values: [a, b]}
      - {key: stage, operator: NotIn, values: [test]}
      - {key: metrics.io/scrape, operator: Exists}
      - {key: legacy, operator: DoesNotExist}
  endpoints: [{port: web}]
"#;

    #[test]
    fn match_labels_by_key_then_match_expressions_become_keep_and_drop_rules() {
        let configs = convert(&yaml(SELECTOR)).unwrap();
        let rules = configs[0]["relabel_configs"].as_array().unwrap();
        assert_eq!(
            rules[1..8],
            [
                json!({"action": "keep",
                       "source_labels": ["__meta_kubernetes_service_label_app_kubernetes_io_part_of",
                                         "__meta_kubernetes_service_labelpresent_app_kubernetes_io_part_of"],
                       "regex": "(shop);true"}),
                json!({"action": "keep",
                       "source_labels": ["__meta_kubernetes_service_label_tier",
                                         "__meta_kubernetes_service_labelpresent_tier"],
                       "regex": "(web);true"}),
                json!({"action": "keep",
                       "source_labels": ["__meta_kubernetes_service_label_app_kubernetes_io_name",
                                         "__meta_kubernetes_service_labelpresent_app_kubernetes_io_name"],
                       "regex": "(a|b);true"}),
                json!({"action": "drop",
                       "source_labels": ["__meta_kubernetes_service_label_stage",
                                         "__meta_kubernetes_service_labelpresent_stage"],
                       "regex": "(test);true"}),
                json!({"action": "keep",
                       "source_labels": ["__meta_kubernetes_service_labelpresent_metrics_io_scrape"],
                       "regex": "true"}),
                json!({"action": "drop",
                       "source_labels": ["__meta_kubernetes_service_labelpresent_legacy"],
                       "regex": "true"}),
                json!({"action": "keep", "source_labels": ["__meta_kubernetes_endpoint_port_name"],
                       "regex": "web"}),
            ]
        );
        // A PodMonitor's read the pods' labels, after the running filter.
        let pod_monitor = SELECTOR
            .replace("kind: ServiceMonitor", "kind: PodMonitor")
            .replace("endpoints:", "podMetricsEndpoints:");
        let configs = convert(&yaml(&pod_monitor)).unwrap();
        let rules = configs[0]["relabel_configs"].as_array().unwrap();
        assert_eq!(
            rules[1]["source_labels"],
            json!(["__meta_kubernetes_pod_phase"])
        );
        assert_eq!(
            rules[6],
            json!({"action": "keep",
                   "source_labels": ["__meta_kubernetes_pod_labelpresent_metrics_io_scrape"],
                   "regex": "true"})
        );
        for (from, to, error) in [
            (
                "values: [test]",
                "values: []",
                "spec.selector.matchExpressions[1]: NotIn needs values",
            ),
            (
                "operator: Exists}",
                "operator: Exists, values: [x]}",
                "spec.selector.matchExpressions[2]: Exists takes no values",
            ),
            (
                "operator: DoesNotExist",
                "operator: Gt",
                "spec.selector.matchExpressions[3]: operator \"Gt\" is not In, NotIn, Exists or DoesNotExist",
            ),
        ] {
            assert_eq!(
                convert(&yaml(&SELECTOR.replace(from, to))).unwrap_err(),
                format!("ServiceMonitor ns/m: {error}")
            );
        }
    }

    #[test]
    fn the_namespace_selector_gives_the_namespaces_to_discover() {
        for (kind, endpoints) in [
            ("ServiceMonitor", "endpoints"),
            ("PodMonitor", "podMetricsEndpoints"),
        ] {
            for (selector, namespaces) in [
                ("", Some(json!(["own"]))),
                ("namespaceSelector: {}", Some(json!(["own"]))),
                ("namespaceSelector: {any: true}", None),
                ("namespaceSelector: {any: true, matchNames: [a]}", None),
                (
                    "namespaceSelector: {matchNames: [a, b]}",
                    Some(json!(["a", "b"])),
                ),
                (
                    "namespaceSelector: {any: false, matchNames: [a]}",
                    Some(json!(["a"])),
                ),
            ] {
                let monitor = format!(
                    "apiVersion: monitoring.coreos.com/v1\nkind: {kind}\n\
                     metadata: {{name: m, namespace: own}}\n\
                     spec:\n  {selector}\n  {endpoints}: [{{port: web}}]\n"
                );
                let configs = convert(&yaml(&monitor)).unwrap();
                let discovery = &configs[0]["kubernetes_sd_configs"][0];
                assert_eq!(
                    discovery.get("namespaces"),
                    namespaces.map(|names| json!({ "names": names })).as_ref(),
                    "{kind} {selector}"
                );
            }
        }
    }

    #[test]
    fn durations_are_divided_by_the_time_scale() {
        let mut objects = shipped(
            "kustomize/components/prometheus/service_monitor.yaml",
            "cdn-operator",
        );
        objects[0]["spec"]["endpoints"][0]["scrapeTimeout"] = "10s".into();
        objects.extend(shipped(
            "kustomize/components/prometheus/pod_monitor.yaml",
            "cdn-operator",
        ));
        objects[1]["spec"]["podMetricsEndpoints"][0]["interval"] = "1m".into();
        let configs = convert_with(&objects, &nothing, Path::new("/nonexistent"), 20).unwrap();
        assert_eq!(configs[0]["scrape_interval"], "1s500ms");
        assert_eq!(configs[0]["scrape_timeout"], "500ms");
        assert_eq!(configs[1]["scrape_interval"], "3s");
        // Unchanged otherwise.
        let unscaled = convert(&objects).unwrap();
        assert_eq!(unscaled[0]["scrape_interval"], "30s");
        assert_eq!(unscaled[0]["scrape_timeout"], "10s");
        assert_eq!(unscaled[1]["scrape_interval"], "1m");
        // Not a whole number of Prometheus's milliseconds, and a timeout over the interval, are
        // errors.
        objects[1]["spec"]["podMetricsEndpoints"][0]["interval"] = "10ms".into();
        assert_eq!(
            convert_with(&objects, &nothing, Path::new("/nonexistent"), 20).unwrap_err(),
            "PodMonitor cdn-operator/cdn-operator-cdnclusters: \
             spec.podMetricsEndpoints[0].interval: 10ms divided by 20 is not a whole number of \
             milliseconds"
        );
        objects[0]["spec"]["endpoints"][0]["scrapeTimeout"] = "1m".into();
        assert_eq!(
            convert(&objects).unwrap_err(),
            "ServiceMonitor cdn-operator/cdn-operator: spec.endpoints[0]: \
             scrapeTimeout 1m is greater than interval 30s"
        );
    }

    #[test]
    fn yaml_documents_skips_the_empty_ones() {
        let text = "---\n# Source: a\n---\na: 1\n---\n---\nb: [x]\n---\n";
        assert_eq!(yaml(text), [json!({"a": 1}), json!({"b": ["x"]})]);
        assert!(yaml_documents("a: [").is_err());
    }

    #[test]
    fn relabelings_become_prometheus_relabel_configs_before_the_sharding() {
        let mut objects = shipped(
            "kustomize/components/prometheus/service_monitor.yaml",
            "cdn-operator",
        );
        let endpoint = &mut objects[0]["spec"]["endpoints"][0];
        endpoint["relabelings"] = json!([
            {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node_name",
             "action": "Replace"},
            {"action": "LabelMap", "regex": "__meta_kubernetes_pod_label_(.+)",
             "replacement": "pod_$1"},
            {"sourceLabels": ["__address__"], "separator": ";", "targetLabel": "__tmp_x",
             "modulus": 4, "action": "HashMod"},
        ]);
        endpoint["metricRelabelings"] =
            json!([{"action": "drop", "sourceLabels": ["__name__"], "regex": "go_.*"}]);
        let configs = convert(&objects).unwrap();
        let mut rules = operator_relabelings();
        rules.splice(
            rules.len() - 3..rules.len() - 3,
            [
                json!({"source_labels": ["__meta_kubernetes_pod_node_name"],
                       "target_label": "node_name", "action": "replace"}),
                json!({"regex": "__meta_kubernetes_pod_label_(.+)", "replacement": "pod_$1",
                       "action": "labelmap"}),
                json!({"source_labels": ["__address__"], "separator": ";",
                       "target_label": "__tmp_x", "modulus": 4, "action": "hashmod"}),
            ],
        );
        assert_eq!(configs[0]["relabel_configs"], json!(rules));
        assert_eq!(
            configs[0]["metric_relabel_configs"],
            json!([{"source_labels": ["__name__"], "regex": "go_.*", "action": "drop"}])
        );
    }

    #[test]
    fn fields_it_does_not_support_are_errors_naming_them() {
        let service_monitor = shipped(
            "kustomize/components/prometheus/service_monitor.yaml",
            "cdn-operator",
        );
        let pod_monitor = shipped(
            "kustomize/components/prometheus/pod_monitor.yaml",
            "cdn-operator",
        );
        let cases: [(&[Value], &str, Value, &str); 7] = [
            (
                &service_monitor,
                "/spec/endpoints/0/oauth2",
                json!({"clientId": {}}),
                "ServiceMonitor cdn-operator/cdn-operator: spec.endpoints[0].oauth2 is not supported",
            ),
            (
                &service_monitor,
                "/spec/sampleLimit",
                json!(100),
                "ServiceMonitor cdn-operator/cdn-operator: spec.sampleLimit is not supported",
            ),
            (
                &service_monitor,
                "/spec/endpoints/0/relabelings",
                json!([{"source_labels": ["a"], "target_label": "b"}]),
                "ServiceMonitor cdn-operator/cdn-operator: spec.endpoints[0].relabelings[0].source_labels is not supported",
            ),
            (
                &service_monitor,
                "/spec/endpoints/0/tlsConfig/ca",
                json!({"secret": {"name": "ca", "key": "ca.crt", "optional": true}}),
                "ServiceMonitor cdn-operator/cdn-operator: spec.endpoints[0].tlsConfig.ca.secret.optional is not supported",
            ),
            (
                &service_monitor,
                "/spec/endpoints/0/metricRelabelings",
                json!([{"action": "delete"}]),
                "ServiceMonitor cdn-operator/cdn-operator: spec.endpoints[0].metricRelabelings[0].action \"delete\" is not a relabeling action",
            ),
            (
                &pod_monitor,
                "/spec/podMetricsEndpoints/0/bearerTokenFile",
                json!(SERVICE_ACCOUNT_TOKEN),
                "PodMonitor cdn-operator/cdn-operator-cdnclusters: spec.podMetricsEndpoints[0].bearerTokenFile is not supported",
            ),
            (
                &pod_monitor,
                "/spec/selectorMechanism",
                json!("RoleSelector"),
                "PodMonitor cdn-operator/cdn-operator-cdnclusters: spec.selectorMechanism is not supported",
            ),
        ];
        for (objects, pointer, value, error) in cases {
            let mut objects = objects.to_vec();
            let (parent, field) = pointer.rsplit_once('/').unwrap();
            objects[0].pointer_mut(parent).unwrap()[field] = value;
            assert_eq!(convert(&objects).unwrap_err(), error, "{pointer}");
        }
    }

    #[test]
    fn tls_files_from_secrets_and_config_maps_are_written_as_the_operator_writes_them() {
        let mut objects = shipped(
            "kustomize/components/prometheus/service_monitor.yaml",
            "cdn-operator",
        );
        objects[0]["spec"]["endpoints"][0]["tlsConfig"] = json!({
            "ca": {"configMap": {"name": "ca", "key": "service-ca.crt"}},
            "cert": {"secret": {"name": "client", "key": "tls.crt"}},
            "keySecret": {"name": "client", "key": "tls.key"},
            "serverName": "cdn-operator-metrics.cdn-operator.svc",
        });
        let assets = tempfile::tempdir().unwrap();
        let resolve = |namespace: &str, kind: &str, name: &str, key: &str| {
            Ok(format!("{kind} {namespace}/{name} {key}"))
        };
        let configs = convert_with(&objects, &resolve, assets.path(), 1).unwrap();
        let file = |name: &str| assets.path().join(name).display().to_string();
        assert_eq!(
            configs[0]["tls_config"],
            json!({
                "ca_file": file("1_cdn-operator_ca_service-ca.crt"),
                "cert_file": file("0_cdn-operator_client_tls.crt"),
                "key_file": file("0_cdn-operator_client_tls.key"),
                "server_name": "cdn-operator-metrics.cdn-operator.svc",
            })
        );
        for (name, text) in [
            (
                "1_cdn-operator_ca_service-ca.crt",
                "ConfigMap cdn-operator/ca service-ca.crt",
            ),
            (
                "0_cdn-operator_client_tls.key",
                "Secret cdn-operator/client tls.key",
            ),
        ] {
            assert_eq!(std::fs::read_to_string(file(name)).unwrap(), text);
        }
        // The CA twice, or a certificate without its key, the operator refuses.
        let tls = &mut objects[0]["spec"]["endpoints"][0]["tlsConfig"];
        tls["caFile"] = "/etc/ca.crt".into();
        assert_eq!(
            convert_with(&objects, &resolve, assets.path(), 1).unwrap_err(),
            "ServiceMonitor cdn-operator/cdn-operator: spec.endpoints[0].tlsConfig: \
             both caFile and the Secret or ConfigMap it stands for"
        );
        let tls = &mut objects[0]["spec"]["endpoints"][0]["tlsConfig"];
        tls.as_object_mut().unwrap().remove("keySecret");
        tls.as_object_mut().unwrap().remove("ca");
        assert_eq!(
            convert_with(&objects, &resolve, assets.path(), 1).unwrap_err(),
            "ServiceMonitor cdn-operator/cdn-operator: spec.endpoints[0].tlsConfig: \
             a client certificate needs its key and a key its certificate"
        );
    }

    /// Whether `pattern` matches all of `text`, anchored as Prometheus anchors relabeling
    /// regexes (RE2 syntax, which the regex crate shares).
    fn full_match(pattern: &str, text: &str) -> bool {
        regex::Regex::new(&format!("^(?:{pattern})$"))
            .unwrap_or_else(|e| panic!("{pattern}: {e}"))
            .is_match(text)
    }

    #[test]
    fn the_test_matcher_matches_as_prometheus_does() {
        for (pattern, text, matches) in [
            ("(cdn-operator);true", "cdn-operator;true", true),
            ("(cdn-operator);true", "cdn-operator-x;true", false),
            ("(cdn-operator);true", ";", false),
            ("(a|b);true", "b;true", true),
            ("(Failed|Succeeded)", "Running", false),
            ("Pod;(.*)", "Pod;x", true),
            ("(.+);", ";", false),
            ("0;|.+;.+", "0;", true),
            ("0;|.+;.+", "1;", false),
            ("0;|.+;.+", "1;x", true),
            ("metrics", "metrics", true),
            ("metrics", "metricsx", false),
            ("go_.*", "go_gc", true),
            ("a\\.b?c", "a.c", true),
            ("1.0", "1x0", true),
        ] {
            assert_eq!(full_match(pattern, text), matches, "{pattern} {text}");
        }
    }

    /// The meta labels Prometheus discovers for a target of an `object` (`service`, `pod`)
    /// labelled `labels`, on the port `port`, named in `port_label`.
    fn discovered(
        object: &str,
        labels: &Value,
        port_label: &str,
        port: &str,
    ) -> BTreeMap<String, String> {
        let mut meta = BTreeMap::from([(port_label.to_string(), port.to_string())]);
        for (key, value) in labels.as_object().expect("labels") {
            meta.insert(label_of(object, key), value.as_str().unwrap().into());
            meta.insert(label_present(object, key), "true".into());
        }
        meta
    }

    /// Whether the keep and drop rules of `config` on the discovered object's labels and port
    /// keep a target with the meta labels `meta` (the pod phase and the sharding are not this
    /// check's).
    fn kept(config: &Value, meta: &BTreeMap<String, String>) -> bool {
        let selects = |source: &str| {
            source.starts_with("__meta_kubernetes_service_label")
                || source.starts_with("__meta_kubernetes_pod_label")
                || source.ends_with("_port_name")
        };
        config["relabel_configs"]
            .as_array()
            .unwrap()
            .iter()
            .all(|rule| {
                let action = rule["action"].as_str().unwrap_or("replace");
                let sources: Vec<&str> = rule["source_labels"]
                    .as_array()
                    .map(|s| s.iter().map(|s| s.as_str().unwrap()).collect())
                    .unwrap_or_default();
                if !matches!(action, "keep" | "drop") || !sources.iter().all(|s| selects(s)) {
                    return true;
                }
                let value: Vec<&str> = sources
                    .iter()
                    .map(|s| meta.get(*s).map_or("", String::as_str))
                    .collect();
                full_match(rule["regex"].as_str().unwrap(), &value.join(";")) == (action == "keep")
            })
    }

    /// The rules that set `job`.
    fn job_rules(config: &Value) -> Vec<Value> {
        config["relabel_configs"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|rule| rule["target_label"] == "job")
            .cloned()
            .collect()
    }

    /// `name`: the file `variable` names, else on PATH, else where `scripts/install-helm.sh`
    /// puts the tools (`~/.cache/cdn-operator-tools/bin`).
    fn tool(variable: &str, name: &str) -> Option<PathBuf> {
        if let Some(path) = std::env::var_os(variable).filter(|p| !p.is_empty()) {
            return Some(path.into());
        }
        let path = std::env::var_os("PATH").unwrap_or_default();
        let cache = std::env::var_os("HOME")
            .map(|home| PathBuf::from(home).join(".cache/cdn-operator-tools/bin"));
        std::env::split_paths(&path)
            .chain(cache)
            .map(|dir| dir.join(name))
            .find(|file| file.is_file())
    }

    fn render(command: &mut Command) -> Vec<Value> {
        let output = command.output().expect("the tool runs");
        assert!(
            output.status.success(),
            "{command:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        yaml(&String::from_utf8(output.stdout).unwrap())
    }

    fn find<'v>(objects: &'v [Value], kind: &str, name: &str) -> &'v Value {
        objects
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name}"))
    }

    /// The labels and port names of the pods the operator builds for a CdnCluster of `role`
    /// with the metrics sidecar.
    fn cdncluster_pod(role: Role) -> (Value, Vec<String>) {
        let sidecar = build::PodSettings {
            images: build::PodImages {
                metrics: Some("cdn-operator".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let cluster = CdnCluster::new("edge", CdnClusterSpec::new(role, vec![]));
        let children = build::children(&cluster, &[], &Default::default(), &sidecar);
        let template = children.workload.template();
        let labels = json!(template.metadata.as_ref().unwrap().labels);
        let spec = template.spec.as_ref().unwrap();
        let ports = spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .flat_map(|c| c.ports.iter().flatten())
            .filter_map(|p| p.name.clone())
            .collect();
        (labels, ports)
    }

    #[test]
    fn the_helm_charts_monitors_select_the_operator_and_the_cdncluster_pods() {
        let Some(helm) = tool("HELM", "helm") else {
            crate::say("skipped: no helm");
            return;
        };
        let objects = render(
            Command::new(helm)
                .args(["template", "t"])
                .arg(crate::repository_root().join("helm/cdn-operator"))
                .args(["--namespace", "ns"])
                .args(["--set", "metrics.serviceMonitor.enabled=true"])
                .args(["--set", "cdnMetrics.podMonitor.enabled=true"]),
        );
        let configs = convert(&objects).unwrap();
        let names: Vec<_> = configs.iter().map(|c| c["job_name"].clone()).collect();
        assert_eq!(
            names,
            [
                "serviceMonitor/ns/t-cdn-operator/0",
                "podMonitor/ns/t-cdn-operator-cdnclusters/0"
            ]
        );
        let (service_monitor, pod_monitor) = (&configs[0], &configs[1]);

        // The metrics Service, on its metrics port only; not another release's.
        let service = find(&objects, "Service", "t-cdn-operator-metrics");
        let labels = &service["metadata"]["labels"];
        let port_label = "__meta_kubernetes_endpoint_port_name";
        for port in service["spec"]["ports"].as_array().unwrap() {
            let port = port["name"].as_str().unwrap();
            let meta = discovered("service", labels, port_label, port);
            assert_eq!(kept(service_monitor, &meta), port == "metrics", "{port}");
        }
        let mut other = labels.clone();
        other["app.kubernetes.io/instance"] = "other".into();
        assert!(!kept(
            service_monitor,
            &discovered("service", &other, port_label, "metrics")
        ));

        // Every CdnCluster pod, on its sidecar's port only.
        let port_label = "__meta_kubernetes_pod_container_port_name";
        for role in [Role::Balancer, Role::Cache] {
            let (labels, ports) = cdncluster_pod(role);
            assert!(ports.iter().any(|p| p == "metrics"), "{ports:?}");
            for port in &ports {
                let meta = discovered("pod", &labels, port_label, port);
                assert_eq!(
                    kept(pod_monitor, &meta),
                    port == "metrics",
                    "{role:?} {port}"
                );
            }
        }

        // As kustomize's monitors scrape, but for the release's own instance label and names.
        let kustomize = convert(
            &[
                shipped("kustomize/components/prometheus/service_monitor.yaml", "ns"),
                shipped("kustomize/components/prometheus/pod_monitor.yaml", "ns"),
            ]
            .concat(),
        )
        .unwrap();
        for key in [
            "scheme",
            "honor_labels",
            "tls_config",
            "bearer_token_file",
            "metrics_path",
            "scrape_interval",
        ] {
            assert_eq!(service_monitor[key], kustomize[0][key], "{key}");
        }
        assert_eq!(job_rules(service_monitor), job_rules(&kustomize[0]));
        let kustomize_service = &shipped("kustomize/base/metrics_service.yaml", "ns")[0];
        assert_eq!(labels["app.kubernetes.io/name"], "cdn-operator");
        assert_eq!(
            kustomize_service["metadata"]["labels"]["app.kubernetes.io/name"],
            "cdn-operator"
        );
        let without_default_job = |config: &Value| {
            let mut config = config.clone();
            config["relabel_configs"]
                .as_array_mut()
                .unwrap()
                .retain(|rule| rule["target_label"] != "job" || rule["source_labels"].is_array());
            config.as_object_mut().unwrap().remove("job_name");
            config
        };
        assert_eq!(
            without_default_job(pod_monitor),
            without_default_job(&kustomize[1])
        );
    }

    #[test]
    fn the_kustomize_and_olm_renders_select_the_metrics_service() {
        let Some(kubectl) = tool("KUBECTL", "kubectl") else {
            crate::say("skipped: no kubectl");
            return;
        };
        let root = crate::repository_root();
        let bundle_service = shipped(
            "bundle/manifests/cdn-operator-metrics.service.yaml",
            "cdn-operator",
        );
        let assets = tempfile::tempdir().unwrap();
        let resolve =
            |_: &str, kind: &str, name: &str, key: &str| Ok(format!("{kind} {name} {key}"));
        for overlay in [
            "kustomize/overlays/monitoring",
            "olm/monitoring/prometheus-operator",
            "olm/monitoring/openshift",
        ] {
            let objects = render(
                Command::new(&kubectl)
                    .arg("kustomize")
                    .arg(root.join(overlay)),
            );
            let configs = convert_with(&objects, &resolve, assets.path(), 1).unwrap();
            let names: Vec<_> = configs.iter().map(|c| c["job_name"].clone()).collect();
            assert_eq!(
                names,
                [
                    "serviceMonitor/cdn-operator/cdn-operator/0",
                    "podMonitor/cdn-operator/cdn-operator-cdnclusters/0"
                ],
                "{overlay}"
            );
            // OLM installs the bundle's Service, kustomize its own.
            let service = objects
                .iter()
                .find(|o| o["kind"] == "Service" && o["metadata"]["name"] == "cdn-operator-metrics")
                .unwrap_or(&bundle_service[0]);
            let meta = discovered(
                "service",
                &service["metadata"]["labels"],
                "__meta_kubernetes_endpoint_port_name",
                "metrics",
            );
            assert!(kept(&configs[0], &meta), "{overlay}");
            assert_eq!(
                service["metadata"]["labels"]["app.kubernetes.io/name"],
                "cdn-operator"
            );
            assert_eq!(configs[0]["relabel_configs"], json!(operator_relabelings()));
        }
        // The kustomize overlay's are the component's files in the Deployment's namespace.
        let objects = render(
            Command::new(&kubectl)
                .arg("kustomize")
                .arg(root.join("kustomize/overlays/monitoring")),
        );
        let files = [
            shipped(
                "kustomize/components/prometheus/service_monitor.yaml",
                "cdn-operator",
            ),
            shipped(
                "kustomize/components/prometheus/pod_monitor.yaml",
                "cdn-operator",
            ),
        ]
        .concat();
        assert_eq!(convert(&objects).unwrap(), convert(&files).unwrap());
        // OpenShift's verifies the service CA's certificate of the Service's name.
        let objects = render(
            Command::new(&kubectl)
                .arg("kustomize")
                .arg(root.join("olm/monitoring/openshift")),
        );
        let configs = convert_with(&objects, &resolve, assets.path(), 1).unwrap();
        let ca = assets
            .path()
            .join("1_cdn-operator_cdn-operator-metrics-ca_service-ca.crt");
        assert_eq!(
            configs[0]["tls_config"],
            json!({
                "ca_file": ca.display().to_string(),
                "server_name": "cdn-operator-metrics.cdn-operator.svc",
            })
        );
        assert_eq!(
            std::fs::read_to_string(ca).unwrap(),
            "ConfigMap cdn-operator-metrics-ca service-ca.crt"
        );
        assert_eq!(
            configs[0]["authorization"],
            json!({"type": "Bearer", "credentials": "Secret cdn-operator-metrics-scraper-token token"})
        );
    }
}
