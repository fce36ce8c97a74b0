//! Traces, and the subscriber that carries them with the logs ([`super::logs`]). Traces go to an
//! OTLP collector over HTTP/protobuf when the standard `OTEL_EXPORTER_OTLP_*` variables name one;
//! otherwise no OpenTelemetry layer is installed at all, so tracing costs nothing extra.

use super::logs::{JsonLines, LogFormat, SpanFields};
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator, SdkTracerProvider};
use std::time::Duration;
use tracing::{Level, Span, Subscriber};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::filter::{dynamic_filter_fn, EnvFilter};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::{Layer, Registry};

/// The program traced: its OpenTelemetry `service.name` when `OTEL_SERVICE_NAME` does not set
/// one, and its `service.version`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Service {
    pub name: &'static str,
    pub version: &'static str,
}

/// Where to send traces.
/// Why logs or traces cannot be set up as configured.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum TelemetryError {
    #[error("OTLP endpoint {0}")]
    Endpoint(String),
    #[error("OTLP protocol `{0}` is not supported: set OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf")]
    Protocol(String),
    #[error("OTEL_EXPORTER_OTLP_TIMEOUT `{0}` is not a number of milliseconds")]
    Timeout(String),
    #[error("OTEL_EXPORTER_OTLP_CERTIFICATE `{}`: {reason}", path.display())]
    Certificate {
        path: std::path::PathBuf,
        reason: String,
    },
    #[error("{0} (for OTLP)")]
    Roots(String),
    #[error("cannot set up the OTLP exporter: {0}")]
    Exporter(String),
    #[error("invalid log level `{filter}`: {reason}")]
    Level { filter: String, reason: String },
    #[error("cannot install the log subscriber: {0}")]
    Install(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Otlp {
    /// The full URL of the traces endpoint (`…/v1/traces`).
    pub endpoint: String,
    pub service_name: String,
    pub service_version: String,
    pub timeout: Duration,
    /// For `https://`: a PEM file of the CA(s) to trust instead of the system's.
    pub certificate: Option<std::path::PathBuf>,
}

impl Otlp {
    /// Reads the standard variables through `var`: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (used as
    /// is) or `OTEL_EXPORTER_OTLP_ENDPOINT` (+ `/v1/traces`), `OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL`
    /// (only `http/protobuf`), `OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT` (ms), `OTEL_SERVICE_NAME`,
    /// `OTEL_SDK_DISABLED` and `OTEL_TRACES_EXPORTER=none`. `None` when no endpoint is set.
    ///
    /// Why not leave these to opentelemetry-otlp, which reads them too: its resolution is private
    /// (0.33's `resolve_http_endpoint`), and the operator needs the result before building the
    /// exporter: whether tracing is on at all (the exporter would default to localhost), a bad
    /// URL or protocol as one line at start, the transport's timeout and the CA file.
    pub fn from_env(
        service: Service,
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Otlp>, TelemetryError> {
        let var = |name: &str| {
            var(name)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        if var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
            || var("OTEL_TRACES_EXPORTER").is_some_and(|v| v.eq_ignore_ascii_case("none"))
        {
            return Ok(None);
        }
        let endpoint = match (
            var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
            var("OTEL_EXPORTER_OTLP_ENDPOINT"),
        ) {
            (Some(traces), _) => traces,
            (None, Some(base)) => format!("{}/v1/traces", base.trim_end_matches('/')),
            (None, None) => return Ok(None),
        };
        let url = url::Url::parse(&endpoint)
            .map_err(|e| TelemetryError::Endpoint(format!("`{endpoint}` is not a URL: {e}")))?;
        if url.scheme() != "http" && url.scheme() != "https" {
            return Err(TelemetryError::Endpoint(format!(
                "`{endpoint}` must be an http:// or https:// URL"
            )));
        }
        let protocol = var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
            .or_else(|| var("OTEL_EXPORTER_OTLP_PROTOCOL"))
            .unwrap_or_else(|| "http/protobuf".into());
        if protocol != "http/protobuf" {
            return Err(TelemetryError::Protocol(protocol));
        }
        let timeout = match var("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT")
            .or_else(|| var("OTEL_EXPORTER_OTLP_TIMEOUT"))
        {
            None => Duration::from_secs(10),
            Some(ms) => Duration::from_millis(
                ms.parse()
                    .map_err(|_| TelemetryError::Timeout(ms.clone()))?,
            ),
        };
        let certificate = var("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE")
            .or_else(|| var("OTEL_EXPORTER_OTLP_CERTIFICATE"))
            .map(std::path::PathBuf::from);
        Ok(Some(Otlp {
            certificate,
            endpoint,
            service_name: var("OTEL_SERVICE_NAME").unwrap_or_else(|| service.name.into()),
            service_version: service.version.into(),
            timeout,
        }))
    }
}

/// What to set up.
#[derive(Clone, Debug)]
pub struct Settings {
    pub format: LogFormat,
    /// An `EnvFilter` directive (`info`, `debug,kube=info` ...).
    pub filter: String,
    pub otlp: Option<Otlp>,
}

/// The installed telemetry; `shutdown` flushes the traces still buffered.
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }

    /// Exports what is buffered and stops the exporter. Waits at most `timeout`.
    pub async fn shutdown(self, timeout: Duration) {
        let Some(provider) = self.provider else {
            return;
        };
        // The SDK blocks the calling thread until the exporter task answers: not on a runtime
        // worker.
        let flush = tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(timeout));
        match tokio::time::timeout(timeout + Duration::from_secs(1), flush).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(error))) => tracing::warn!(%error, "could not flush the traces"),
            Ok(Err(_)) | Err(_) => tracing::warn!("could not flush the traces in time"),
        }
    }
}

