//! What the benchmark's own watches see of the CdnClusters and their children in its namespaces
//! ([`Seen`]), and the waits on it ([`wait_for`], [`seen_at`]) and on the operator going quiet
//! ([`settle`]).

use crate::workload::BENCH_LABEL;
use cdn_operator::api::{CdnCluster, State};
use cdn_operator::kubernetes::compact::Compact;
use cdn_operator_e2e::proxy::Proxy;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::api::Api;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, Resource};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// What the benchmark's watch of one kind has seen of the objects in its namespaces, kept up to
/// date as events arrive. The benchmark shares the machine with what it measures, so it keeps no
/// objects and scans none: each one's resourceVersion and whether it is done (for CdnClusters, a
/// status written for the generation) are all it needs.
#[derive(Default)]
pub struct Seen(Mutex<Objects>);

#[derive(Default)]
struct Objects {
    /// `namespace/name` → resourceVersion and done.
    versions: HashMap<String, (String, bool)>,
    done: usize,
    /// resourceVersion changes (creations and deletions too) since the watch began.
    changes: u64,
    /// The first list is in.
    listed: bool,
    /// The keys listed so far while the watch lists again: the others are gone at its end.
    relisting: Option<HashSet<String>>,
}

impl Objects {
    fn apply(&mut self, key: String, version: String, done: bool) {
        match self.versions.insert(key, (version.clone(), done)) {
            Some((before, was_done)) => {
                self.changes += u64::from(before != version);
                self.done -= usize::from(was_done);
            }
            None => self.changes += 1,
        }
        self.done += usize::from(done);
    }

    fn remove(&mut self, key: &str) {
        if let Some((_, was_done)) = self.versions.remove(key) {
            self.changes += 1;
            self.done -= usize::from(was_done);
        }
    }
}

impl Seen {
    fn objects(&self) -> std::sync::MutexGuard<'_, Objects> {
        self.0.lock().expect("not poisoned")
    }

    pub fn present(&self) -> usize {
        self.objects().versions.len()
    }

    pub fn done(&self) -> usize {
        self.objects().done
    }

    pub fn changes(&self) -> u64 {
        self.objects().changes
    }

    pub fn listed(&self) -> bool {
        self.objects().listed
    }

    pub fn version(&self, key: &str) -> Option<String> {
        self.objects().versions.get(key).map(|(v, _)| v.clone())
    }

    fn record<K: Resource>(
        &self,
        event: watcher::Event<K>,
        ours: &HashSet<String>,
        done: fn(&K) -> bool,
    ) {
        let key = |obj: &K| {
            let meta = obj.meta();
            let ns = meta.namespace.as_deref().filter(|ns| ours.contains(*ns))?;
            Some((
                format!("{ns}/{}", meta.name.as_deref()?),
                meta.resource_version.clone().unwrap_or_default(),
            ))
        };
        let mut objects = self.objects();
        match event {
            watcher::Event::Init => objects.relisting = Some(HashSet::new()),
            watcher::Event::InitApply(obj) | watcher::Event::Apply(obj) => {
                if let Some((key, version)) = key(&obj) {
                    if let Some(listed) = objects.relisting.as_mut() {
                        listed.insert(key.clone());
                    }
                    objects.apply(key, version, done(&obj));
                }
            }
            watcher::Event::Delete(obj) => {
                if let Some((key, _)) = key(&obj) {
                    objects.remove(&key);
                }
            }
            watcher::Event::InitDone => {
                if let Some(listed) = objects.relisting.take() {
                    let gone: Vec<String> = objects
                        .versions
                        .keys()
                        .filter(|k| !listed.contains(*k))
                        .cloned()
                        .collect();
                    for key in gone {
                        objects.remove(&key);
                    }
                }
                objects.listed = true;
            }
        }
    }
}

/// Follows `events` of the objects in `ours` (namespaces), ticking `tick` on each event.
fn track<K>(
    events: impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    ours: Arc<HashSet<String>>,
    done: fn(&K) -> bool,
    tick: Arc<watch::Sender<()>>,
) -> Arc<Seen>
where
    K: Resource + Send + 'static,
{
    let seen = Arc::new(Seen::default());
    let state = seen.clone();
    tokio::spawn(events.default_backoff().for_each(move |event| {
        if let Ok(event) = event {
            state.record(event, &ours, done);
            tick.send_replace(());
        }
        futures::future::ready(())
    }));
    seen
}

