//! A walk of a cache folder that applies purges: every cache file is read up to its response
//! header, and the purges that name it invalidate it in place ([`file::invalidate`]).
//!
//! A purge invalidates only what was fetched before it (`date` ≤ its cutoff, the second it
//! began on this pod): what is fetched again while it runs stays. Fills in flight when the walk
//! begins are the race to close: nginx writes a fill to a temporary file beside its cache file
//! (`<md5>.<10 digits>`, `use_temp_path=off`) and renames it when done, and it may hold a body
//! fetched before the purge. So the walk notes those temporary files, waits until they are gone,
//! and checks the cache files they became; it then walks again the folders whose content changed
//! meanwhile (a rename is an event of the folder's watch, or moves its mtime), for fills written
//! at once from memory. There
//! it leaves the files it invalidated itself: nginx replaced them after the walk made them misses,
//! with what it fetched after the purge began (dated by the second, they could not be told from
//! a fill that began before it within the same second).
//!
//! A walk remembers what it read for the next one ([`Memory`]): a folder that has not changed
//! since (no event of its inotify watch, or failing a watch the same mtime) holds the same files,
//! and of its files only those a purge names (by their remembered key, tags and date) are opened.
//! Under a burst of purges a walk of an unchanged cache reads no folder and no file.

use super::file::{self, CachedObject, Invalidation};
use super::key;
use super::selector::Matcher;
use super::watches::{Changed, Watches};
use super::wire::Mode;
use std::collections::{BTreeMap, BTreeSet, HashMap};
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
    /// Cache files known from an earlier walk, in folders unchanged since, that no purge names:
    /// not read.
    pub recalled: u64,
    /// Files that could not be read or written (other than those nginx removed meanwhile).
    pub errors: u64,
    /// The first such error, for the report.
    pub first_error: Option<String>,
}

/// What the walks of one cache remember of its folders, for the next walk.
///
/// nginx writes every fill to a temporary file it renames, and evicts by removing: a folder's
/// files change only by a file created, renamed or removed, which the folder's inotify watch
/// tells (taken before the folder is read), and which moves its mtime. So a folder with no event
/// since it was read (or, unwatched, with the mtime read then) holds the files that walk read,
/// each holding the same object. What nginx rewrites in place (a header revalidated, or
/// invalidated by a purge) only moves its dates forward, so a remembered date is never later than
/// the file's: the memory names a superset of what a purge names, and a named file is read before
/// anything is written. An unwatched folder is remembered only when its mtime was [`SETTLED`] old
/// when read (the kernel stamps with a coarse clock: a change in the same tick as the read could
/// leave the same mtime). A folder is remembered only when it held no fill in flight and only
/// files that parsed; at most [`MEMORY_BYTES`] are kept (the sidecar's memory is bounded), beyond
/// which folders are read each walk.
#[derive(Default)]
pub struct Memory {
    folders: HashMap<PathBuf, Folder>,
    bytes: usize,
    watches: Option<Watches>,
}

impl Memory {
    /// A memory that watches the folders it reads (inotify) where the kernel allows it, and
    /// judges the others by their mtime.
    pub fn watching() -> Memory {
        Memory {
            watches: Watches::new(),
            ..Memory::default()
        }
    }

    /// What the watches say changed since the last look (`None`: no watches), forgotten.
    fn take_changes(&mut self) -> Option<Changed> {
        let changed = self.watches.as_mut()?.changed();
        match &changed {
            Changed::Folders(folders) => {
                for dir in folders {
                    self.forget(dir);
                }
            }
            Changed::Unknown => {
                self.folders.clear();
                self.bytes = 0;
            }
        }
        Some(changed)
    }

    fn forget(&mut self, dir: &Path) {
        if let Some(folder) = self.folders.remove(dir) {
            self.bytes -= folder.bytes() + dir.as_os_str().len();
        }
    }
}

/// What [`Memory`] may hold: about 100,000 cache files of 60-byte keys.
pub const MEMORY_BYTES: usize = 16 << 20;
/// How old a folder's mtime must be, when read, to be remembered.
const SETTLED: Duration = Duration::from_secs(1);

