//! The kernel's word (inotify) on which cache folders changed: a file created, renamed into or
//! out of, or removed. A walk that watches a folder before reading it knows, at its next start,
//! whether the folder still holds what it read, without looking at it. Watches are a limited
//! resource (`fs.inotify.max_user_watches`, shared by every process of the node with the same
//! user: other nginx pods, an ingress controller): a sidecar takes at most an eighth of it, and a
//! folder it does not watch is judged by its mtime instead ([`super::scan::Memory`]).

use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
use std::collections::{HashMap, HashSet};
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

/// What changes a folder's list of files: a fill's temporary file created, renamed to its cache
/// file, an eviction; and the folder itself gone.
const CHANGES: WatchFlags = WatchFlags::CREATE
    .union(WatchFlags::MOVED_FROM)
    .union(WatchFlags::MOVED_TO)
    .union(WatchFlags::DELETE)
    .union(WatchFlags::DELETE_SELF)
    .union(WatchFlags::MOVE_SELF)
    .union(WatchFlags::ONLYDIR);

pub struct Watches {
    fd: OwnedFd,
    folders: HashMap<i32, PathBuf>,
    /// How many watches it may take.
    budget: usize,
    /// The budget is spent, or the kernel refused a watch for lack of room: no more are asked.
    full: bool,
}

/// Where the kernel says how many watches a user may hold.
const MAX_USER_WATCHES: &str = "/proc/sys/fs/inotify/max_user_watches";
/// The watches a sidecar takes when the kernel does not say its limit: the oldest default's
/// eighth (8,192).
const BUDGET_UNKNOWN: usize = 1024;

/// The folders that changed since the last look.
#[derive(Debug, PartialEq, Eq)]
pub enum Changed {
    Folders(HashSet<PathBuf>),
    /// The kernel's queue overflowed: any watched folder may have changed.
    Unknown,
}

impl Watches {
    /// `None` when the kernel gives no inotify instance (a limit reached, a sandbox).
    pub fn new() -> Option<Watches> {
        let budget = std::fs::read_to_string(MAX_USER_WATCHES)
            .ok()
            .and_then(|limit| limit.trim().parse::<usize>().ok())
            .map_or(BUDGET_UNKNOWN, |limit| limit / 8);
        Watches::with_budget(budget)
    }

    fn with_budget(budget: usize) -> Option<Watches> {
        let fd = inotify::init(CreateFlags::NONBLOCK | CreateFlags::CLOEXEC).ok()?;
        Some(Watches {
            fd,
            folders: HashMap::new(),
            budget,
            full: false,
        })
    }

    /// Watches `dir` (again: the kernel keeps one watch per folder); whether it is watched. Once
    /// the budget is spent, no folder is (those watched still report their changes).
    pub fn watch(&mut self, dir: &Path) -> bool {
        if self.full {
            return false;
        }
        if self.folders.len() >= self.budget {
            self.full = true;
            return false;
        }
        match inotify::add_watch(&self.fd, dir, CHANGES) {
            Ok(wd) => {
                self.folders.insert(wd, dir.to_path_buf());
                true
            }
            Err(rustix::io::Errno::NOSPC) => {
                self.full = true;
                false
            }
            Err(_) => false,
        }
    }

    /// The folders that changed since the last call.
    pub fn changed(&mut self) -> Changed {
        let mut folders = HashSet::new();
        let mut gone = Vec::new();
        let mut buffer = [MaybeUninit::<u8>::uninit(); 16 << 10];
        let mut reader = inotify::Reader::new(&self.fd, &mut buffer);
        loop {
            let event = match reader.next() {
                Ok(event) => event,
                Err(rustix::io::Errno::INTR) => continue,
                // WOULDBLOCK: read to the end. Any other error: nothing more can be read, so
                // nothing can be said of the folders.
                Err(rustix::io::Errno::WOULDBLOCK) => break,
                Err(_) => return Changed::Unknown,
            };
            let flags = event.events();
            if flags.contains(ReadFlags::QUEUE_OVERFLOW) {
                return Changed::Unknown;
            }
            if let Some(dir) = self.folders.get(&event.wd()) {
                folders.insert(dir.clone());
            }
            if flags.contains(ReadFlags::IGNORED) {
                gone.push(event.wd());
            }
        }
        for wd in gone {
            self.folders.remove(&wd);
        }
        Changed::Folders(folders)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tells_the_folders_whose_files_changed_and_only_those() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        std::fs::write(a.join("old"), b"x").unwrap();
        std::fs::write(b.join("kept"), b"x").unwrap();
        let mut watches = Watches::new().expect("inotify");
        assert!(watches.watch(&a) && watches.watch(&b));
        assert_eq!(watches.changed(), Changed::Folders(HashSet::new()));
        // Written in place (as nginx rewrites a header): not a change of the folder's files.
        std::fs::write(b.join("kept"), b"y").unwrap();
        // A fill: a temporary file renamed over a cache file.
        std::fs::write(a.join("new.0000000001"), b"y").unwrap();
        std::fs::rename(a.join("new.0000000001"), a.join("old")).unwrap();
        assert_eq!(
            watches.changed(),
            Changed::Folders(HashSet::from([a.clone()]))
        );
        assert_eq!(watches.changed(), Changed::Folders(HashSet::new()));
        std::fs::remove_file(b.join("kept")).unwrap();
        assert_eq!(watches.changed(), Changed::Folders(HashSet::from([b])));
    }

    #[test]
    fn takes_no_more_watches_than_its_budget() {
        let dir = tempfile::tempdir().unwrap();
        let folders: Vec<PathBuf> = (0..3).map(|i| dir.path().join(i.to_string())).collect();
        for folder in &folders {
            std::fs::create_dir_all(folder).unwrap();
        }
        let mut watches = Watches::with_budget(2).expect("inotify");
        assert!(watches.watch(&folders[0]) && watches.watch(&folders[1]));
        assert!(!watches.watch(&folders[2]), "over the budget");
        // What it watches still tells.
        std::fs::write(folders[1].join("new"), b"x").unwrap();
        assert_eq!(
            watches.changed(),
            Changed::Folders(HashSet::from([folders[1].clone()]))
        );
        assert!(Watches::new().is_some_and(|w| w.budget >= 1));
    }
}
