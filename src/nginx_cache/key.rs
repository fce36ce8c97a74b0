//! The cache key the generated configuration gives an object,
//! `$request_method$host$uri$cdn_key_args$slice_range` (src/cdncluster/nginx.rs), read back into
//! its parts. The parts are written one after the other: the method is upper case, `$host` lower
//! case and without `/`, `$uri` starts with `/`, the query (if any) with `?`, and the slice range
//! is `bytes=N-M` at the end.

/// A cache key's parts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Key<'a> {
    pub method: &'a str,
    pub host: &'a str,
    /// The decoded path, without the query.
    pub path: &'a str,
    /// The path and the query that identifies the object (`/a.ts?v=2`), as the key holds them.
    pub path_and_query: &'a str,
}

/// Splits `key` into its parts; `None` when it is not one of the generated configuration's.
pub fn parse(key: &str) -> Option<Key<'_>> {
    let method_end = key.find(|c: char| !c.is_ascii_uppercase())?;
    let (method, rest) = key.split_at(method_end);
    if method.is_empty() {
        return None;
    }
    let host_end = rest.find('/')?;
    let (host, rest) = rest.split_at(host_end);
    let path_and_query = strip_slice_range(rest);
    let path = path_and_query
        .split_once('?')
        .map_or(path_and_query, |(path, _)| path);
    Some(Key {
        method,
        host,
        path,
        path_and_query,
    })
}

/// `rest` without its trailing `bytes=N-M` (the slice a cache file holds).
fn strip_slice_range(rest: &str) -> &str {
    let Some(at) = rest.rfind("bytes=") else {
        return rest;
    };
    let range = &rest[at + "bytes=".len()..];
    let is_range = range
        .split_once('-')
        .is_some_and(|(from, to)| is_number(from) && is_number(to));
    if is_range {
        &rest[..at]
    } else {
        rest
    }
}

fn is_number(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_the_generated_key() {
        let key =
            parse("GETcdn.example.com/vod/t1/seg-1.ts?quality=hdbytes=1048576-2097151").unwrap();
        assert_eq!(key.method, "GET");
        assert_eq!(key.host, "cdn.example.com");
        assert_eq!(key.path, "/vod/t1/seg-1.ts");
        assert_eq!(key.path_and_query, "/vod/t1/seg-1.ts?quality=hd");
        let head = parse("HEADcdn/live/index.m3u8bytes=0-1048575").unwrap();
        assert_eq!(
            (head.method, head.host, head.path, head.path_and_query),
            ("HEAD", "cdn", "/live/index.m3u8", "/live/index.m3u8")
        );
    }

    #[test]
    fn a_key_without_a_host_or_a_slice_still_splits() {
        let key = parse("GET/a b/c.txt").unwrap();
        assert_eq!((key.host, key.path), ("", "/a b/c.txt"));
        // A path that ends like a range but is not one keeps its end.
        let key = parse("GETh/x/bytes=abc").unwrap();
        assert_eq!(key.path, "/x/bytes=abc");
    }

    #[test]
    fn refuses_what_no_generated_configuration_writes() {
        assert_eq!(parse(""), None);
        assert_eq!(parse("get/a"), None);
        assert_eq!(parse("GEThost-without-path"), None);
    }
}