/// How a walk tells that a folder changed since it was read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Seen {
    /// An event of its watch.
    Watched,
    /// Another mtime than the one read before.
    Mtime(Option<SystemTime>),
}

/// A folder as a walk read it.
struct Folder {
    seen: Seen,
    subfolders: Vec<PathBuf>,
    files: Vec<(Box<str>, Known)>,
}

impl Folder {
    /// Roughly what it costs in memory.
    fn bytes(&self) -> usize {
        let files: usize = self
            .files
            .iter()
            .map(|(name, known)| name.len() + known.bytes())
            .sum();
        64 + self
            .subfolders
            .iter()
            .map(|p| p.as_os_str().len() + 24)
            .sum::<usize>()
            + files
    }
}

/// What a purge is matched on, of a cache file as read.
struct Known {
    key: Box<str>,
    tags: Vec<String>,
    date: i64,
}

impl Known {
    fn bytes(&self) -> usize {
        64 + self.key.len() + self.tags.iter().map(|t| t.len() + 24).sum::<usize>()
    }
}

/// The purges of `targets` that name an object of `key`, `tags`, fetched at `date` (by their
/// place in `matcher`).
fn named(
    matcher: &Matcher,
    targets: &[Target],
    key: &str,
    tags: &[String],
    date: i64,
) -> Vec<usize> {
    let Some(key) = key::parse(key) else {
        return Vec::new();
    };
    matcher
        .matches(&key, tags)
        .into_iter()
        .filter(|&i| date <= targets[i].cutoff)
        .collect()
}

/// How long after its start a walk takes its last look at the folders: a fill whose response a
/// worker received before the purge, and wrote a moment later (a busy node), lands before it.
/// A walk that remembers is fast enough to end before such a fill lands; one of the whole cache
/// took longer than this anyway.
const FILL_SETTLE: Duration = Duration::from_millis(150);
/// How often the walk looks whether the fills it waits for are done.
const FILL_POLL: Duration = Duration::from_millis(20);
/// Folders deeper than nginx's deepest `levels` (three) are not nginx's.
const MAX_DEPTH: usize = 3;

/// Applies `targets` (by their place in `matcher`) to every cache file under `dir`, waiting at
/// most `fill_wait` for the fills in flight at the start; `memory` holds what the walk before
/// read, and is left with what this one knows.
pub fn apply(
    dir: &Path,
    matcher: &Matcher,
    targets: &[Target],
    fill_wait: Duration,
    memory: &mut Memory,
) -> Outcome {
    let started = Instant::now();
    memory.take_changes();
    let mut walk = Walk::new(matcher, targets, memory);
    walk.folder(dir, 0);
    walk.await_fills(fill_wait);
    std::thread::sleep(FILL_SETTLE.saturating_sub(started.elapsed()));
    walk.walk_changed_folders();
    *memory = walk.known;
    walk.outcome
}

/// Applies `targets` to the folders that changed since the last walk or sweep, as the watches
/// tell (and to the folders below them it did not know): what nginx wrote after a walk ended.
/// A fill whose response came before a purge began can land after the purge's walk (its worker
/// was busy, or the body was slow): swept a moment later, it is invalidated too. Without
/// watches there is nothing to tell: nothing is swept.
pub fn sweep(dir: &Path, matcher: &Matcher, targets: &[Target], memory: &mut Memory) -> Outcome {
    let changed = match memory.take_changes() {
        None => return Outcome::default(),
        Some(Changed::Unknown) => return apply(dir, matcher, targets, Duration::ZERO, memory),
        Some(Changed::Folders(changed)) => changed,
    };
    let mut changed: Vec<PathBuf> = changed.into_iter().collect();
    changed.sort();
    let mut walk = Walk::new(matcher, targets, memory);
    for folder in &changed {
        // Read already, as a subfolder of one read before it.
        if walk.known.folders.contains_key(folder) {
            continue;
        }
        let Ok(below) = folder.strip_prefix(dir) else {
            continue;
        };
        let depth = below.components().count();
        if depth <= MAX_DEPTH && folder.is_dir() {
            walk.folder(folder, depth);
        }
    }
    // A fill seen in flight lands with an event of its own: swept then.
    let Walk { before, known, .. } = walk;
    *memory = known;
    for (folder, known) in before {
        memory.bytes += known.bytes() + folder.as_os_str().len();
        memory.folders.insert(folder, known);
    }
    walk.outcome
}

