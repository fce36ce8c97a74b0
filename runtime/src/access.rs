//! Who may read an endpoint, decided by the API server, as controller-runtime's
//! `filters.WithAuthenticationAndAuthorization` (and kube-rbac-proxy) do: the caller's bearer
//! token is checked with a TokenReview, then a SubjectAccessReview asks whether that user may
//! `get` the non-resource URL of the request (`/metrics`), which RBAC grants with
//! `nonResourceURLs: ["/metrics"]`.
//!
//! No token or a token the API server rejects: 401. Authenticated but not allowed: 403. The API
//! server not answering: 500. Decisions are cached briefly with controller-runtime's TTLs, so a
//! scrape every 30 s costs the API server almost nothing.

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, UserInfo};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// controller-runtime's TTLs: tokens (either answer) 1 min, allowed 5 min, denied 30 s.
pub const TOKEN_TTL: Duration = Duration::from_secs(60);
pub const ALLOW_TTL: Duration = Duration::from_secs(300);
pub const DENY_TTL: Duration = Duration::from_secs(30);
/// An upper bound on each cache; past it, expired entries go, and then everything.
const CACHE_ENTRIES: usize = 1024;
/// How long one review may take (controller-runtime's TokenAccessReviewTimeout).
const REVIEW_TIMEOUT: Duration = Duration::from_secs(10);

/// The delegated authentication and authorization of requests.
#[derive(Clone)]
pub struct Access {
    client: kube::Client,
    /// sha256 of the token → the user it authenticates, or None when rejected.
    tokens: Arc<Cache<[u8; 32], Option<UserInfo>>>,
    /// (user, groups, uid, extra, verb, path) → allowed.
    decisions: Arc<Cache<String, bool>>,
}

impl Access {
    pub fn new(client: kube::Client) -> Access {
        Access {
            client,
            tokens: Arc::default(),
            decisions: Arc::default(),
        }
    }

    /// `router` behind the check: every request, whatever its path, is reviewed first.
    pub fn protect(&self, router: axum::Router) -> axum::Router {
        router.layer(axum::middleware::from_fn_with_state(self.clone(), check))
    }

    async fn authenticate(&self, token: &str) -> Result<Option<UserInfo>, kube::Error> {
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some(user) = self.tokens.get(&key) {
            return Ok(user);
        }
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_string(),
                audiences: None,
            },
            ..TokenReview::default()
        };
        let reviewed = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await?;
        let user = reviewed
            .status
            .filter(|s| {
                s.authenticated == Some(true) && s.error.as_deref().unwrap_or("").is_empty()
            })
            .and_then(|s| s.user);
        self.tokens.put(key, user.clone(), TOKEN_TTL);
        Ok(user)
    }

    async fn authorize(
        &self,
        user: &UserInfo,
        verb: &str,
        path: &str,
    ) -> Result<bool, kube::Error> {
        let key = serde_json::to_string(&(user, verb, path)).expect("JSON of strings");
        if let Some(allowed) = self.decisions.get(&key) {
            return Ok(allowed);
        }
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username.clone(),
                groups: user.groups.clone(),
                uid: user.uid.clone(),
                extra: user.extra.clone(),
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(path.to_string()),
                    verb: Some(verb.to_string()),
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        let reviewed = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await?;
        let allowed = reviewed
            .status
            .is_some_and(|s| s.allowed && s.denied != Some(true));
        let ttl = if allowed { ALLOW_TTL } else { DENY_TTL };
        self.decisions.put(key, allowed, ttl);
        Ok(allowed)
    }
}

