//! A walk of a cache folder that applies purges: every cache file is read up to its response
//! header, and the purges that name it invalidate it in place ([`file::invalidate`]).
//!
//! A purge invalidates only what was fetched before it (`date` ≤ its cutoff, the second it
//! began on this pod): what is fetched again while it runs stays. Fills in flight when the walk
//! begins are the race to close: nginx writes a fill to a temporary file beside its cache file
//! (`<md5>.<10 digits>`, `use_temp_path=off`) and renames it when done, and it may hold a body
//! fetched before the purge. So the walk notes those temporary files, waits until they are gone,
//! and checks the cache files they became; it then walks again the folders whose content changed
//! meanwhile (a rename changes its folder's mtime), for fills written at once from memory. There
//! it leaves the files it invalidated itself: nginx replaced them after the walk made them misses,
//! with what it fetched after the purge began (dated by the second, they could not be told from
//! a fill that began before it within the same second).

use super::file::{self, CachedObject, Invalidation};
use super::key;
use super::selector::Matcher;
use super::wire::Mode;
use std::collections::{BTreeMap, BTreeSet};
use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

/// One purge of a walk: how it invalidates, and its cutoff (epoch seconds): it names only
/// objects fetched at or before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target {
    pub mode: Mode,
    pub cutoff: i64,
}

/// What a walk did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Objects invalidated, by purge.
    pub invalidated: Vec<u64>,
    /// Cache files read (a file read twice counts twice).
    pub scanned: u64,
    /// Fills in flight at the start, waited for and checked.
    pub fills_awaited: u64,
    /// Fills still in flight when the wait gave up: not checked.
    pub fills_unchecked: u64,
    /// Files that could not be read or written (other than those nginx removed meanwhile).
    pub errors: u64,
    /// The first such error, for the report.
    pub first_error: Option<String>,
}

/// How often the walk looks whether the fills it waits for are done.
const FILL_POLL: Duration = Duration::from_millis(20);
/// Folders deeper than nginx's deepest `levels` (three) are not nginx's.
const MAX_DEPTH: usize = 3;

/// Applies `targets` (by their place in `matcher`) to every cache file under `dir`, waiting at
/// most `fill_wait` for the fills in flight at the start.
pub fn apply(dir: &Path, matcher: &Matcher, targets: &[Target], fill_wait: Duration) -> Outcome {
    let mut walk = Walk {
        matcher,
        targets,
        outcome: Outcome {
            invalidated: vec![0; targets.len()],
            ..Outcome::default()
        },
        buffer: Vec::with_capacity(4096),
        folders: BTreeMap::new(),
        fills: BTreeSet::new(),
        invalidated: BTreeSet::new(),
    };
    walk.folder(dir, 0);
    walk.await_fills(fill_wait);
    walk.walk_changed_folders();
    walk.outcome
}

struct Walk<'a> {
    matcher: &'a Matcher,
    targets: &'a [Target],
    outcome: Outcome,
    buffer: Vec<u8>,
    /// Every folder of cache files read, with its mtime before it was read.
    folders: BTreeMap<PathBuf, Option<SystemTime>>,
    /// Cache files being filled when the walk began: the temporary file and the cache file it
    /// becomes.
    fills: BTreeSet<(PathBuf, PathBuf)>,
    /// The cache files this walk invalidated.
    invalidated: BTreeSet<PathBuf>,
}

/// The cache file a temporary file of nginx becomes: `<32 hex>.<10 digits>` → `<32 hex>`.
fn filled(name: &str) -> Option<&str> {
    let (md5, number) = name.split_once('.')?;
    let is_md5 = md5.len() == 32 && md5.bytes().all(|b| b.is_ascii_hexdigit());
    let is_number = number.len() == 10 && number.bytes().all(|b| b.is_ascii_digit());
    (is_md5 && is_number).then_some(md5)
}

