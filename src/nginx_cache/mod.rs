//! nginx's cache as the purges see it: the format of a cache file (what nginx 1.30 writes with
//! `proxy_cache_path`, read and invalidated in place), the cache key the generated configuration
//! gives objects, the selection of objects a purge names, the walk of a cache folder that
//! applies purges (and the kernel's word on which folders changed since), and the purge request the operator sends a pod's sidecar.
//!
//! Why in place: open-source nginx has no purge. A stock nginx re-reads the header of a cache file
//! at every hit (`ngx_http_file_cache_read`), so a header changed on disk takes effect at the next
//! request, even for a file nginx holds open (`open_file_cache`): a file whose version nginx does
//! not know is a miss (hard purge), one whose validity has passed is stale (soft purge). The
//! sidecar that does it shares the pod's cache volume (docs/adr/0008-purges-in-place.md).

pub mod file;
pub mod key;
pub mod scan;
pub mod selector;
pub mod watches;
pub mod wire;
