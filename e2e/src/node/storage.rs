//! Volumes on the node (this machine) for the claims of caches with `cache.volume`: a
//! StorageClass that provisions nothing and PersistentVolumes on folders of this machine, as the
//! local-path provisioner makes them; a folder may be a small filesystem of its own (tmpfs), to
//! fill a cache's disk. Depends on `world` (the objects and mounts go with the [`NodeTest`]).

use super::world::NodeTest;
use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, PostParams};
use kube::core::GroupVersionKind;
use kube::Resource;
use serde_json::json;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::Command;

/// Where the volumes are, on the node (this machine): `e2e/node.sh` sets it under its folder.
pub const VOLUME_DIR_ENV: &str = "CDN_E2E_VOLUME_DIR";
const VOLUME_DIR: &str = "/var/tmp/cdn-operator-node/volumes";

/// What backs a volume's folder.
#[derive(Clone, Copy, Debug)]
pub enum Backing {
    /// The machine's disk.
    Disk,
    /// A tmpfs of this many MiB: a filesystem smaller than a cache's `max_size`.
    Tmpfs(u32),
}

fn gvk<K: Resource<DynamicType = ()>>() -> GroupVersionKind {
    GroupVersionKind::gvk(&K::group(&()), &K::version(&()), &K::kind(&()))
}

/// StorageClass `class` (no provisioner, bound when a pod needs it) and `count` PersistentVolumes
/// `<class>-<i>` of `capacity` on folders of this machine writable by any user (the nginx pods
/// run as a user of their image), each backed by `backing`; deleted (and unmounted) with the test.
pub async fn local_volumes(
    t: &mut NodeTest,
    class: &str,
    count: usize,
    capacity: &str,
    backing: Backing,
) {
    let client = t.client.clone();
    let storage_class: StorageClass = serde_json::from_value(json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": class},
        "provisioner": "kubernetes.io/no-provisioner",
        "volumeBindingMode": "WaitForFirstConsumer",
    }))
    .expect("a StorageClass");
    Api::<StorageClass>::all(client.clone())
        .create(&PostParams::default(), &storage_class)
        .await
        .unwrap_or_else(|e| panic!("StorageClass {class}: {e}"));
    t.owns_cluster_scoped(gvk::<StorageClass>(), class);
    let volumes: Api<PersistentVolume> = Api::all(client);
    let dir = std::env::var(VOLUME_DIR_ENV).unwrap_or_else(|_| VOLUME_DIR.into());
    for i in 0..count {
        let name = format!("{class}-{i}");
        let path = PathBuf::from(&dir).join(&name);
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        if let Backing::Tmpfs(mib) = backing {
            let out = Command::new("mount")
                .args(["-t", "tmpfs", "-o"])
                .arg(format!("size={mib}m,mode=1777"))
                .arg("tmpfs")
                .arg(&path)
                .output()
                .expect("running mount");
            assert!(
                out.status.success(),
                "mount -t tmpfs on {}: {}",
                path.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            t.owns_mount(&path);
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o1777))
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let volume: PersistentVolume = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": name},
            "spec": {
                "capacity": {"storage": capacity},
                "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": class,
                "hostPath": {"path": path, "type": "Directory"},
            },
        }))
        .expect("a PersistentVolume");
        volumes
            .create(&PostParams::default(), &volume)
            .await
            .unwrap_or_else(|e| panic!("PersistentVolume {name}: {e}"));
        t.owns_cluster_scoped(gvk::<PersistentVolume>(), &name);
    }
}
