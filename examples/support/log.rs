//! The examples' log: `RUST_LOG` read as a list of `target=level` directives (a bare level
//! sets the default), `axum_idempotency=info` when unset.

use tracing_subscriber::filter::Targets;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Installs the log, written to `writer`; `ansi` colours it (for a terminal only, never a
/// redirected file).
pub(crate) fn init<W>(writer: W, ansi: bool)
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let default = || {
        "axum_idempotency=info"
            .parse::<Targets>()
            .expect("a valid filter")
    };
    let filter = match std::env::var("RUST_LOG") {
        Ok(directives) => directives.parse::<Targets>().unwrap_or_else(|error| {
            eprintln!(
                "RUST_LOG={directives:?} is not a list of target=level ({error}); using the default"
            );
            default()
        }),
        Err(_) => default(),
    };
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(writer)
                .with_ansi(ansi),
        )
        .with(filter)
        .init();
}