fn mtime(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

impl Walk<'_> {
    fn error(&mut self, path: &Path, error: &io::Error) {
        // nginx removes files (evictions, replaced fills) while the walk runs: not an error.
        if error.kind() == io::ErrorKind::NotFound {
            return;
        }
        self.outcome.errors += 1;
        if self.outcome.first_error.is_none() {
            self.outcome.first_error = Some(format!("{}: {error}", path.display()));
        }
    }

    fn folder(&mut self, dir: &Path, depth: usize) {
        let before = mtime(dir);
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(error) => return self.error(dir, &error),
        };
        let mut files = Vec::new();
        for entry in entries.flatten() {
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            let path = entry.path();
            if kind.is_dir() && depth < MAX_DEPTH {
                self.folder(&path, depth + 1);
            } else if kind.is_file() {
                files.push(path);
            }
        }
        if !files.is_empty() {
            self.folders.insert(dir.to_path_buf(), before);
        }
        for path in files {
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if let Some(md5) = filled(name) {
                let target = path.with_file_name(md5);
                self.fills.insert((path, target));
            } else {
                self.file(&path);
            }
        }
    }

    /// Reads the cache file at `path` and applies the purges that name it.
    fn file(&mut self, path: &Path) {
        let file = match OpenOptions::new().read(true).write(true).open(path) {
            Ok(file) => file,
            Err(error) => return self.error(path, &error),
        };
        if let Err(error) = file::read_head(&file, &mut self.buffer) {
            return self.error(path, &error);
        }
        self.outcome.scanned += 1;
        // Not a cache file of this nginx (or being written): nothing to purge in it.
        let Ok(object) = file::parse(&self.buffer) else {
            return;
        };
        if !object.is_live() {
            return;
        }
        match self.purge(&file, &object) {
            Ok(true) => {
                self.invalidated.insert(path.to_path_buf());
            }
            Ok(false) => {}
            Err(error) => self.error(path, &error),
        }
    }

    /// Applies the purges that name `object`; whether it was invalidated.
    fn purge(&mut self, file: &File, object: &CachedObject) -> io::Result<bool> {
        let Some(key) = key::parse(&object.key) else {
            return Ok(false);
        };
        let named: Vec<usize> = self
            .matcher
            .matches(&key, &object.tags)
            .into_iter()
            .filter(|&i| object.date <= self.targets[i].cutoff)
            .collect();
        let invalidation = if named.iter().any(|&i| self.targets[i].mode == Mode::Hard) {
            Invalidation::Hard
        } else if let Some(cutoff) = named.iter().map(|&i| self.targets[i].cutoff).max() {
            Invalidation::Soft { cutoff }
        } else {
            return Ok(false);
        };
        let invalidated = file::invalidate(file, object, invalidation)?;
        if invalidated {
            for i in named {
                self.outcome.invalidated[i] += 1;
            }
        }
        Ok(invalidated)
    }

    /// Waits, at most `limit`, until the fills in flight at the start are done, then checks the
    /// cache files they became.
    fn await_fills(&mut self, limit: Duration) {
        let deadline = Instant::now() + limit;
        let mut pending = std::mem::take(&mut self.fills);
        loop {
            let mut done = Vec::new();
            pending.retain(|(temporary, target)| {
                let gone = !temporary.exists();
                if gone {
                    done.push(target.clone());
                }
                !gone
            });
            for target in done {
                self.outcome.fills_awaited += 1;
                if target.exists() {
                    self.file(&target);
                }
            }
            if pending.is_empty() || Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(FILL_POLL);
        }
        self.outcome.fills_unchecked = pending.len() as u64;
    }

    /// Reads again the cache files of the folders whose content changed since they were read:
    /// fills that nginx wrote and renamed at once, from memory, while the walk ran.
    fn walk_changed_folders(&mut self) {
        let changed: Vec<PathBuf> = self
            .folders
            .iter()
            .filter(|(dir, before)| mtime(dir) != **before)
            .map(|(dir, _)| dir.clone())
            .collect();
        for dir in changed {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            let files: Vec<PathBuf> = entries
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|k| k.is_file()))
                .map(|e| e.path())
                .filter(|p| filled(p.file_name().and_then(|n| n.to_str()).unwrap_or("")).is_none())
                .filter(|p| !self.invalidated.contains(p))
                .collect();
            for path in files {
                self.file(&path);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nginx_cache::file::tests::cache_file;
    use crate::nginx_cache::selector::Selection;
    use crate::nginx_cache::wire::Purge;

    const T: i64 = 1_800_000_000;

    fn put(dir: &Path, rel: &str, key: &str, date: i64, tags: &str) -> PathBuf {
        let path = dir.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let header = format!("HTTP/1.1 200 OK\r\nSurrogate-Key: {tags}\r\n\r\n");
        std::fs::write(&path, cache_file(key, date, T + 3600, &header)).unwrap();
        path
    }

    fn object(path: &Path) -> CachedObject {
        file::parse(&std::fs::read(path).unwrap()).unwrap()
    }

    fn run(dir: &Path, purges: &[(Purge, Target)]) -> Outcome {
        let selections: Vec<Selection> = purges
            .iter()
            .map(|(p, _)| Selection::new(p).unwrap())
            .collect();
        let targets: Vec<Target> = purges.iter().map(|(_, t)| *t).collect();
        apply(
            dir,
            &Matcher::new(&selections),
            &targets,
            Duration::from_millis(500),
        )
    }

    #[test]
    fn invalidates_what_the_purges_name_and_was_fetched_before_them() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let a = put(
            d,
            "1/aa/00000000000000000000000000000aa1",
            "GETh/vod/a.ts",
            T - 10,
            "t1",
        );
        let b = put(
            d,
            "2/bb/00000000000000000000000000000bb2",
            "GETh/vod/b.ts",
            T - 10,
            "t2",
        );
        let fresh = put(
            d,
            "3/cc/00000000000000000000000000000cc3",
            "GETh/vod/c.ts",
            T + 5,
            "t1",
        );
        let other = put(
            d,
            "4/dd/00000000000000000000000000000dd4",
            "GETh/live/x.m3u8",
            T - 10,
            "t3",
        );
        let hard = Target {
            mode: Mode::Hard,
            cutoff: T,
        };
        let soft = Target {
            mode: Mode::Soft,
            cutoff: T,
        };
        let outcome = run(
            d,
            &[
                (
                    Purge {
                        surrogate_keys: vec!["t1".into()],
                        ..Purge::default()
                    },
                    hard,
                ),
                (
                    Purge {
                        paths: vec!["/vod/b.ts".into()],
                        ..Purge::default()
                    },
                    soft,
                ),
            ],
        );
        assert_eq!(outcome.invalidated, [1, 1]);
        assert_eq!(outcome.scanned, 4);
        assert_eq!((outcome.errors, outcome.fills_unchecked), (0, 0));
        assert!(!object(&a).is_live(), "hard: gone");
        let b = object(&b);
        assert!(
            b.is_live() && b.valid_sec == T - 1,
            "soft: stale from the cutoff"
        );
        assert!(
            object(&fresh).is_live(),
            "fetched after the purge began: kept"
        );
        assert_eq!(object(&other).valid_sec, T + 3600, "not named: untouched");
        // Applied again: nothing more to do.
        let again = run(
            d,
            &[(
                Purge {
                    surrogate_keys: vec!["t1".into()],
                    ..Purge::default()
                },
                hard,
            )],
        );
        assert_eq!(again.invalidated, [0]);
    }

    #[test]
    fn a_fill_in_flight_is_awaited_and_checked_when_it_lands() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let md5 = "0123456789abcdef0123456789abcdef";
        let folder = d.join("f/0e");
        std::fs::create_dir_all(&folder).unwrap();
        let temporary = folder.join(format!("{md5}.0000000042"));
        std::fs::write(&temporary, b"partial").unwrap();
        // The fill lands while the walk waits: its body was fetched before the purge.
        let landing = {
            let (temporary, target) = (temporary.clone(), folder.join(md5));
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                let header = "HTTP/1.1 200 OK\r\n\r\n";
                std::fs::write(
                    &temporary,
                    cache_file("GETh/vod/a.ts", T - 1, T + 60, header),
                )
                .unwrap();
                std::fs::rename(&temporary, &target).unwrap();
            })
        };
        let outcome = run(
            d,
            &[(
                Purge {
                    prefixes: vec!["/vod/".into()],
                    ..Purge::default()
                },
                Target {
                    mode: Mode::Hard,
                    cutoff: T,
                },
            )],
        );
        landing.join().unwrap();
        assert_eq!(outcome.fills_awaited, 1);
        assert_eq!(outcome.invalidated, [1]);
        assert!(!object(&folder.join(md5)).is_live());
    }

    #[test]
    fn a_stalled_fill_is_reported_unchecked_and_foreign_files_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir_all(d.join("a/bc")).unwrap();
        std::fs::write(
            d.join("a/bc/0123456789abcdef0123456789abcdef.0000000001"),
            b"x",
        )
        .unwrap();
        std::fs::write(d.join("a/bc/not-a-cache-file"), b"hello").unwrap();
        let outcome = run(
            d,
            &[(
                Purge {
                    all: true,
                    ..Purge::default()
                },
                Target {
                    mode: Mode::Hard,
                    cutoff: T,
                },
            )],
        );
        assert_eq!(outcome.fills_unchecked, 1);
        assert_eq!(outcome.invalidated, [0]);
        assert_eq!(outcome.errors, 0);
    }
}
