//! Logs: JSON lines (the in-cluster default) or text, level from a flag or `RUST_LOG`; every
//! line inside a span that carries a `trace_id` field carries it too.

use serde_json::{Map, Value};
use std::fmt;
use tracing::field::{Field, Visit};
use tracing::Subscriber;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// The default log filter: the operator at info, the Kubernetes client only when it warns.
pub const DEFAULT_LOG_FILTER: &str = "info,kube=warn,kube_client=warn,kube_runtime=warn";

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One JSON object per line (for log collectors).
    Json,
    /// Human-readable lines (`console`, zap's name, is accepted too).
    #[value(alias = "console")]
    Text,
}

impl LogFormat {
    /// JSON inside a cluster (where a collector reads the lines), text on a terminal.
    pub fn default_for_environment() -> LogFormat {
        if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() {
            LogFormat::Json
        } else {
            LogFormat::Text
        }
    }
}

/// Span fields as JSON, kept in the span's extensions so each log line can carry the fields of
/// the spans it is in (`trace_id`, `controller`, `name` ...).
pub struct SpanFields;

struct FieldMap(Map<String, Value>);

impl<S> Layer<S> for SpanFields
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: Context<'_, S>,
    ) {
        let mut fields = JsonVisitor(Map::new());
        attrs.record(&mut fields);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(FieldMap(fields.0));
        }
    }

    fn on_record(
        &self,
        id: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        ctx: Context<'_, S>,
    ) {
        let Some(span) = ctx.span(id) else { return };
        let mut extensions = span.extensions_mut();
        if let Some(FieldMap(map)) = extensions.get_mut::<FieldMap>() {
            let mut fields = JsonVisitor(std::mem::take(map));
            values.record(&mut fields);
            *map = fields.0;
        }
    }
}

struct JsonVisitor(Map<String, Value>);

impl Visit for JsonVisitor {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.0.insert(field.name().into(), value.to_string().into());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().into(), format!("{value:?}").into());
    }
}

/// One JSON object per event: `ts`, `level`, `target`, `msg`, the fields of the enclosing spans
/// (outermost first, inner ones win), then the event's own fields.
///
/// Not tracing-subscriber's JSON format: it nests span fields under `span`/`spans`, while log
/// pipelines join a line to its trace by a top-level `trace_id` (and filter by `namespace` and
/// `name`), the contract the README documents.
pub struct JsonLines;

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let mut line = Map::new();
        line.insert("ts".into(), jiff::Timestamp::now().to_string().into());
        line.insert("level".into(), meta.level().as_str().into());
        line.insert("target".into(), meta.target().into());
        if let Some(scope) = ctx.event_scope() {
            let mut spans = Vec::new();
            for span in scope.from_root() {
                spans.push(span.name());
                if let Some(FieldMap(fields)) = span.extensions().get::<FieldMap>() {
                    line.extend(fields.iter().map(|(k, v)| (k.clone(), v.clone())));
                }
            }
            line.insert("span".into(), spans.join(":").into());
        }
        let mut fields = JsonVisitor(Map::new());
        event.record(&mut fields);
        if let Some(message) = fields.0.remove("message") {
            line.insert("msg".into(), message);
        }
        line.extend(fields.0);
        writeln!(writer, "{}", Value::Object(line))
    }
}
