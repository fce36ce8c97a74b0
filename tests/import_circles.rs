//! The house rule of docs/internals.md ("Who may import what"): no two files of a crate import
//! each other, directly or through others. Read from the code as text: every `use` tree and every
//! `crate::…`/`super::…` path, each resolved to the file of the deepest module it names; test
//! modules left out (nothing imports them). A circle found is printed with its files.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The crates of the workspace whose modules are checked, by their source folder (a binary's
/// folder is a crate of its own, not part of the library beside it).
const CRATES: [&str; 6] = [
    "src",
    "runtime/src",
    "testkit/src",
    "e2e/src",
    "e2e/src/bin/bench",
    "e2e/src/bin/dataplane",
];

#[test]
fn no_file_imports_one_that_imports_it_back() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = Vec::new();
    for krate in CRATES {
        let files = rust_files(&root.join(krate));
        let sources: Vec<(String, String)> = files
            .iter()
            .map(|f| {
                let relative = f.strip_prefix(root.join(krate)).unwrap();
                (
                    relative.to_string_lossy().into_owned(),
                    std::fs::read_to_string(f).unwrap(),
                )
            })
            .collect();
        for circle in circles(&sources) {
            found.push(format!("{krate}: {}", circle.join(", ")));
        }
    }
    assert!(
        found.is_empty(),
        "files that import each other, through one another (put the shared piece in a file \
         they can all look down to):\n{}",
        found.join("\n")
    );
}

#[test]
fn a_circle_is_found_through_use_trees_super_and_inline_paths() {
    let files = [
        ("lib.rs", "pub mod a;\npub mod b;\nmod c;\n"),
        (
            "a/mod.rs",
            "//! a\nmod inner;\nuse crate::{b::{self, Thing}, c};\n",
        ),
        ("a/inner.rs", "use super::super::c::Other;\n"),
        // Its tests' `super` is b itself, and tests import what they like; a quote in a char or a
        // raw string hides no path.
        (
            "b.rs",
            "pub struct Thing;\nfn q() -> char { '\"' }\nconst R: &str = r#\"x\" crate::c::y\"#;\n\
             #[cfg(test)]\nmod tests {\n    use super::*;\n    use crate::a::Thing;\n}\n",
        ),
        // c -> a (through an inline path) -> b, c: the circle a -> c -> a.
        (
            "c.rs",
            "pub struct Other;\nfn f() { crate::a::g(); }\n// crate::b::not_read\n",
        ),
    ];
    let sources: Vec<(String, String)> = files
        .iter()
        .map(|(p, t)| (p.to_string(), t.to_string()))
        .collect();
    assert_eq!(circles(&sources), [vec!["a/mod.rs", "c.rs"]]);
    // Without the inline path, none: a child importing from its parent's sibling is no circle.
    let mut acyclic = sources.clone();
    acyclic[4].1 = "pub struct Other;\n".into();
    assert!(circles(&acyclic).is_empty());
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n == "bin") {
                continue;
            }
            out.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out.sort();
    out
}

/// The circles among `sources` (path relative to the crate's source folder, text): each as the
/// files of one strongly connected component. The crate root
/// (`lib.rs`, `main.rs`) is left out: it declares every module and re-exports, imports nothing.
fn circles(sources: &[(String, String)]) -> Vec<Vec<String>> {
    let files: BTreeSet<&str> = sources.iter().map(|(p, _)| p.as_str()).collect();
    let mut graph: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (path, text) in sources {
        // Test code is a leaf that nothing imports: its imports tie no circle.
        if is_root(path) || module_of(path).last().is_some_and(|m| m == "tests") {
            continue;
        }
        let module = module_of(path);
        let edges = graph.entry(path.as_str()).or_default();
        for (inline, target) in imported_paths(&strip_comments(text)) {
            if inline.iter().any(|m| m == "tests") {
                continue;
            }
            let mut within = module.clone();
            within.extend(inline);
            let Some(absolute) = absolute(&within, &target) else {
                continue;
            };
            if let Some(file) = file_of(&files, &absolute) {
                if file != path && !is_root(file) && !is_descendant(&module, &module_of(file)) {
                    edges.insert(file);
                }
            }
        }
    }
    strongly_connected(&graph)
        .into_iter()
        .filter(|c| c.len() > 1)
        .map(|c| c.into_iter().map(String::from).collect())
        .collect()
}

