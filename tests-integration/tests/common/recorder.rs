//! A metrics recorder for tests: `metrics::with_local_recorder(&Recorder(capture), ..)`
//! records every counter and gauge emitted on this thread into `capture`. Histograms are
//! dropped.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Records every counter and gauge by `name{label=value,...}`.
#[derive(Default)]
pub struct Capture(Mutex<HashMap<String, f64>>);

struct Handle {
    key: String,
    capture: Arc<Capture>,
}

impl Handle {
    fn update(&self, f: impl FnOnce(&mut f64)) {
        f(self
            .capture
            .0
            .lock()
            .unwrap()
            .entry(self.key.clone())
            .or_default());
    }
}

impl metrics::CounterFn for Handle {
    fn increment(&self, value: u64) {
        self.update(|v| *v += value as f64);
    }
    fn absolute(&self, value: u64) {
        self.update(|v| *v = value as f64);
    }
}

impl metrics::GaugeFn for Handle {
    fn increment(&self, value: f64) {
        self.update(|v| *v += value);
    }
    fn decrement(&self, value: f64) {
        self.update(|v| *v -= value);
    }
    fn set(&self, value: f64) {
        self.update(|v| *v = value);
    }
}

pub struct Recorder(pub Arc<Capture>);

impl Recorder {
    fn handle(&self, key: &metrics::Key) -> Arc<Handle> {
        let labels: Vec<_> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        Arc::new(Handle {
            key: format!("{}{{{}}}", key.name(), labels.join(",")),
            capture: Arc::clone(&self.0),
        })
    }
}

impl metrics::Recorder for Recorder {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        metrics::Counter::from_arc(self.handle(key))
    }
    fn register_gauge(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::from_arc(self.handle(key))
    }
    fn register_histogram(
        &self,
        _: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        metrics::Histogram::noop()
    }
}

impl Capture {
    /// Every value recorded so far, by `name{label=value,...}`.
    pub fn values(&self) -> HashMap<String, f64> {
        self.0.lock().unwrap().clone()
    }
}