struct Walk<'a> {
    matcher: &'a Matcher,
    targets: &'a [Target],
    /// What the walk before remembered, and what this one does.
    before: HashMap<PathBuf, Folder>,
    known: Memory,
    outcome: Outcome,
    buffer: Vec<u8>,
    /// Every folder of cache files read, and how to tell it changed since.
    folders: BTreeMap<PathBuf, Seen>,
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

impl<'a> Walk<'a> {
    /// A walk applying `targets` (by their place in `matcher`), starting from what `memory`
    /// holds, which it takes.
    fn new(matcher: &'a Matcher, targets: &'a [Target], memory: &mut Memory) -> Walk<'a> {
        Walk {
            matcher,
            targets,
            before: std::mem::take(&mut memory.folders),
            known: Memory {
                watches: memory.watches.take(),
                ..Memory::default()
            },
            outcome: Outcome {
                invalidated: vec![0; targets.len()],
                ..Outcome::default()
            },
            buffer: Vec::with_capacity(4096),
            folders: BTreeMap::new(),
            fills: BTreeSet::new(),
            invalidated: BTreeSet::new(),
        }
    }

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
        if let Some(known) = self.before.remove(dir) {
            // A watched folder with an event was forgotten at the walk's start.
            if known.seen == Seen::Watched || known.seen == Seen::Mtime(mtime(dir)) {
                return self.recall(dir, known, depth);
            }
        }
        let read_at = SystemTime::now();
        // Watched before it is read: a change from now on is an event.
        let seen = match self.known.watches.as_mut().is_some_and(|w| w.watch(dir)) {
            true => Seen::Watched,
            false => Seen::Mtime(mtime(dir)),
        };
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(error) => return self.error(dir, &error),
        };
        let mut subfolders = Vec::new();
        let mut files = Vec::new();
        for entry in entries.flatten() {
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            let path = entry.path();
            if kind.is_dir() && depth < MAX_DEPTH {
                self.folder(&path, depth + 1);
                subfolders.push(path);
            } else if kind.is_file() {
                files.push(path);
            }
        }
        if !files.is_empty() {
            self.folders.insert(dir.to_path_buf(), seen);
        }
        let trusted = match seen {
            Seen::Watched => true,
            Seen::Mtime(before) => before.is_some_and(|m| m + SETTLED <= read_at),
        };
        let mut remembered = trusted.then(|| Vec::with_capacity(files.len()));
        for path in files {
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if let Some(md5) = filled(name) {
                let target = path.with_file_name(md5);
                self.fills.insert((path, target));
                remembered = None;
                continue;
            }
            let name: Box<str> = name.into();
            match (self.file(&path), remembered.as_mut()) {
                (Some(known), Some(files)) => files.push((name, known)),
                (None, _) => remembered = None,
                (Some(_), None) => {}
            }
        }
        if let Some(files) = remembered {
            self.remember(
                dir,
                Folder {
                    seen,
                    subfolders,
                    files,
                },
            );
        }
    }

    /// Walks a folder unchanged since the walk before read it: its subfolders, and of its files
    /// only those a purge names.
    fn recall(&mut self, dir: &Path, known: Folder, depth: usize) {
        for subfolder in &known.subfolders {
            self.folder(subfolder, depth + 1);
        }
        if !known.files.is_empty() {
            self.folders.insert(dir.to_path_buf(), known.seen);
        }
        for (name, file) in &known.files {
            if named(self.matcher, self.targets, &file.key, &file.tags, file.date).is_empty() {
                self.outcome.recalled += 1;
            } else {
                self.file(&dir.join(&**name));
            }
        }
        self.remember(dir, known);
    }

    fn remember(&mut self, dir: &Path, folder: Folder) {
        let bytes = folder.bytes() + dir.as_os_str().len();
        if self.known.bytes + bytes <= MEMORY_BYTES {
            self.known.bytes += bytes;
            self.known.folders.insert(dir.to_path_buf(), folder);
        }
    }

    /// Reads the cache file at `path` and applies the purges that name it; what it holds, when
    /// it is a cache file of this nginx.
    fn file(&mut self, path: &Path) -> Option<Known> {
        let file = match OpenOptions::new().read(true).write(true).open(path) {
            Ok(file) => file,
            Err(error) => {
                self.error(path, &error);
                return None;
            }
        };
        if let Err(error) = file::read_head(&file, &mut self.buffer) {
            self.error(path, &error);
            return None;
        }
        self.outcome.scanned += 1;
        // Not a cache file of this nginx (or being written): nothing to purge in it.
        let object = file::parse(&self.buffer).ok()?;
        if object.is_live() {
            match self.purge(&file, &object) {
                Ok(true) => {
                    self.invalidated.insert(path.to_path_buf());
                }
                Ok(false) => {}
                Err(error) => self.error(path, &error),
            }
        }
        Some(Known {
            key: object.key.into_boxed_str(),
            tags: object.tags,
            date: object.date,
        })
    }

    /// Applies the purges that name `object`; whether it was invalidated.
    fn purge(&mut self, file: &File, object: &CachedObject) -> io::Result<bool> {
        let named = named(
            self.matcher,
            self.targets,
            &object.key,
            &object.tags,
            object.date,
        );
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
        // Changed while walked: forgotten, read again by the next walk too (also the folders of
        // no file, whose events are taken here).
        let events = self.known.take_changes();
        let changed: Vec<PathBuf> = self
            .folders
            .iter()
            .filter(|(dir, seen)| match seen {
                Seen::Watched => match &events {
                    Some(Changed::Folders(changed)) => changed.contains(*dir),
                    _ => true,
                },
                Seen::Mtime(before) => mtime(dir) != *before,
            })
            .map(|(dir, _)| dir.clone())
            .collect();
        for dir in &changed {
            self.known.forget(dir);
        }
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
        run_with(dir, purges, &mut Memory::watching())
    }

    fn run_with(dir: &Path, purges: &[(Purge, Target)], memory: &mut Memory) -> Outcome {
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
            memory,
        )
    }

    /// Sets the mtime of the folder `dir` `ago` in the past, as a folder nginx last wrote then.
    fn age(dir: &Path, ago: Duration) {
        File::open(dir)
            .unwrap()
            .set_modified(SystemTime::now() - ago)
            .unwrap();
    }

    #[test]
    fn a_fill_written_a_moment_after_a_fast_walk_began_is_checked_before_it_ends() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let md5 = "0000000000000000000000000000000a";
        put(d, &format!("a/0a/{md5}"), "GETh/vod/other.ts", T - 10, "t");
        // A worker that received the response before the purge writes it 20 ms into the walk,
        // which reads one file in microseconds.
        let landing = {
            let folder = d.join("a/0a");
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                let temporary = folder.join("0000000000000000000000000000000b.0000000001");
                let header = "HTTP/1.1 200 OK\r\n\r\n";
                std::fs::write(
                    &temporary,
                    cache_file("GETh/vod/late.ts", T - 1, T + 60, header),
                )
                .unwrap();
                std::fs::rename(&temporary, folder.join("0000000000000000000000000000000b"))
                    .unwrap();
            })
        };
        let outcome = run(
            d,
            &[(
                Purge {
                    paths: vec!["/vod/late.ts".into()],
                    ..Purge::default()
                },
                Target {
                    mode: Mode::Hard,
                    cutoff: T,
                },
            )],
        );
        landing.join().unwrap();
        assert_eq!(outcome.invalidated, [1], "{outcome:?}");
    }

    #[test]
    fn a_sweep_invalidates_the_fills_landed_after_the_walk_that_came_before_the_purge() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let a = put(
            d,
            "a/0a/0000000000000000000000000000000a",
            "GETh/vod/a.ts",
            T - 10,
            "t",
        );
        put(
            d,
            "b/0b/0000000000000000000000000000000b",
            "GETh/vod/b.ts",
            T - 10,
            "t",
        );
        let purge = Purge {
            prefixes: vec!["/vod/".into()],
            ..Purge::default()
        };
        let target = Target {
            mode: Mode::Hard,
            cutoff: T,
        };
        let matcher = Matcher::new(&[Selection::new(&purge).unwrap()]);
        let mut memory = Memory::watching();
        let walked = apply(d, &matcher, &[target], Duration::ZERO, &mut memory);
        assert_eq!(walked.invalidated, [2]);
        // Nothing landed since: nothing to read.
        let idle = sweep(d, &matcher, &[target], &mut memory);
        assert_eq!((idle.invalidated.as_slice(), idle.scanned), (&[0][..], 0));
        // After the walk, nginx writes a fill of a.ts whose response came before the purge, one
        // of c.ts in a folder it makes, and one of b.ts fetched after the purge.
        let land = |rel: &str, key: &str, date: i64| {
            let path = d.join(rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            let temporary = path.with_extension("0000000001");
            let header = "HTTP/1.1 200 OK\r\n\r\n";
            std::fs::write(&temporary, cache_file(key, date, T + 3600, header)).unwrap();
            std::fs::rename(&temporary, &path).unwrap();
            path
        };
        land(
            "a/0a/0000000000000000000000000000000a",
            "GETh/vod/a.ts",
            T - 1,
        );
        let c = land("c/0c/0000000000000000000000000000000c", "GETh/vod/c.ts", T);
        let b = land(
            "b/0b/0000000000000000000000000000000b",
            "GETh/vod/b.ts",
            T + 5,
        );
        let swept = sweep(d, &matcher, &[target], &mut memory);
        assert_eq!(swept.invalidated, [2], "{swept:?}");
        assert!(!object(&a).is_live() && !object(&c).is_live());
        assert!(object(&b).is_live(), "fetched after the purge: kept");
        // Without watches nothing tells what changed: a sweep reads nothing.
        let unwatched = sweep(d, &matcher, &[target], &mut Memory::default());
        assert_eq!(unwatched.scanned, 0);
    }

    #[test]
    fn a_watched_folder_is_known_unchanged_without_looking_and_changed_whatever_its_mtime() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let file = |i: usize| format!("{i}/0{i}/{i:032x}");
        for i in 1..=3 {
            put(d, &file(i), &format!("GETh/vod/{i}.ts"), T - 10, "old");
        }
        let by_key = |tag: &str| {
            (
                Purge {
                    surrogate_keys: vec![tag.into()],
                    ..Purge::default()
                },
                Target {
                    mode: Mode::Hard,
                    cutoff: T,
                },
            )
        };
        let mut memory = Memory::watching();
        assert!(memory.watches.is_some(), "this kernel gives inotify");
        let first = run_with(d, &[by_key("none")], &mut memory);
        assert_eq!((first.scanned, first.recalled), (3, 0));
        // Just written, yet known unchanged: the watches say so (an mtime that fresh is not
        // trusted, see the test below).
        let second = run_with(d, &[by_key("none")], &mut memory);
        assert_eq!((second.scanned, second.recalled), (0, 3), "{second:?}");
        // 2 replaced by a fill with another key, its folder's mtime put back as it was: only
        // the watch tells, and the purge of the new key finds it.
        let folder = d.join("2/02");
        let was = mtime(&folder).unwrap();
        let replacement = folder.join("replacement");
        let header = "HTTP/1.1 200 OK\r\nSurrogate-Key: new\r\n\r\n";
        std::fs::write(
            &replacement,
            cache_file("GETh/vod/2.ts", T - 5, T + 3600, header),
        )
        .unwrap();
        std::fs::rename(&replacement, d.join(file(2))).unwrap();
        File::open(&folder).unwrap().set_modified(was).unwrap();
        assert_eq!(mtime(&folder), Some(was));
        let replaced = run_with(d, &[by_key("new")], &mut memory);
        assert_eq!(replaced.invalidated, [1], "{replaced:?}");
        assert_eq!((replaced.scanned, replaced.recalled), (1, 2));
        assert!(!object(&d.join(file(2))).is_live());
    }

    #[test]
    fn unwatched_a_walk_reads_only_the_folders_whose_mtime_moved_and_the_files_a_purge_names() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let file = |i: usize| format!("{i}/0{i}/{i:032x}");
        for i in 1..=4 {
            put(d, &file(i), &format!("GETh/vod/{i}.ts"), T - 10, "old");
        }
        std::fs::write(d.join("1/01/not-nginx"), b"x").unwrap();
        for i in 1..=4 {
            age(&d.join(format!("{i}/0{i}")), Duration::from_secs(10));
        }
        let hard = |purge: Purge| {
            (
                purge,
                Target {
                    mode: Mode::Hard,
                    cutoff: T,
                },
            )
        };
        let path = |p: &str| {
            hard(Purge {
                paths: vec![p.into()],
                ..Purge::default()
            })
        };
        let mut memory = Memory::default();
        let first = run_with(d, &[path("/none")], &mut memory);
        assert_eq!((first.scanned, first.recalled), (5, 0));
        // Nothing changed, nothing named: folders 2 to 4 known, their files not read; folder 1
        // holds a file that is not nginx's, so it is read each time.
        let second = run_with(d, &[path("/none")], &mut memory);
        assert_eq!((second.scanned, second.recalled), (2, 3), "{second:?}");
        // A file a purge names is read, then invalidated.
        let named = run_with(d, &[path("/vod/2.ts")], &mut memory);
        assert_eq!((named.scanned, named.recalled), (3, 2), "{named:?}");
        assert_eq!(named.invalidated, [1]);
        assert!(!object(&d.join(file(2))).is_live());
        // 3 is replaced by a fill with another surrogate key (a new file renamed over it): its
        // folder moved, so it is read, and a purge of the new key finds it, which the memory
        // of the old file would not have named.
        let replacement = d.join("3/03/replacement");
        let header = "HTTP/1.1 200 OK\r\nSurrogate-Key: new\r\n\r\n";
        std::fs::write(
            &replacement,
            cache_file("GETh/vod/3.ts", T - 5, T + 3600, header),
        )
        .unwrap();
        std::fs::rename(&replacement, d.join(file(3))).unwrap();
        let by_key = hard(Purge {
            surrogate_keys: vec!["new".into()],
            ..Purge::default()
        });
        let replaced = run_with(d, &[by_key], &mut memory);
        assert_eq!(replaced.invalidated, [1], "{replaced:?}");
        assert_eq!((replaced.scanned, replaced.recalled), (3, 2));
        // Its folder changed a moment ago: not remembered (a change in the same clock tick
        // would not move its mtime), read again.
        let again = run_with(d, &[path("/none")], &mut memory);
        assert_eq!((again.scanned, again.recalled), (3, 2), "{again:?}");
        // 4 is revalidated in place after the cutoff (nginx rewrites its dates): the memory
        // names it by its old date, the file read says it was fetched after: kept.
        let revalidated = d.join(file(4));
        let mut bytes = std::fs::read(&revalidated).unwrap();
        bytes[40..48].copy_from_slice(&(T + 5).to_le_bytes());
        std::fs::write(&revalidated, &bytes).unwrap();
        let kept = run_with(d, &[path("/vod/4.ts")], &mut memory);
        assert_eq!(kept.invalidated, [0], "{kept:?}");
        assert!(object(&revalidated).is_live());
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
