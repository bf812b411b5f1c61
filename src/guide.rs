//! Guides: the depth behind the crate's front page, one topic per module. They hold
//! documentation only; every code block in them is compiled as a doctest.
//!
//! | guide | read it for |
//! | --- | --- |
//! | [`atomic`] | atomic mode ([`IdempotentTx`](crate::IdempotentTx)): choosing a driver, configuration, the request flow, status codes, the store policy, derived keys, every guarantee and its limits, measured cost |
//! | [`lease`] | lease mode ([`IdempotentLease`](crate::IdempotentLease)) for side effects outside the database: the state machine, fencing tokens, recording the handler's result in the database |
//! | [`inbox`] | the [`Inbox`](crate::Inbox) for message consumers: duplicates, failures, dead-lettering |
//! | [`outbox`] | the transactional outbox: enqueueing in the handler's transaction, the relay, RabbitMQ, ordering, what is guaranteed, scheduled jobs |
//! | [`rabbitmq_cluster`] | running with a RabbitMQ cluster: quorum queues, what a confirm guarantees, several addresses, a node failure step by step, why the Inbox is still required, `x-delivery-limit` and `max_attempts` |
//! | [`operations`] | running it: supported Rust and PostgreSQL versions, the schema and migrations (with your own migration tool, in a schema of your own), several instances behind a load balancer, the sweeper, the admin API, metrics, the caches and the Redis front line, hot keys, PgBouncer, scaling |
//! | [`monitoring`] | the Grafana dashboard and Prometheus alerts shipped in `monitoring/`: wiring the recorder, importing the dashboard, loading the rules, and a runbook for every alert |
//! | `console` (module `guide::console`, with the feature) | the troubleshooting console (feature `console`): mounting it behind your auth, its pages and actions, CSRF and CSP, the index behind every list |
//! | [`security`] | scopes, what is stored and what is not, encryption at rest, TLS to PostgreSQL |

#[doc = include_str!("../docs/atomic.md")]
pub mod atomic {}

#[doc = include_str!("../docs/lease.md")]
pub mod lease {}

#[doc = include_str!("../docs/inbox.md")]
pub mod inbox {}

#[doc = include_str!("../docs/outbox.md")]
pub mod outbox {}

#[doc = include_str!("../docs/rabbitmq_cluster.md")]
pub mod rabbitmq_cluster {}

#[doc = include_str!("../docs/operations.md")]
pub mod operations {}

#[doc = include_str!("../docs/monitoring.md")]
pub mod monitoring {}

#[cfg(feature = "console")]
#[cfg_attr(docsrs, doc(cfg(feature = "console")))]
#[doc = include_str!("../docs/console.md")]
pub mod console {}

#[doc = include_str!("../docs/security.md")]
pub mod security {}
