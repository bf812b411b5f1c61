//! Operating the crate's tables: [`Admin`](admin::Admin), the look-ups and repairs an
//! operator runs, and the [`Sweeper`](sweeper::Sweeper), the background task that purges
//! expired rows and reports stuck leases, and the [`ArchiveSink`](archive::ArchiveSink) it
//! can write purged records to.

pub(crate) mod admin;
pub(crate) mod archive;
#[cfg(feature = "console")]
pub(crate) mod console;
pub(crate) mod sweeper;
