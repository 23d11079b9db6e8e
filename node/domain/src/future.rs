//! The boxed future that object-safe async traits (the ports between layers) return.

use std::{future::Future, pin::Pin};

/// A boxed, sendable future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;
