//! Front lines that answer some requests before PostgreSQL is asked. PostgreSQL stays the
//! source of truth: a front line can only save work, never decide a key on its own.

pub(crate) mod redis;
