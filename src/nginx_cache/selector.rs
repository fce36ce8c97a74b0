//! Which cached objects a purge names. The operator compiles a CdnPurge's selection with
//! [`Selection::new`] to refuse what it could not apply; the sidecar compiles a batch's purges
//! into one [`Matcher`], indexed, so a walk of the cache costs a few lookups per file however
//! many purges the batch holds.

use super::key::Key;
use super::wire::Purge;
use regex::RegexSet;
use std::borrow::Cow;
use std::collections::HashMap;

/// Why a purge cannot be applied.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SelectionError {
    #[error("it names nothing to purge: give paths, prefixes, regexes or surrogateKeys, or all: true to purge every object")]
    Empty,
    #[error("all: true purges every object and takes no other selection")]
    AllWithOthers,
    #[error("{what} {value:?} does not start with /")]
    NotAPath { what: &'static str, value: String },
    #[error("the prefix {0:?} would purge every object: say so with all: true")]
    EveryPrefix(String),
    #[error("the regular expression {value:?} is invalid: {error}")]
    InvalidRegex { value: String, error: String },
    #[error("the regular expression {0:?} matches the path / and would purge every object: say so with all: true")]
    EveryRegex(String),
    #[error("the surrogate key {0:?} is empty or holds a space or a comma, which separate keys")]
    InvalidTag(String),
}

/// One purge's selection, checked.
#[derive(Clone, Debug)]
pub struct Selection {
    host: Option<String>,
    paths: Vec<String>,
    prefixes: Vec<String>,
    regexes: Vec<String>,
    tags: Vec<String>,
    all: bool,
}

/// The decoded form of a path or prefix, as nginx's `$uri` (which the key holds) has it.
fn decoded(path: &str) -> String {
    percent_encoding::percent_decode_str(path)
        .decode_utf8_lossy()
        .into_owned()
}

impl Selection {
    /// Checks what `purge` names.
    pub fn new(purge: &Purge) -> Result<Selection, SelectionError> {
        let named = !purge.paths.is_empty()
            || !purge.prefixes.is_empty()
            || !purge.regexes.is_empty()
            || !purge.surrogate_keys.is_empty();
        if purge.all && named {
            return Err(SelectionError::AllWithOthers);
        }
        if !purge.all && !named {
            return Err(SelectionError::Empty);
        }
        for (what, values) in [("the path", &purge.paths), ("the prefix", &purge.prefixes)] {
            if let Some(value) = values.iter().find(|v| !v.starts_with('/')) {
                return Err(SelectionError::NotAPath {
                    what,
                    value: value.clone(),
                });
            }
        }
        if let Some(every) = purge.prefixes.iter().find(|p| decoded(p) == "/") {
            return Err(SelectionError::EveryPrefix(every.clone()));
        }
        for value in &purge.regexes {
            let regex = regex::Regex::new(value).map_err(|error| SelectionError::InvalidRegex {
                value: value.clone(),
                error: error
                    .to_string()
                    .lines()
                    .last()
                    .unwrap_or("")
                    .trim()
                    .to_string(),
            })?;
            if regex.is_match("/") {
                return Err(SelectionError::EveryRegex(value.clone()));
            }
        }
        if let Some(tag) = purge
            .surrogate_keys
            .iter()
            .find(|t| t.is_empty() || t.contains(|c: char| c.is_whitespace() || c == ','))
        {
            return Err(SelectionError::InvalidTag(tag.clone()));
        }
        Ok(Selection {
            host: purge.host.clone(),
            paths: purge.paths.iter().map(|p| decoded(p)).collect(),
            prefixes: purge.prefixes.iter().map(|p| decoded(p)).collect(),
            regexes: purge.regexes.clone(),
            tags: purge.surrogate_keys.clone(),
            all: purge.all,
        })
    }
}

/// The purges of a batch, indexed by what they select.
#[derive(Debug, Default)]
pub struct Matcher {
    /// Each purge's host, when it has one.
    hosts: Vec<Option<String>>,
    paths: HashMap<String, Vec<usize>>,
    tags: HashMap<String, Vec<usize>>,
    prefixes: Vec<(String, usize)>,
    regexes: Option<(RegexSet, Vec<usize>)>,
    all: Vec<usize>,
}

impl Matcher {
    /// Indexes `selections`; a purge is known by its place among them.
    pub fn new(selections: &[Selection]) -> Matcher {
        let mut m = Matcher::default();
        let mut regexes = Vec::new();
        let mut regex_owners = Vec::new();
        for (i, s) in selections.iter().enumerate() {
            m.hosts.push(s.host.clone());
            for path in &s.paths {
                m.paths.entry(path.clone()).or_default().push(i);
            }
            for tag in &s.tags {
                m.tags.entry(tag.clone()).or_default().push(i);
            }
            m.prefixes.extend(s.prefixes.iter().map(|p| (p.clone(), i)));
            for regex in &s.regexes {
                regexes.push(regex.clone());
                regex_owners.push(i);
            }
            if s.all {
                m.all.push(i);
            }
        }
        if !regexes.is_empty() {
            // Each compiled alone by Selection::new: together they compile too.
            let set = RegexSet::new(&regexes).expect("regexes checked one by one");
            m.regexes = Some((set, regex_owners));
        }
        m
    }