/// Follows the children of kind `K` in `ours`, read as the operator reads them.
fn track_children<K: Resource<DynamicType = ()> + 'static>(
    client: &Client,
    children: &watcher::Config,
    ours: &Arc<HashSet<String>>,
    tick: &Arc<watch::Sender<()>>,
) -> Arc<Seen> {
    let api = Api::<Compact<K>>::all(client.clone());
    track(
        watcher(api, children.clone()),
        ours.clone(),
        every,
        tick.clone(),
    )
}

/// Every child counts as done once it exists.
fn every<K>(_: &K) -> bool {
    true
}

/// A CdnCluster is done once its status is written for its generation.
fn written(c: &CdnCluster) -> bool {
    c.status.as_ref().is_some_and(|st| {
        st.observed_generation == c.metadata.generation
            && matches!(st.state, Some(State::Deploying | State::Running))
    })
}

/// The benchmark's watches of the CdnClusters and of their children in its namespaces, each event
/// ticking `tick`.
pub struct Watches {
    pub tick: Arc<watch::Sender<()>>,
    pub clusters: Arc<Seen>,
    pub deployments: Arc<Seen>,
    pub config_maps: Arc<Seen>,
    pub services: Arc<Seen>,
}

impl Watches {
    /// Starts watching the objects in `ours` (namespaces).
    pub fn start(client: &Client, ours: &Arc<HashSet<String>>) -> Watches {
        let children =
            watcher::Config::default().labels("app.kubernetes.io/managed-by=cdn-operator");
        let tick = Arc::new(watch::Sender::new(()));
        let clusters = track(
            watcher(
                Api::<CdnCluster>::all(client.clone()),
                watcher::Config::default().labels(&format!("{BENCH_LABEL}=true")),
            ),
            ours.clone(),
            written,
            tick.clone(),
        );
        let deployments = track_children::<Deployment>(client, &children, ours, &tick);
        let config_maps = track_children::<ConfigMap>(client, &children, ours, &tick);
        let services = track_children::<Service>(client, &children, ours, &tick);
        Watches {
            tick,
            clusters,
            deployments,
            config_maps,
            services,
        }
    }

    fn all(&self) -> [&Seen; 4] {
        [
            &self.clusters,
            &self.deployments,
            &self.config_maps,
            &self.services,
        ]
    }

    /// Waits until each watch has its first list in; false after `within`.
    pub async fn listed(&self, within: Duration) -> bool {
        let limit = Instant::now() + within;
        wait_for(&self.tick, limit, || self.all().iter().all(|s| s.listed())).await
    }

    /// The resourceVersion changes seen so far, of all four kinds.
    pub fn changes(&self) -> u64 {
        self.all().iter().map(|s| s.changes()).sum::<u64>()
    }

    /// Whether `n` of each child are present.
    pub fn children_present(&self, n: usize) -> bool {
        let all = |seen: &Seen| seen.present() >= n;
        all(&self.deployments) && all(&self.config_maps) && all(&self.services)
    }
}

/// Waits until `ready` holds, woken by `tick`, or `limit` passes; false then.
pub async fn wait_for(
    tick: &watch::Sender<()>,
    limit: Instant,
    mut ready: impl FnMut() -> bool,
) -> bool {
    let mut ticks = tick.subscribe();
    loop {
        ticks.borrow_and_update();
        if ready() {
            return true;
        }
        if Instant::now() > limit {
            return false;
        }
        // Woken at least each second to see the limit pass.
        let _ = tokio::time::timeout(Duration::from_secs(1), ticks.changed()).await;
    }
}

/// When `ready` first held, in milliseconds from `since` ([`wait_for`]); None past `limit`.
pub async fn seen_at(
    tick: &watch::Sender<()>,
    since: Instant,
    limit: Instant,
    ready: impl FnMut() -> bool,
) -> Option<f64> {
    wait_for(tick, limit, ready)
        .await
        .then(|| crate::stats::ms(since.elapsed()))
}