fn is_root(path: &str) -> bool {
    path == "lib.rs" || path == "main.rs"
}

/// A module's path segments from its file: `a/b.rs` and `a/b/mod.rs` are `[a, b]`.
fn module_of(path: &str) -> Vec<String> {
    let trimmed = path.trim_end_matches(".rs");
    let mut segments: Vec<String> = trimmed.split('/').map(String::from).collect();
    if segments
        .last()
        .is_some_and(|s| s == "mod" || s == "lib" || s == "main")
    {
        segments.pop();
    }
    segments
}

/// Whether `inner` is `outer` or inside it: a module reaching into its own children (its tests)
/// is not an import between two files of the house.
fn is_descendant(outer: &[String], inner: &[String]) -> bool {
    inner.len() > outer.len() && inner.starts_with(outer)
}

/// `target` (`crate::…`, `super::…`, `self::…`) from `module`, as segments from the crate root.
fn absolute(module: &[String], target: &[String]) -> Option<Vec<String>> {
    let mut at: Vec<String> = module.to_vec();
    let mut rest = target;
    match rest.first().map(String::as_str) {
        Some("crate") => {
            at.clear();
            rest = &rest[1..];
        }
        Some("super") | Some("self") => {
            while let Some(first) = rest.first() {
                match first.as_str() {
                    "super" => {
                        at.pop()?;
                    }
                    "self" => {}
                    _ => break,
                }
                rest = &rest[1..];
            }
        }
        _ => return None,
    }
    at.extend(rest.iter().cloned());
    Some(at)
}

/// The file of the deepest module `segments` names.
fn file_of<'a>(files: &BTreeSet<&'a str>, segments: &[String]) -> Option<&'a str> {
    (1..=segments.len()).rev().find_map(|n| {
        let base = segments[..n].join("/");
        [format!("{base}.rs"), format!("{base}/mod.rs")]
            .iter()
            .find_map(|f| files.get(f.as_str()).copied())
    })
}

/// The text without comments and without string and character literals (raw ones too), so
/// neither is read as a path.
fn strip_comments(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
            continue;
        }
        if c == '/' && next == Some('*') {
            i += 2;
            while i < chars.len() && !(chars[i] == '*' && chars.get(i + 1) == Some(&'/')) {
                i += 1;
            }
            i += 2;
            continue;
        }
        let starts_token = i == 0 || !ident(chars[i - 1]);
        if c == 'r' && starts_token && matches!(next, Some('#') | Some('"')) {
            // r"…", r#"…"#: ends at a quote followed by as many #.
            let mut hashes = 0;
            let mut k = i + 1;
            while chars.get(k) == Some(&'#') {
                hashes += 1;
                k += 1;
            }
            if chars.get(k) == Some(&'"') {
                k += 1;
                while k < chars.len()
                    && !(chars[k] == '"' && (1..=hashes).all(|h| chars.get(k + h) == Some(&'#')))
                {
                    k += 1;
                }
                i = k + 1 + hashes;
                out.push_str("\"\"");
                continue;
            }
        }
        if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
            continue;
        }
        if c == '\'' {
            // A character literal ('x', '\n', '\''), not a lifetime ('a).
            if next == Some('\\') {
                i += 2;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
                continue;
            }
            if chars.get(i + 2) == Some(&'\'') {
                i += 3;
                continue;
            }
        }
        out.push(c);
        i += 1;
    }
    out
}

