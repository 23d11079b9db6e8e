//! Locks that survive a panic elsewhere.
//!
//! A panic while a lock is held poisons it; the data it guards is still consistent everywhere
//! the node uses these locks (each critical section leaves it whole), so the node goes on with
//! it rather than panicking in every later caller.

use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// `lock()` that recovers a poisoned mutex.
pub trait MutexExt<T> {
    /// Locks, taking the guard of a poisoned mutex as it is.
    fn lock_unpoisoned(&self) -> MutexGuard<'_, T>;
}

impl<T> MutexExt<T> for Mutex<T> {
    fn lock_unpoisoned(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// `read()` and `write()` that recover a poisoned lock.
pub trait RwLockExt<T> {
    /// Read-locks, taking the guard of a poisoned lock as it is.
    fn read_unpoisoned(&self) -> RwLockReadGuard<'_, T>;
    /// Write-locks, taking the guard of a poisoned lock as it is.
    fn write_unpoisoned(&self) -> RwLockWriteGuard<'_, T>;
}

impl<T> RwLockExt<T> for RwLock<T> {
    fn read_unpoisoned(&self) -> RwLockReadGuard<'_, T> {
        self.read().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write_unpoisoned(&self) -> RwLockWriteGuard<'_, T> {
        self.write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
