//! A cache file of nginx 1.30 (`ngx_http_file_cache_header_t`, then `\nKEY: <key>\n`, then the
//! source's response header as it came, then the body), on a 64-bit little-endian machine (the
//! pods' amd64 and arm64). Parsing is pure; [`invalidate`] writes the header in place.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// `NGX_HTTP_CACHE_VERSION`: the only header version nginx 1.30 reads.
pub const NGINX_VERSION: u64 = 5;
/// The version a hard purge writes: nginx takes a file of another version for a miss
/// ("version mismatch", logged at `info`), fetches the object again and replaces the file. Its
/// bytes say what happened to whoever looks at the file.
pub const PURGED_VERSION: u64 = u64::from_le_bytes(*b"PURGED\0\0");
/// `sizeof(ngx_http_file_cache_header_t)` on LP64: 332 bytes of fields, aligned to 8.
pub const HEADER_SIZE: usize = 336;
/// What follows the header: `\nKEY: `, the key, `\n`.
const KEY_PREFIX: &[u8] = b"\nKEY: ";

/// Offsets of the fields read or written (`ngx_uint_t version; time_t valid_sec, updating_sec,
/// error_sec, last_modified, date; uint32_t crc32; u_short valid_msec, header_start,
/// body_start; ...`).
const VERSION_AT: usize = 0;
const VALID_SEC_AT: usize = 8;
const DATE_AT: usize = 40;
const HEADER_START_AT: usize = 54;
const BODY_START_AT: usize = 56;

/// The fields of a cache file a purge reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachedObject {
    /// [`NGINX_VERSION`] for a file nginx serves, [`PURGED_VERSION`] once hard-purged.
    pub version: u64,
    /// Until when it is fresh (epoch seconds).
    pub valid_sec: i64,
    /// When nginx received the source's response header (epoch seconds): when the body it
    /// holds was fetched.
    pub date: i64,
    /// The cache key, as the configuration built it.
    pub key: String,
    /// The surrogate keys the source sent with it: `Surrogate-Key` (space-separated) and
    /// `Cache-Tag` (comma-separated).
    pub tags: Vec<String>,
}

impl CachedObject {
    /// Whether nginx serves this file (a hard purge makes it a miss).
    pub fn is_live(&self) -> bool {
        self.version == NGINX_VERSION
    }
}

/// Why bytes are not a cache file.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FormatError {
    #[error("{0} bytes: shorter than a cache file's header")]
    Short(usize),
    #[error("no key after the header")]
    NoKey,
    #[error("the header's offsets are out of order")]
    Offsets,
}

/// How many bytes of a file [`parse`] needs at most: the header, key and response header end at
/// `body_start`, a 16-bit offset.
pub const MAX_HEAD: usize = u16::MAX as usize;

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

fn u16_at(bytes: &[u8], at: usize) -> usize {
    usize::from(u16::from_le_bytes(
        bytes[at..at + 2].try_into().expect("2 bytes"),
    ))
}

/// The end of the response header (`body_start`), once the header is read: how much of the file
/// [`parse`] needs.
pub fn head_len(header: &[u8]) -> Option<usize> {
    (header.len() >= HEADER_SIZE).then(|| u16_at(header, BODY_START_AT))
}

/// Reads what a purge needs from the start of a cache file (`head`: at least up to its
/// `body_start`, or the whole file if shorter). Tags are read from the response header when it
/// is all there.
pub fn parse(head: &[u8]) -> Result<CachedObject, FormatError> {
    if head.len() < HEADER_SIZE + KEY_PREFIX.len() {
        return Err(FormatError::Short(head.len()));
    }
    let version = u64_at(head, VERSION_AT);
    let valid_sec = u64_at(head, VALID_SEC_AT) as i64;
    let date = u64_at(head, DATE_AT) as i64;
    let header_start = u16_at(head, HEADER_START_AT);
    let body_start = u16_at(head, BODY_START_AT);
    if !head[HEADER_SIZE..].starts_with(KEY_PREFIX) {
        return Err(FormatError::NoKey);
    }
    let key_start = HEADER_SIZE + KEY_PREFIX.len();
    let key_end = head[key_start..]
        .iter()
        .position(|&b| b == b'\n')
        .map(|n| key_start + n)
        .ok_or(FormatError::NoKey)?;
    if header_start < key_end + 1 || body_start < header_start {
        return Err(FormatError::Offsets);
    }
    let key = String::from_utf8_lossy(&head[key_start..key_end]).into_owned();
    let tags = head
        .get(header_start..body_start)
        .map(response_tags)
        .unwrap_or_default();
    Ok(CachedObject {
        version,
        valid_sec,
        date,
        key,
        tags,
    })
}

/// The surrogate keys of a response header: every `Surrogate-Key` (space-separated, Fastly's)
/// and `Cache-Tag` (comma-separated, Cloudflare's and Akamai's) line.
pub fn response_tags(header: &[u8]) -> Vec<String> {
    let mut tags = Vec::new();
    for line in header.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        let separator: &[char] = if name.eq_ignore_ascii_case(b"surrogate-key") {
            &[' ', '\t']
        } else if name.eq_ignore_ascii_case(b"cache-tag") {
            &[',']
        } else {
            continue;
        };
        let value = String::from_utf8_lossy(value);
        tags.extend(
            value
                .split(separator)
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .map(str::to_string),
        );
    }
    tags
}

/// What a purge does to a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Invalidation {
    /// Gone: a miss at its next request, never served again.
    Hard,
    /// Stale from `cutoff` on: revalidated at its next request, served when the source fails.
    Soft { cutoff: i64 },
}

