//! What the [`Inbox`](super::Inbox) answers: the message's [`Outcome`], or the
//! [`InboxError`] that stopped it.

use std::fmt;

use crate::engine::key::KeyError;

/// What [`Inbox::process`](super::Inbox::process) did with a message: the record's states as a consumer sees them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome<T> {
    /// The work ran and committed together with the consume record.
    Processed(T),
    /// The message was processed before (a redelivery or a republished duplicate); the
    /// work did not run.
    Duplicate {
        /// Attempts it took the first time.
        attempts: u32,
    },
    /// The message failed `max_attempts` times; the work did not run again. Dead-letter it.
    GaveUp {
        /// Failed attempts so far.
        attempts: u32,
        /// The error of the last attempt.
        last_error: Option<String>,
    },
}

/// Why [`Inbox::process`](super::Inbox::process) did not finish a message. The consumer requeues it: either nothing
/// of the work was committed, or (a [`Store`](Self::Store) error whose COMMIT answer was
/// lost) it was, and the redelivery reports a duplicate — never a second run.
#[derive(Debug)]
#[non_exhaustive]
pub enum InboxError<E> {
    /// The message id is empty, too long, or not printable ASCII.
    InvalidMessageId(KeyError),
    /// Another worker is processing the same message and did not finish within the lock
    /// timeout.
    Busy,
    /// The database could not be reached, or the commit failed or went unanswered.
    Store(crate::engine::error::Error),
    /// The work returned an error; it was rolled back and the attempt recorded.
    Failed {
        /// Failed attempts so far, this one included.
        attempts: u32,
        /// The work's error.
        error: E,
    },
    /// The work panicked; it was rolled back and the attempt recorded.
    Panicked {
        /// Failed attempts so far, this one included.
        attempts: u32,
        /// The panic message.
        message: String,
    },
    /// The work kept its transaction handle after returning (moved into a spawned task);
    /// it was rolled back and the attempt recorded.
    TransactionLeaked,
}

impl<E: fmt::Display> fmt::Display for InboxError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidMessageId(e) => write!(f, "invalid message id: {e}"),
            Self::Busy => f.write_str("another worker is processing this message"),
            Self::Store(_) => f.write_str("the inbox store failed"),
            Self::Failed { attempts, error } => {
                write!(f, "processing failed (attempt {attempts}): {error}")
            }
            Self::Panicked { attempts, message } => {
                write!(f, "processing panicked (attempt {attempts}): {message}")
            }
            Self::TransactionLeaked => f.write_str(
                "the work kept its transaction handle after returning; it was rolled back",
            ),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for InboxError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::InvalidMessageId(e) => Some(e),
            Self::Store(e) => Some(e),
            Self::Failed { error, .. } => Some(error),
            _ => None,
        }
    }
}