/// Builds the subscriber (to install with `set_global_default` or use in a test). Must run
/// inside a Tokio runtime when `otlp` is set: the exporter is a task of it.
pub fn subscriber(
    settings: &Settings,
) -> Result<(impl Subscriber + Send + Sync + 'static, Telemetry), TelemetryError> {
    let filter = || {
        EnvFilter::builder()
            .parse(&settings.filter)
            .map_err(|e| TelemetryError::Level {
                filter: settings.filter.clone(),
                reason: e.to_string(),
            })
    };
    let fmt = match settings.format {
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .event_format(JsonLines)
            .with_filter(filter()?)
            .boxed(),
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_ansi(false)
            .with_filter(filter()?)
            .boxed(),
    };
    let (otel, provider) = match &settings.otlp {
        None => (None, None),
        Some(otlp) => {
            let (layer, provider) = otel_layer(otlp)?;
            (Some(layer), Some(provider))
        }
    };
    let subscriber = Registry::default()
        .with(SpanFields.with_filter(filter()?))
        .with(fmt)
        .with(otel);
    Ok((subscriber, Telemetry { provider }))
}

/// Installs the subscriber for the whole process.
pub fn init(settings: &Settings) -> Result<Telemetry, TelemetryError> {
    let (subscriber, telemetry) = subscriber(settings)?;
    tracing::subscriber::set_global_default(subscriber)
        .map_err(|e| TelemetryError::Install(e.to_string()))?;
    Ok(telemetry)
}

fn otel_layer<S>(
    otlp: &Otlp,
) -> Result<(impl Layer<S> + Send + Sync, SdkTracerProvider), TelemetryError>
where
    S: Subscriber + for<'a> LookupSpan<'a> + Send + Sync,
{
    use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
    let client = opentelemetry_http::hyper::HyperClient::new(connector(otlp)?, otlp.timeout, None);
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(client)
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .with_endpoint(otlp.endpoint.clone())
        .with_timeout(otlp.timeout)
        .build()
        .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
    let processor =
        opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor::builder(
            exporter,
            opentelemetry_sdk::runtime::Tokio,
        )
        .build();
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(otlp.service_name.clone())
        .with_attribute(opentelemetry::KeyValue::new(
            "service.version",
            otlp.service_version.clone(),
        ))
        .build();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_resource(resource)
        .build();
    let tracer = provider.tracer(env!("CARGO_PKG_NAME"));
    // Spans at info and above (the reconciles), the Kubernetes client's request spans when they
    // happen inside one of those (not the long watches), and warnings as span events. kube's own
    // "reconciling object" span is left out: the instrumented reconcile is the root.
    let filter = dynamic_filter_fn(|meta, cx: &Context<'_, S>| {
        if meta.is_event() {
            return *meta.level() <= Level::WARN;
        }
        if meta.target().starts_with("kube_runtime") {
            return false;
        }
        *meta.level() <= Level::INFO
            || (meta.target().starts_with("kube_client") && cx.lookup_current().is_some())
    });
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(filter);
    Ok((layer, provider))
}

