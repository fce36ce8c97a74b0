//! `cdn-operator sign-url`: a token for a CdnCluster's signed URLs (`spec.signedUrls`), as its
//! verifier checks it: Akamai EdgeAuth 2.0's format, HMAC-SHA256 (docs/data-plane.md#signed-urls).
//! [`token`] is the formula; the command reads the key and the fields and prints the token or the
//! whole URL.

use std::path::PathBuf;
use std::process::ExitCode;

/// The environment variable that may hold the key, rather than a file: never a flag, which a
/// shell's history would keep.
pub const KEY_ENV: &str = "CDN_TOKEN_KEY";

#[derive(clap::Args, Debug, Clone)]
#[command(after_help = "\
The key: --key-file, else the environment variable CDN_TOKEN_KEY; hex, 16 to 64 bytes (an entry of
the CdnCluster's signedUrls Secret). The token signs an ACL (--acl, repeatable: any of its patterns
covers the request path, `*` matching any run of characters, `/` included) or one path (--url),
until --expires or for --ttl. Paths are as nginx decodes them: `/a b.ts`, not `/a%20b.ts`.

Examples:
  cdn-operator sign-url --key-file key.hex --acl '/vod/title/*' --ttl 6h
  CDN_TOKEN_KEY=$(cat key.hex) cdn-operator sign-url --url /live/index.m3u8 --ttl 30s \\
      --base-url https://cdn.example.com/live/index.m3u8")]
pub struct Args {
    /// A file holding the key (its first line, hex).
    #[arg(long, value_name = "FILE")]
    pub key_file: Option<PathBuf>,

    /// A path pattern the token admits; repeat for several. `*` matches any run of characters.
    #[arg(
        long,
        value_name = "PATTERN",
        required_unless_present = "url",
        conflicts_with = "url"
    )]
    pub acl: Vec<String>,

    /// The one path the token admits (EdgeAuth's URL mode: the path is signed, not written).
    #[arg(long, value_name = "PATH")]
    pub url: Option<String>,

    /// How long the token is valid from now: seconds, or with a unit (`30s`, `10m`, `6h`, `7d`).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, required_unless_present = "expires", conflicts_with = "expires")]
    pub ttl: Option<u64>,

    /// When the token expires, in seconds since the epoch.
    #[arg(long, value_name = "EPOCH")]
    pub expires: Option<u64>,

    /// When the token becomes valid, in seconds since the epoch, or `now`; default: at once.
    #[arg(long, value_name = "EPOCH|now")]
    pub start: Option<String>,

    /// The viewer's address the token is bound to, as the edge sees it (`203.0.113.7`).
    #[arg(long, value_name = "ADDRESS")]
    pub ip: Option<String>,

    /// EdgeAuth's session id field, signed and not checked.
    #[arg(long, value_name = "ID")]
    pub id: Option<String>,

    /// EdgeAuth's data field, signed and not checked.
    #[arg(long, value_name = "DATA")]
    pub data: Option<String>,

    /// Print this URL with the token as its query parameter, rather than the token alone.
    #[arg(long, value_name = "URL")]
    pub base_url: Option<String>,

    /// The query parameter of --base-url: the CdnCluster's signedUrls.tokenName.
    #[arg(long, value_name = "NAME", default_value = crate::api::DEFAULT_TOKEN_NAME)]
    pub token_name: String,
}

/// What a token says, but its MAC.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fields {
    pub ip: Option<String>,
    /// Seconds since the epoch.
    pub start: Option<u64>,
    pub expires: u64,
    /// The ACL's patterns; none for a URL token.
    pub acl: Vec<String>,
    /// The path a URL token signs.
    pub url: Option<String>,
    pub id: Option<String>,
    pub data: Option<String>,
}

/// The token of `fields` under `key`: `[ip=…~][st=…~]exp=…[~acl=P!P…][~id=…][~data=…]~hmac=H`, H
/// the lowercase hex HMAC-SHA256 under `key` of everything before `~hmac=`, followed, for a URL
/// token, by `~url=<path>`.
pub fn token(key: &[u8], fields: &Fields) -> String {
    let mut parts = Vec::new();
    if let Some(ip) = &fields.ip {
        parts.push(format!("ip={ip}"));
    }
    if let Some(start) = fields.start {
        parts.push(format!("st={start}"));
    }
    parts.push(format!("exp={}", fields.expires));
    if !fields.acl.is_empty() {
        parts.push(format!("acl={}", fields.acl.join("!")));
    }
    if let Some(id) = &fields.id {
        parts.push(format!("id={id}"));
    }
    if let Some(data) = &fields.data {
        parts.push(format!("data={data}"));
    }
    let text = parts.join("~");
    let signed = match &fields.url {
        Some(url) if fields.acl.is_empty() => format!("{text}~url={url}"),
        _ => text.clone(),
    };
    let mac = ring::hmac::sign(
        &ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key),
        signed.as_bytes(),
    );
    format!("{text}~hmac={}", hex(mac.as_ref()))
}

/// `bytes` in lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A key as the Secret holds it: hex, 16 to 64 bytes, whitespace around it ignored.
pub fn parse_key(text: &str) -> Result<Vec<u8>, String> {
    let text = text.trim();
    if !text.len().is_multiple_of(2) || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err("the key is not hexadecimal (an even number of 0-9, a-f)".into());
    }
    let bytes: Vec<u8> = (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("checked hex"))
        .collect();
    if !(16..=64).contains(&bytes.len()) {
        return Err(format!(
            "the key is {} bytes: 16 to 64 are accepted",
            bytes.len()
        ));
    }
    Ok(bytes)
}