/// Applies `invalidation` to the cache file `file` whose header was read as `object`: only the
/// 8 bytes of one field are written, on the open file, so a file nginx replaced meanwhile (a
/// new inode at the same path) is left alone. Returns whether anything was written.
pub fn invalidate(
    file: &File,
    object: &CachedObject,
    invalidation: Invalidation,
) -> io::Result<bool> {
    if !object.is_live() {
        return Ok(false);
    }
    match invalidation {
        Invalidation::Hard => {
            file.write_all_at(&PURGED_VERSION.to_le_bytes(), VERSION_AT as u64)?;
        }
        Invalidation::Soft { cutoff } => {
            if object.valid_sec < cutoff {
                return Ok(false);
            }
            let stale = cutoff - 1;
            file.write_all_at(&stale.to_le_bytes(), VALID_SEC_AT as u64)?;
        }
    }
    Ok(true)
}

/// Reads the head of an open cache file: up to its `body_start`, or all of a shorter file.
pub fn read_head(file: &File, buffer: &mut Vec<u8>) -> io::Result<()> {
    buffer.resize(4096, 0);
    let mut read = read_at_most(file, buffer, 0)?;
    buffer.truncate(read);
    if let Some(end) = head_len(buffer).filter(|&end| end > read) {
        buffer.resize(end.min(MAX_HEAD), 0);
        read += read_at_most(file, &mut buffer[read..], read as u64)?;
        buffer.truncate(read);
    }
    Ok(())
}

fn read_at_most(file: &File, buffer: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buffer.len() {
        match file.read_at(&mut buffer[filled..], offset + filled as u64) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// The bytes of a cache file as nginx 1.30 writes one, holding `key` fetched at `date` (fresh
/// until `valid_sec`), the source's `response_header` and `body`: for tests and benchmarks that
/// need a cache without fetching it.
pub fn format(key: &str, date: i64, valid_sec: i64, response_header: &str, body: &[u8]) -> Vec<u8> {
    let mut bytes = vec![0u8; HEADER_SIZE];
    bytes[VERSION_AT..VERSION_AT + 8].copy_from_slice(&NGINX_VERSION.to_le_bytes());
    bytes[VALID_SEC_AT..VALID_SEC_AT + 8].copy_from_slice(&valid_sec.to_le_bytes());
    bytes[DATE_AT..DATE_AT + 8].copy_from_slice(&date.to_le_bytes());
    bytes.extend_from_slice(KEY_PREFIX);
    bytes.extend_from_slice(key.as_bytes());
    bytes.push(b'\n');
    let header_start = bytes.len() as u16;
    bytes.extend_from_slice(response_header.as_bytes());
    let body_start = bytes.len() as u16;
    bytes[HEADER_START_AT..HEADER_START_AT + 2].copy_from_slice(&header_start.to_le_bytes());
    bytes[BODY_START_AT..BODY_START_AT + 2].copy_from_slice(&body_start.to_le_bytes());
    bytes.extend_from_slice(body);
    bytes
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A cache file with the body `the body`.
    pub fn cache_file(key: &str, date: i64, valid_sec: i64, response_header: &str) -> Vec<u8> {
        format(key, date, valid_sec, response_header, b"the body")
    }

    #[test]
    fn reads_the_key_dates_and_tags_of_a_cache_file() {
        let bytes = cache_file(
            "GETcdn.example/vod/a.ts?v=1bytes=0-1048575",
            1_700_000_000,
            1_700_086_400,
            "HTTP/1.1 206 Partial Content\r\nServer: origin\r\nSurrogate-Key: title-1  season-2\r\ncache-tag: t1, t2 ,\r\nSurrogate-Key: extra\r\n\r\n",
        );
        let object = parse(&bytes).unwrap();
        assert_eq!(object.key, "GETcdn.example/vod/a.ts?v=1bytes=0-1048575");
        assert_eq!(object.date, 1_700_000_000);
        assert_eq!(object.valid_sec, 1_700_086_400);
        assert!(object.is_live());
        assert_eq!(object.tags, ["title-1", "season-2", "t1", "t2", "extra"]);
    }

    #[test]
    fn refuses_what_is_not_a_cache_file() {
        assert_eq!(parse(b"short"), Err(FormatError::Short(5)));
        let mut bytes = cache_file("GETh/a", 1, 2, "HTTP/1.1 200 OK\r\n\r\n");
        bytes[HEADER_SIZE + 1] = b'X';
        assert_eq!(parse(&bytes), Err(FormatError::NoKey));
        let mut bytes = cache_file("GETh/a", 1, 2, "HTTP/1.1 200 OK\r\n\r\n");
        bytes[54..56].copy_from_slice(&1u16.to_le_bytes());
        assert_eq!(parse(&bytes), Err(FormatError::Offsets));
    }

    #[test]
    fn a_hard_purge_changes_the_version_and_a_soft_one_the_validity_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(
            &path,
            cache_file("GETh/a", 100, 1_000, "HTTP/1.1 200 OK\r\n\r\n"),
        )
        .unwrap();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let read = |file: &File| {
            let mut head = Vec::new();
            read_head(file, &mut head).unwrap();
            parse(&head).unwrap()
        };
        let object = read(&file);
        let soft = Invalidation::Soft { cutoff: 500 };
        assert!(invalidate(&file, &object, soft).unwrap());
        let object = read(&file);
        assert_eq!(object.valid_sec, 499);
        assert!(!invalidate(&file, &object, soft).unwrap(), "already stale");
        assert!(invalidate(&file, &object, Invalidation::Hard).unwrap());
        let object = read(&file);
        assert_eq!(object.version, PURGED_VERSION);
        assert!(!object.is_live());
        assert!(!invalidate(&file, &object, Invalidation::Hard).unwrap());
        // The body is untouched: a response being sent from it finishes.
        assert!(std::fs::read(&path).unwrap().ends_with(b"the body"));
    }
}