/// The connection to the collector: plain TCP for `http://`, where no certificate is read (the
/// image has no CA files, and a missing store must not stop an operator that never uses it); TLS
/// for `https://`, trusting [`https_roots`].
fn connector(
    otlp: &Otlp,
) -> Result<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    TelemetryError,
> {
    let https = url::Url::parse(&otlp.endpoint).is_ok_and(|url| url.scheme() == "https");
    let roots = if https {
        https_roots(otlp.certificate.as_deref())?
    } else {
        rustls::RootCertStore::empty()
    };
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| TelemetryError::Exporter(format!("TLS: {e}")))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config)
        .https_or_http()
        .enable_http1()
        .build())
}

/// The CAs an `https://` collector is verified against: only those of `certificate` when set,
/// else [`crate::trust::default_roots`].
fn https_roots(
    certificate: Option<&std::path::Path>,
) -> Result<rustls::RootCertStore, TelemetryError> {
    use rustls::pki_types::{pem::PemObject, CertificateDer};
    let Some(path) = certificate else {
        let mut roots = rustls::RootCertStore::empty();
        roots.add_parsable_certificates(
            crate::trust::default_roots().map_err(|e| TelemetryError::Roots(e.to_string()))?,
        );
        return Ok(roots);
    };
    let unreadable = |e: &dyn std::fmt::Display| TelemetryError::Certificate {
        path: path.to_path_buf(),
        reason: e.to_string(),
    };
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(path).map_err(|e| unreadable(&e))? {
        roots
            .add(cert.map_err(|e| unreadable(&e))?)
            .map_err(|e| unreadable(&e))?;
    }
    if roots.is_empty() {
        return Err(unreadable(&"no certificate in the file"));
    }
    Ok(roots)
}