/// Every path of a `use` tree, expanded, and every `crate::…`/`super::…`/`self::…` path written
/// elsewhere; each as its segments, with the inline modules it is written in.
fn imported_paths(text: &str) -> Vec<(Vec<String>, Vec<String>)> {
    let tokens = tokens(text);
    let mut paths = Vec::new();
    // The inline modules (`mod tests { … }`) open here, with the brace depth they close at.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0;
    let mut i = 0;
    let here = |inline: &[(String, usize)]| inline.iter().map(|(m, _)| m.clone()).collect();
    while i < tokens.len() {
        match tokens[i].as_str() {
            "{" => depth += 1,
            "}" => {
                depth -= 1;
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
            }
            "mod" if tokens.get(i + 2).is_some_and(|t| t == "{") => {
                inline.push((tokens[i + 1].clone(), depth));
                depth += 1;
                i += 3;
                continue;
            }
            _ => {}
        }
        if tokens[i] == "use" {
            let end = tokens[i..]
                .iter()
                .position(|t| t == ";")
                .map_or(tokens.len(), |p| i + p);
            let mut used = Vec::new();
            expand(&tokens[i + 1..end], &[], &mut used);
            paths.extend(used.into_iter().map(|p| (here(&inline), p)));
            i = end;
        } else if matches!(tokens[i].as_str(), "crate" | "super" | "self")
            && tokens.get(i + 1).is_some_and(|t| t == "::")
        {
            let mut path = vec![tokens[i].clone()];
            let mut j = i + 1;
            while tokens.get(j).is_some_and(|t| t == "::")
                && tokens.get(j + 1).is_some_and(|t| is_ident(t))
            {
                path.push(tokens[j + 1].clone());
                j += 2;
            }
            paths.push((here(&inline), path));
            i = j;
            continue;
        }
        i += 1;
    }
    paths
}

/// Expands a use tree (`a::{b, c::{self, D}}`) below `prefix` into its paths.
fn expand(tree: &[String], prefix: &[String], out: &mut Vec<Vec<String>>) {
    // Split at the top-level commas.
    let mut depth = 0;
    let mut start = 0;
    let mut parts = Vec::new();
    for (k, t) in tree.iter().enumerate() {
        match t.as_str() {
            "{" => depth += 1,
            "}" => depth -= 1,
            "," if depth == 0 => {
                parts.push(&tree[start..k]);
                start = k + 1;
            }
            _ => {}
        }
    }
    parts.push(&tree[start..]);
    for part in parts {
        let mut path = prefix.to_vec();
        let mut k = 0;
        while k < part.len() {
            match part[k].as_str() {
                "::" | "pub" | "as" => {}
                "{" => {
                    let close = part.len() - 1 - part.iter().rev().position(|t| t == "}").unwrap();
                    expand(&part[k + 1..close], &path, out);
                    path.clear();
                    break;
                }
                t if is_ident(t) => {
                    if k > 0 && part[k - 1] == "as" {
                        // An alias names nothing more.
                    } else if t != "self" || path.is_empty() {
                        path.push(t.to_string());
                    }
                }
                _ => {}
            }
            k += 1;
        }
        if !path.is_empty() {
            out.push(path);
        }
    }
}

fn is_ident(t: &str) -> bool {
    t.chars()
        .next()
        .is_some_and(|c| c.is_alphabetic() || c == '_')
        && t.chars().all(|c| c.is_alphanumeric() || c == '_')
}

/// Identifiers, `::` and single punctuation.
fn tokens(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(chars[start..i].iter().collect());
            continue;
        }
        if c == ':' && chars.get(i + 1) == Some(&':') {
            out.push("::".into());
            i += 2;
            continue;
        }
        if !c.is_whitespace() {
            out.push(c.to_string());
        }
        i += 1;
    }
    out
}

/// Tarjan's strongly connected components of `graph`, each sorted.
fn strongly_connected<'a>(graph: &BTreeMap<&'a str, BTreeSet<&'a str>>) -> Vec<Vec<&'a str>> {
    struct State<'a> {
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<Vec<&'a str>>,
    }
    fn visit<'a>(v: &'a str, graph: &BTreeMap<&'a str, BTreeSet<&'a str>>, s: &mut State<'a>) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on_stack.insert(v);
        for &w in graph.get(v).into_iter().flatten() {
            if !s.index.contains_key(w) {
                visit(w, graph, s);
                let low = s.low[v].min(s.low[w]);
                s.low.insert(v, low);
            } else if s.on_stack.contains(w) {
                let low = s.low[v].min(s.index[w]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w);
                if w == v {
                    break;
                }
            }
            component.sort();
            s.out.push(component);
        }
    }
    let mut s = State {
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for &v in graph.keys() {
        if !s.index.contains_key(v) {
            visit(v, graph, &mut s);
        }
    }
    s.out.sort();
    s.out
}
