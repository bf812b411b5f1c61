//! Guides: the depth behind the crate's front page, one topic per module. They hold
//! documentation only; every code block in them is compiled as a doctest.
//!
//! | guide | read it for |
//! | --- | --- |
//! | [`quickstarts`] | the quickstarts for PostgreSQL, MySQL/MariaDB and sqlx, the features, what each database relies on, the requirements, the repository's example service and tests |
//! | [`atomic`] | atomic mode ([`IdempotentTx`](crate::IdempotentTx)): choosing a driver, configuration, the request flow, status codes, the store policy, derived keys, every guarantee and its limits, measured cost |
//! | [`lease`] | lease mode ([`IdempotentLease`](crate::IdempotentLease)) for side effects outside the database: the state machine, fencing tokens, recording the handler's result in the database |
//! | [`inbox`] | the [`Inbox`](crate::Inbox) for message consumers: duplicates, failures, dead-lettering |
//! | [`outbox`] | the transactional outbox: enqueueing in the handler's transaction, the relay, RabbitMQ, ordering, what is guaranteed, scheduled jobs |
//! | [`rabbitmq_cluster`] | running with a RabbitMQ cluster: quorum queues, what a confirm guarantees, several addresses, a node failure step by step, why the Inbox is still required, `x-delivery-limit` and `max_attempts` |
//! | `client` (feature `client`) | calling an idempotent API: one key per intent, what to retry, the retrying `reqwest-middleware` middleware |
//! | `openapi` (feature `utoipa`) | declaring the contract in a utoipa OpenAPI document: the header, the problem responses and their codes, `Idempotent-Replayed` |
//! | [`gateway`] | `idempotency-gateway` (feature `gateway`): the same guarantees for services in any language, as a reverse proxy; every setting and every answer |
//! | [`operations`] | running it: supported Rust and PostgreSQL versions, the schema and migrations (with your own migration tool, in a schema of your own), several instances behind a load balancer, the sweeper, the admin API, metrics, the caches and the Redis front line, hot keys, PgBouncer, scaling, Galera |
//! | [`failover`] | running with a standby: a multi-host URL, what clients see during a failover, durability with synchronous and asynchronous replication |
//! | [`monitoring`] | the Grafana dashboard and Prometheus alerts shipped in `monitoring/`: wiring the recorder, importing the dashboard, loading the rules, and a runbook for every alert |
//! | `console` (feature `console`) | the troubleshooting console: mounting it behind your auth, its pages and actions, CSRF and CSP, the index behind every list |
//! | [`security`] | scopes, what is stored and what is not, encryption at rest, TLS to PostgreSQL |
//! | [`stability`] | what belongs to the API: the HTTP contract, metric names, the schema, the minimum Rust per feature, the public dependencies and their re-exports |
//! | [`design`] | why it is built this way, and what the alternatives cost when measured: the claim's shapes and round trips, lease mode's completion, the two drivers, where the time goes |
//! | [`architecture`] | for contributors: the module map, which part may import which, and the test that checks it |

#[doc = include_str!("../docs/quickstarts.md")]
pub mod quickstarts {}

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

#[cfg(feature = "client")]
#[cfg_attr(docsrs, doc(cfg(feature = "client")))]
#[doc = include_str!("../docs/client.md")]
pub mod client {}

#[cfg(feature = "utoipa")]
#[cfg_attr(docsrs, doc(cfg(feature = "utoipa")))]
#[doc = include_str!("../docs/openapi.md")]
pub mod openapi {}

#[doc = include_str!("../docs/gateway.md")]
pub mod gateway {}

#[doc = include_str!("../docs/operations.md")]
pub mod operations {}

#[doc = include_str!("../docs/failover.md")]
pub mod failover {}

#[doc = include_str!("../docs/monitoring.md")]
pub mod monitoring {}

#[cfg(feature = "console")]
#[cfg_attr(docsrs, doc(cfg(feature = "console")))]
#[doc = include_str!("../docs/console.md")]
pub mod console {}

#[doc = include_str!("../docs/security.md")]
pub mod security {}

#[doc = include_str!("../docs/stability.md")]
pub mod stability {}

#[doc = include_str!("../docs/design.md")]
pub mod design {}

#[doc = include_str!("../docs/architecture.md")]
pub mod architecture {}