/// The trace id for a span: the OpenTelemetry one when traces are exported, a fresh random one
/// otherwise (so log lines of one reconcile still share an id).
pub fn trace_id(span: &Span) -> String {
    let context = span.context();
    let otel = context.span().span_context().trace_id();
    if otel != opentelemetry::trace::TraceId::INVALID {
        otel.to_string()
    } else {
        RandomIdGenerator::default().new_trace_id().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    const SERVICE: Service = Service {
        name: "test-service",
        version: "1.2.3",
    };

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        }
    }

    #[test]
    fn no_endpoint_means_no_exporter() {
        assert_eq!(Otlp::from_env(SERVICE, env(&[])), Ok(None));
        assert_eq!(
            Otlp::from_env(SERVICE, env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")])),
            Ok(None)
        );
        let disabled = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_SDK_DISABLED", "true"),
        ];
        assert_eq!(Otlp::from_env(SERVICE, env(&disabled)), Ok(None));
        let none = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_TRACES_EXPORTER", "none"),
        ];
        assert_eq!(Otlp::from_env(SERVICE, env(&none)), Ok(None));
    }

    #[test]
    fn endpoints_follow_the_specification() {
        let base = Otlp::from_env(
            SERVICE,
            env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(base.endpoint, "http://collector:4318/v1/traces");
        assert_eq!(base.service_name, "test-service");
        assert_eq!(base.service_version, "1.2.3");
        assert_eq!(base.timeout, Duration::from_secs(10));
        let traces = Otlp::from_env(
            SERVICE,
            env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://ignored:4318"),
                (
                    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                    "http://collector:4318/custom",
                ),
                ("OTEL_SERVICE_NAME", "test-service-eu"),
                ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
            ]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(traces.endpoint, "http://collector:4318/custom");
        assert_eq!(traces.service_name, "test-service-eu");
        assert_eq!(traces.timeout, Duration::from_millis(2500));
    }

    #[test]
    fn unsupported_settings_are_clear_errors() {
        let grpc = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ];
        assert!(Otlp::from_env(SERVICE, env(&grpc))
            .unwrap_err()
            .to_string()
            .contains("`grpc` is not supported"));
        let ftp = [("OTEL_EXPORTER_OTLP_ENDPOINT", "ftp://c:4318")];
        assert!(Otlp::from_env(SERVICE, env(&ftp))
            .unwrap_err()
            .to_string()
            .contains("http:// or https://"));
        let bad = [("OTEL_EXPORTER_OTLP_ENDPOINT", "not a url")];
        assert!(Otlp::from_env(SERVICE, env(&bad))
            .unwrap_err()
            .to_string()
            .contains("not a URL"));
        let timeout = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "5s"),
        ];
        assert!(Otlp::from_env(SERVICE, env(&timeout))
            .unwrap_err()
            .to_string()
            .contains("milliseconds"));
    }

    #[test]
    fn https_trusts_the_built_in_and_system_roots_or_the_given_ca() {
        let tls = Otlp::from_env(
            SERVICE,
            env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector:4318"),
                ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/etc/otel/ca.pem"),
            ]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(tls.certificate, Some("/etc/otel/ca.pem".into()));

        let dir = tempfile::tempdir().unwrap();
        let missing = Otlp {
            certificate: Some(dir.path().join("missing.pem")),
            ..tls.clone()
        };
        let Err(error) = connector(&missing).map_err(|e| e.to_string()) else {
            panic!("a missing CA file must fail");
        };
        assert!(
            error.starts_with("OTEL_EXPORTER_OTLP_CERTIFICATE `"),
            "{error}"
        );
        let empty_file = dir.path().join("empty.pem");
        std::fs::write(&empty_file, "not a certificate\n").unwrap();
        let empty = Otlp {
            certificate: Some(empty_file),
            ..tls.clone()
        };
        assert!(connector(&empty)
            .err()
            .unwrap()
            .to_string()
            .contains("no certificate"));
        // `http://` reads no certificate at all: not even a CA file named by mistake.
        let plain = Otlp {
            endpoint: "http://collector:4318/v1/traces".into(),
            certificate: Some(dir.path().join("missing.pem")),
            ..tls.clone()
        };
        assert!(connector(&plain).is_ok());
        // Without a CA file, Mozilla's roots are there whatever the machine has.
        let builtin = https_roots(None).unwrap();
        assert!(builtin.len() >= webpki_root_certs::TLS_SERVER_ROOT_CERTS.len());
        // A real CA bundle, when the machine has one.
        let bundle = std::path::Path::new("/etc/ssl/certs/ca-certificates.crt");
        if bundle.exists() {
            let system = Otlp {
                certificate: Some(bundle.into()),
                ..tls
            };
            assert!(connector(&system).is_ok());
        }
    }

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().write(buf)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn json_lines_carry_the_fields_of_their_spans() {
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = Registry::default().with(SpanFields).with(
            tracing_subscriber::fmt::layer()
                .event_format(JsonLines)
                .with_writer(move || writer.clone()),
        );
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(answer = 42, "outside");
            let span =
                tracing::info_span!("reconcile", name = "a", trace_id = tracing::field::Empty);
            span.record("trace_id", "0af7651916cd43dd8448eb211c80319c");
            span.in_scope(|| {
                tracing::info_span!("inner", name = "b").in_scope(|| tracing::warn!("inside"));
            });
        });
        let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert_eq!(lines[0]["msg"], "outside");
        assert_eq!(lines[0]["answer"], 42);
        assert_eq!(lines[0]["level"], "INFO");
        assert!(lines[0].get("trace_id").is_none());
        assert_eq!(lines[1]["msg"], "inside");
        assert_eq!(lines[1]["level"], "WARN");
        assert_eq!(lines[1]["trace_id"], "0af7651916cd43dd8448eb211c80319c");
        assert_eq!(lines[1]["name"], "b", "the inner span wins");
        assert_eq!(lines[1]["span"], "reconcile:inner");
        assert!(lines[1]["ts"].as_str().unwrap().ends_with('Z'));
    }

    #[test]
    fn without_an_exporter_trace_ids_are_random_and_valid() {
        let subscriber = Registry::default().with(SpanFields);
        tracing::subscriber::with_default(subscriber, || {
            let a = trace_id(&tracing::info_span!("a"));
            let b = trace_id(&tracing::info_span!("b"));
            assert_eq!(a.len(), 32);
            assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
            assert_ne!(a, b);
        });
    }

    #[test]
    fn a_bad_level_is_a_clear_error() {
        let settings = Settings {
            format: LogFormat::Text,
            filter: "info,=,[".into(),
            otlp: None,
        };
        let error = subscriber(&settings).err().expect("must fail").to_string();
        assert!(error.starts_with("invalid log level"), "{error}");
    }
}
