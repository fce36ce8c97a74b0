//! Which answer is served: one Host's body to another (row 3), a live manifest's new version (11).

use cdn_operator::cdncluster::nginx::CACHE_STATUS_HEADER;
use serde_json::json;
use std::io;
use std::time::{Duration, Instant};

use crate::cdn::Cdn;
use crate::client::{Client, Response};
use crate::lab::{Setup, EDGE};
use crate::report::{figure, Figure};
use crate::traffic::{cache_status, get_once};
use crate::util::{sleep_until, write_atomically};

impl Cdn {
    /// Row 3: `Host: customer-a` caches /site/page.html; then `Host: customer-b` asks for it.
    pub(super) fn row3_hosts(&mut self) -> Vec<Figure> {
        let path = "/site/page.html";
        let ask = |host: &str| Client::once(EDGE, "GET", path, &[("Host", host)]);
        let a1 = ask("customer-a");
        let a2 = ask("customer-a");
        let b = ask("customer-b");
        let body = |r: &io::Result<Response>| match r {
            Ok(r) => String::from_utf8_lossy(&r.body).trim().to_string(),
            Err(e) => format!("error: {e}"),
        };
        let a_body = body(&a1);
        let b_body = body(&b);
        let cross = b.is_ok() && b_body == a_body;
        let shown = format!(
            "{} (b got {}, {})",
            u8::from(cross),
            if cross {
                "customer-a's body".to_string()
            } else if b_body == "page of customer-b" {
                "its own body".to_string()
            } else {
                b_body.clone()
            },
            cache_status(&b)
        );
        vec![figure(
            "3",
            shown,
            Some(!cross),
            json!({
                "customer_a": [body(&a1), cache_status(&a1), cache_status(&a2)],
                "customer_b": [b_body, cache_status(&b)],
                "cross_host_hits": u8::from(cross),
            }),
        )]
    }

    /// Row 11: a live manifest (no Cache-Control, no Expires) cached; 1 s later a new version at
    /// the origin; asked once a second: when the new version is served (at most 30 s).
    pub(super) fn row11_live_manifest(&mut self, setup: &Setup) -> Vec<Figure> {
        let file = setup.www.join("live/r11.m3u8");
        let path = "/live/r11.m3u8";
        write_atomically(&file, "#EXTM3U\n#EXT-X-MEDIA-SEQUENCE:1\n#v1\n");
        let first = get_once(path);
        let second = get_once(path);
        // Another second: nginx's Last-Modified has a resolution of one second.
        std::thread::sleep(Duration::from_millis(1100));
        write_atomically(
            &file,
            "#EXTM3U\n#EXT-X-MEDIA-SEQUENCE:2\n#v2 (a new segment)\n",
        );
        let changed = Instant::now();
        let mut seen = None;
        let mut polls = Vec::new();
        while changed.elapsed() < Duration::from_secs(30) {
            sleep_until(changed + Duration::from_secs(polls.len() as u64 + 1));
            let r = get_once(path);
            let new = r
                .as_ref()
                .is_ok_and(|r| String::from_utf8_lossy(&r.body).contains("#v2"));
            polls.push(match &r {
                Ok(_) => format!("{} {}", if new { "v2" } else { "v1" }, cache_status(&r)),
                Err(e) => e.kind().to_string(),
            });
            if new {
                seen = Some(changed.elapsed().as_secs_f64());
                break;
            }
        }
        vec![figure(
            "11",
            match seen {
                Some(s) => format!("{s:.0} s"),
                None => "> 30 s (frozen)".into(),
            },
            None,
            json!({
                "seconds": seen,
                // Without the header: null here, `-` elsewhere.
                "first": first.as_ref().ok().and_then(|r| r.header(CACHE_STATUS_HEADER)),
                "second": cache_status(&second),
                "polls": polls,
            }),
        )]
    }
}