/// Seconds: `90`, `30s`, `10m`, `6h`, `7d`.
fn parse_duration(text: &str) -> Result<u64, String> {
    let (digits, scale) = match text.chars().last() {
        Some('s') => (&text[..text.len() - 1], 1),
        Some('m') => (&text[..text.len() - 1], 60),
        Some('h') => (&text[..text.len() - 1], 3600),
        Some('d') => (&text[..text.len() - 1], 86400),
        _ => (text, 1),
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("{text:?} is not a duration (90, 30s, 10m, 6h, 7d)"))
}

/// The fields of `args`, the time being `now`.
fn fields(args: &Args, now: u64) -> Result<Fields, String> {
    let start = match args.start.as_deref() {
        None => None,
        Some("now") => Some(now),
        Some(text) => Some(
            text.parse::<u64>()
                .map_err(|_| format!("--start {text:?}: seconds since the epoch, or now"))?,
        ),
    };
    let expires = match (args.expires, args.ttl) {
        (Some(expires), _) => expires,
        (None, Some(ttl)) => start.unwrap_or(now).saturating_add(ttl),
        (None, None) => return Err("--ttl or --expires is required".into()),
    };
    if start.is_some_and(|s| s >= expires) {
        return Err("the token would expire before it starts".into());
    }
    // A field cannot hold the separators of the format.
    let text_fields = [
        ("--ip", args.ip.as_deref()),
        ("--id", args.id.as_deref()),
        ("--data", args.data.as_deref()),
        ("--url", args.url.as_deref()),
    ];
    for (flag, value) in text_fields {
        if value.is_some_and(|v| v.contains('~')) {
            return Err(format!("{flag} cannot contain `~`"));
        }
    }
    for pattern in &args.acl {
        if pattern.is_empty() || pattern.contains(['~', '!']) {
            return Err(format!(
                "--acl {pattern:?}: a pattern is a path, without `~` or `!`"
            ));
        }
    }
    if args.url.as_deref().is_some_and(str::is_empty) {
        return Err("--url: a path is needed".into());
    }
    Ok(Fields {
        ip: args.ip.clone(),
        start,
        expires,
        acl: args.acl.clone(),
        url: args.url.clone(),
        id: args.id.clone(),
        data: args.data.clone(),
    })
}

/// The key of `args`: its file, else [`KEY_ENV`].
fn key(args: &Args) -> Result<Vec<u8>, String> {
    let text = match &args.key_file {
        Some(file) => {
            let text = std::fs::read_to_string(file)
                .map_err(|e| format!("--key-file {}: {e}", file.display()))?;
            text.lines().next().unwrap_or_default().to_string()
        }
        None => std::env::var(KEY_ENV)
            .map_err(|_| format!("no key: give --key-file, or set {KEY_ENV}"))?,
    };
    parse_key(&text)
}

/// `base` with the token as its query parameter `name`. The token's characters are all safe in
/// a query but for those of the fields given (an address of IPv6, a session id).
fn url(base: &str, name: &str, token: &str) -> String {
    let separator = if base.contains('?') { '&' } else { '?' };
    format!("{base}{separator}{name}={token}")
}

pub fn main(args: Args) -> ExitCode {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let signed = key(&args).and_then(|key| Ok((key, fields(&args, now)?)));
    let (key, fields) = match signed {
        Ok(signed) => signed,
        Err(message) => return crate::fail(&message),
    };
    if fields.expires <= now {
        eprintln!("cdn-operator: warning: the token has already expired");
    }
    let token = token(&key, &fields);
    let out = match &args.base_url {
        Some(base) => url(base, &args.token_name, &token),
        None => token,
    };
    super::print_out(&format!("{out}\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_format_is_edgeauths() {
        let key = parse_key("52a152a152a152a152a152a152a152a1").unwrap();
        let fields = Fields {
            expires: 1999999999,
            acl: vec!["/*".into()],
            ..Fields::default()
        };
        // akamai-edgeauth 0.3.2: EdgeAuth(key=…, end_time=1999999999).generate_acl_token('/*').
        assert_eq!(
            token(&key, &fields),
            "exp=1999999999~acl=/*~hmac=15302c88101d5d6d22f9a49d1c40ed29c2e8561cedc9c9f9c7bbf3cb549cb5bc"
        );
    }

    #[test]
    fn keys_are_hex_of_16_to_64_bytes() {
        assert_eq!(
            parse_key(" 00112233445566778899aabbccddeeff\n")
                .unwrap()
                .len(),
            16
        );
        assert_eq!(parse_key(&"ab".repeat(64)).unwrap().len(), 64);
        for bad in [
            "",
            "abc",
            "zz112233445566778899aabbccddeeff",
            &"ab".repeat(15),
            &"ab".repeat(65),
        ] {
            assert!(parse_key(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations_take_units() {
        assert_eq!(parse_duration("90"), Ok(90));
        assert_eq!(parse_duration("10m"), Ok(600));
        assert_eq!(parse_duration("6h"), Ok(21600));
        assert_eq!(parse_duration("7d"), Ok(604800));
        assert!(parse_duration("0").is_err());
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn a_url_gets_the_token_as_its_parameter() {
        assert_eq!(
            url("https://cdn/a.ts", "__token__", "exp=1~hmac=x"),
            "https://cdn/a.ts?__token__=exp=1~hmac=x"
        );
        assert_eq!(
            url("https://cdn/a.ts?q=1", "t", "exp=1~hmac=x"),
            "https://cdn/a.ts?q=1&t=exp=1~hmac=x"
        );
    }
}