    /// The purges (their places) that name the object of `key` tagged `tags`, each once, in
    /// order.
    pub fn matches(&self, key: &Key<'_>, tags: &[String]) -> Vec<usize> {
        let mut found: Vec<usize> = Vec::new();
        found.extend(&self.all);
        if let Some(owners) = self.paths.get(key.path) {
            found.extend(owners);
        }
        for tag in tags {
            if let Some(owners) = self.tags.get(tag.as_str()) {
                found.extend(owners);
            }
        }
        found.extend(
            self.prefixes
                .iter()
                .filter(|(prefix, _)| key.path_and_query.starts_with(prefix.as_str()))
                .map(|(_, owner)| owner),
        );
        if let Some((set, owners)) = &self.regexes {
            found.extend(set.matches(key.path_and_query).iter().map(|i| owners[i]));
        }
        found.retain(|&i| {
            self.hosts[i]
                .as_deref()
                .is_none_or(|host| host.eq_ignore_ascii_case(key.host))
        });
        found.sort_unstable();
        found.dedup();
        found
    }
}

/// `purge`'s selection in one line, for Events and logs: `paths /a.ts, /b.ts (+3)`.
pub fn describe(purge: &Purge) -> String {
    fn list(what: &str, values: &[String]) -> Option<String> {
        let shown: Vec<Cow<str>> = values
            .iter()
            .take(2)
            .map(|v| Cow::from(v.as_str()))
            .collect();
        (!values.is_empty()).then(|| {
            let more = values.len().saturating_sub(2);
            let more = if more > 0 {
                format!(" (+{more})")
            } else {
                String::new()
            };
            format!("{what} {}{more}", shown.join(", "))
        })
    }
    let mut parts: Vec<String> = [
        list("paths", &purge.paths),
        list("prefixes", &purge.prefixes),
        list("regexes", &purge.regexes),
        list("surrogate keys", &purge.surrogate_keys),
    ]
    .into_iter()
    .flatten()
    .collect();
    if purge.all {
        parts.push("every object".into());
    }
    let mut text = parts.join("; ");
    if let Some(host) = &purge.host {
        text.push_str(&format!(" of host {host}"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nginx_cache::key;

    fn purge(f: impl FnOnce(&mut Purge)) -> Purge {
        let mut p = Purge::default();
        f(&mut p);
        p
    }

    fn matcher(purges: &[Purge]) -> Matcher {
        let selections: Vec<Selection> =
            purges.iter().map(|p| Selection::new(p).unwrap()).collect();
        Matcher::new(&selections)
    }

    fn hits(m: &Matcher, key_text: &str, tags: &[&str]) -> Vec<usize> {
        let tags: Vec<String> = tags.iter().map(|t| t.to_string()).collect();
        m.matches(&key::parse(key_text).unwrap(), &tags)
    }

    #[test]
    fn each_kind_of_selection_names_its_objects_and_no_other() {
        let m = matcher(&[
            purge(|p| p.paths = vec!["/live/a%20b.m3u8".into()]),
            purge(|p| p.prefixes = vec!["/vod/t1/".into()]),
            purge(|p| p.regexes = vec![r"\.ts\?v=2$".into()]),
            purge(|p| p.surrogate_keys = vec!["title-9".into()]),
            purge(|p| {
                p.host = Some("a.example".into());
                p.all = true;
            }),
        ]);
        // An exact path, with every query, every slice and method; its neighbours are left.
        assert_eq!(hits(&m, "GETb.example/live/a b.m3u8bytes=0-1", &[]), [0]);
        assert_eq!(
            hits(&m, "HEADb.example/live/a b.m3u8?x=1bytes=0-1", &[]),
            [0]
        );
        assert!(hits(&m, "GETb.example/live/a b.m3u8x", &[]).is_empty());
        assert_eq!(hits(&m, "GETb.example/vod/t1/seg.ts", &[]), [1]);
        assert!(hits(&m, "GETb.example/vod/t10/seg.ts", &[]).is_empty());
        assert_eq!(hits(&m, "GETb.example/x/seg.ts?v=2bytes=0-9", &[]), [2]);
        assert!(hits(&m, "GETb.example/x/seg.ts?v=1", &[]).is_empty());
        assert_eq!(hits(&m, "GETb.example/x/y", &["other", "title-9"]), [3]);
        // all: true of one host: every object of it, none of the others.
        assert_eq!(
            hits(&m, "GETa.example/vod/t1/seg.ts", &["title-9"]),
            [1, 3, 4]
        );
        assert!(hits(&m, "GETc.example/z", &[]).is_empty());
    }

    #[test]
    fn what_would_purge_everything_unasked_or_cannot_be_applied_is_refused() {
        let refused = |f: fn(&mut Purge)| Selection::new(&purge(f)).unwrap_err().to_string();
        assert!(refused(|_| {}).contains("names nothing to purge"));
        assert!(refused(|p| {
            p.all = true;
            p.paths = vec!["/a".into()];
        })
        .contains("takes no other selection"));
        assert!(refused(|p| p.prefixes = vec!["/".into()]).contains("would purge every object"));
        assert!(refused(|p| p.prefixes = vec!["%2F".into()]).contains("does not start with /"));
        assert!(refused(|p| p.regexes = vec![".*".into()]).contains("matches the path /"));
        assert!(refused(|p| p.regexes = vec!["^/".into()]).contains("matches the path /"));
        assert_eq!(
            refused(|p| p.regexes = vec!["/vod/(a".into()]),
            "the regular expression \"/vod/(a\" is invalid: error: unclosed group"
        );
        assert!(refused(|p| p.surrogate_keys = vec!["a b".into()]).contains("space or a comma"));
        assert!(refused(|p| p.paths = vec!["vod/a.ts".into()]).contains("does not start with /"));
    }

    #[test]
    fn a_purge_is_described_in_one_line() {
        let p = purge(|p| {
            p.paths = vec!["/a".into(), "/b".into(), "/c".into(), "/d".into()];
            p.surrogate_keys = vec!["t".into()];
            p.host = Some("h".into());
        });
        assert_eq!(
            describe(&p),
            "paths /a, /b (+2); surrogate keys t of host h"
        );
    }
}