/// The middleware: authenticate, authorize, then pass the request on.
async fn check(State(access): State<Access>, request: Request, next: Next) -> Response {
    let Some(token) = bearer_token(request.headers()) else {
        return refuse(StatusCode::UNAUTHORIZED, "Unauthorized".into());
    };
    let user = match tokio::time::timeout(REVIEW_TIMEOUT, access.authenticate(&token)).await {
        Ok(Ok(Some(user))) => user,
        Ok(Ok(None)) => return refuse(StatusCode::UNAUTHORIZED, "Unauthorized".into()),
        Ok(Err(error)) => {
            tracing::error!(%error, "metrics: the TokenReview failed");
            return refuse(
                StatusCode::INTERNAL_SERVER_ERROR,
                "Authentication failed".into(),
            );
        }
        Err(_) => {
            tracing::error!(timeout = ?REVIEW_TIMEOUT, "metrics: the TokenReview timed out");
            return refuse(
                StatusCode::INTERNAL_SERVER_ERROR,
                "Authentication failed".into(),
            );
        }
    };
    let name = user.username.clone().unwrap_or_default();
    let verb = request.method().as_str().to_ascii_lowercase();
    let path = request.uri().path().to_string();
    match tokio::time::timeout(REVIEW_TIMEOUT, access.authorize(&user, &verb, &path)).await {
        Ok(Ok(true)) => next.run(request).await,
        Ok(Ok(false)) => {
            tracing::debug!(user = %name, %verb, %path, "metrics: access denied");
            refuse(
                StatusCode::FORBIDDEN,
                format!("Authorization denied for user {name}"),
            )
        }
        outcome => {
            match outcome {
                Ok(Err(error)) => {
                    tracing::error!(%error, user = %name, "metrics: the SubjectAccessReview failed")
                }
                _ => {
                    tracing::error!(timeout = ?REVIEW_TIMEOUT, user = %name, "metrics: the SubjectAccessReview timed out")
                }
            }
            refuse(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("Authorization for user {name} failed"),
            )
        }
    }
}

fn refuse(status: StatusCode, message: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!("{message}\n"),
    )
        .into_response()
}

/// The token of `Authorization: Bearer <token>` (the scheme in any case, as the API server reads
/// it); None without one.
fn bearer_token(headers: &axum::http::HeaderMap) -> Option<String> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?.trim();
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then(|| token.to_string())
}

/// A small map whose entries expire.
struct Cache<K, V> {
    entries: Mutex<HashMap<K, (V, Instant)>>,
}

impl<K, V> Default for Cache<K, V> {
    fn default() -> Self {
        Cache {
            entries: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Eq + Hash, V: Clone> Cache<K, V> {
    fn get(&self, key: &K) -> Option<V> {
        let entries = self.entries.lock().expect("cache lock");
        entries
            .get(key)
            .filter(|(_, expires)| Instant::now() < *expires)
            .map(|(value, _)| value.clone())
    }

    fn put(&self, key: K, value: V, ttl: Duration) {
        let mut entries = self.entries.lock().expect("cache lock");
        if entries.len() >= CACHE_ENTRIES {
            let now = Instant::now();
            entries.retain(|_, (_, expires)| now < *expires);
            if entries.len() >= CACHE_ENTRIES {
                entries.clear();
            }
        }
        entries.insert(key, (value, Instant::now() + ttl));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderMap;

    fn with_authorization(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, value.parse().unwrap());
        headers
    }

    #[test]
    fn bearer_tokens_are_read_as_the_api_server_reads_them() {
        assert_eq!(bearer_token(&HeaderMap::new()), None);
        assert_eq!(
            bearer_token(&with_authorization("Bearer abc.def")).as_deref(),
            Some("abc.def")
        );
        assert_eq!(
            bearer_token(&with_authorization("bearer  abc ")).as_deref(),
            Some("abc")
        );
        assert_eq!(bearer_token(&with_authorization("Bearer ")), None);
        assert_eq!(bearer_token(&with_authorization("Basic dTpw")), None);
        assert_eq!(bearer_token(&with_authorization("abc")), None);
    }

    #[test]
    fn cache_entries_expire_and_the_cache_stays_bounded() {
        let cache = Cache::<u32, bool>::default();
        cache.put(1, true, Duration::from_secs(60));
        cache.put(2, false, Duration::ZERO);
        assert_eq!(cache.get(&1), Some(true));
        assert_eq!(cache.get(&2), None, "expired");
        for key in 0..(CACHE_ENTRIES as u32 * 3) {
            cache.put(key, true, Duration::from_secs(60));
        }
        assert!(cache.entries.lock().unwrap().len() <= CACHE_ENTRIES);
    }
}