/// Waits until the proxy has seen no request for `quiet` (the operator is idle).
pub async fn settle(proxy: &Proxy, quiet: Duration, limit: Duration) {
    let deadline = Instant::now() + limit;
    let mut last = proxy.counts();
    let mut since = Instant::now();
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = proxy.counts();
        if now != last {
            last = now;
            since = Instant::now();
        } else if since.elapsed() >= quiet {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn config_map(ns: &str, name: &str, version: &str) -> ConfigMap {
        serde_json::from_value(json!({
            "metadata": {"namespace": ns, "name": name, "resourceVersion": version}
        }))
        .unwrap()
    }

    fn has_data(c: &ConfigMap) -> bool {
        c.data.is_some()
    }

    #[test]
    fn counts_what_the_watch_brings_in_its_namespaces_only() {
        let seen = Seen::default();
        let ours: HashSet<String> = ["a".to_string()].into();
        let record = |event| seen.record(event, &ours, has_data);
        record(watcher::Event::Init);
        record(watcher::Event::InitApply(config_map("a", "x", "1")));
        record(watcher::Event::InitApply(config_map("other", "y", "2")));
        assert!(!seen.listed());
        record(watcher::Event::InitDone);
        assert!(seen.listed());
        assert_eq!((seen.present(), seen.done(), seen.changes()), (1, 0, 1));

        let mut done = config_map("a", "x", "3");
        done.data = Some(Default::default());
        record(watcher::Event::Apply(done.clone()));
        assert_eq!((seen.present(), seen.done(), seen.changes()), (1, 1, 2));
        assert_eq!(seen.version("a/x").as_deref(), Some("3"));
        // The same version again (a re-list) is no change.
        record(watcher::Event::Apply(done));
        assert_eq!((seen.done(), seen.changes()), (1, 2));
        record(watcher::Event::Apply(config_map("other", "z", "4")));
        assert_eq!(seen.changes(), 2);

        record(watcher::Event::Apply(config_map("a", "w", "5")));
        record(watcher::Event::Delete(config_map("a", "w", "6")));
        assert_eq!((seen.present(), seen.done(), seen.changes()), (1, 1, 4));
        assert_eq!(seen.version("a/w"), None);
    }

    #[test]
    fn a_new_list_drops_what_it_no_longer_holds() {
        let seen = Seen::default();
        let ours: HashSet<String> = ["a".to_string()].into();
        let record = |event| seen.record(event, &ours, every);
        record(watcher::Event::Init);
        record(watcher::Event::InitApply(config_map("a", "x", "1")));
        record(watcher::Event::InitApply(config_map("a", "y", "2")));
        record(watcher::Event::InitDone);
        assert_eq!((seen.present(), seen.done(), seen.changes()), (2, 2, 2));
        // Listed again after the watch broke: y was deleted meanwhile, x did not change.
        record(watcher::Event::Init);
        record(watcher::Event::InitApply(config_map("a", "x", "1")));
        assert_eq!(seen.present(), 2, "kept until the list ends");
        record(watcher::Event::InitDone);
        assert_eq!((seen.present(), seen.done(), seen.changes()), (1, 1, 3));
        assert_eq!(seen.version("a/y"), None);
    }

    #[tokio::test]
    async fn the_wait_ends_on_the_tick_that_makes_it_true() {
        let tick = Arc::new(watch::Sender::new(()));
        let flag = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (set, ticker) = (flag.clone(), tick.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            set.store(true, std::sync::atomic::Ordering::SeqCst);
            ticker.send_replace(());
        });
        let start = Instant::now();
        let ready = || flag.load(std::sync::atomic::Ordering::SeqCst);
        assert!(wait_for(&tick, start + Duration::from_secs(30), ready).await);
        assert!(
            start.elapsed() < Duration::from_millis(900),
            "woken by the tick, not the 1 s timer"
        );
        let never = || false;
        assert!(!wait_for(&tick, Instant::now(), never).await);
    }
}
