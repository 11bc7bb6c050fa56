//! The auto-trait bounds users rely on, checked at compile time: leases and lockers move
//! between tasks, and the futures of `acquire` and `with_lock` can be spawned.

use std::future::Future;
use std::sync::Arc;

use dlock::{with_lock, Lease, LeaseHandle, LockError, LockName, LockOptions, Locker};

fn send_sync_static<T: Send + Sync + 'static>() {}

fn spawnable<F: Future + Send + 'static>(future: F) -> F {
    future
}

#[test]
fn leases_and_lockers_are_send_sync_and_static() {
    send_sync_static::<Lease>();
    send_sync_static::<LeaseHandle>();
    send_sync_static::<Arc<dyn Locker>>();
    send_sync_static::<LockError>();
}

#[test]
fn acquire_and_with_lock_futures_can_be_spawned() {
    // Only built, never polled: the test is that this compiles.
    fn futures(locker: Arc<dyn Locker>) {
        let name = LockName::new("bounds").unwrap();
        let opts = LockOptions::new();
        {
            let (locker, name, opts) = (locker.clone(), name.clone(), opts.clone());
            drop(spawnable(async move { locker.acquire(&name, &opts).await }));
        }
        {
            let (locker, name, opts) = (locker.clone(), name.clone(), opts.clone());
            drop(spawnable(async move { locker.try_acquire(&name, &opts).await }));
        }
        drop(spawnable(async move { with_lock(&*locker, &name, &opts, |_handle| async { 42 }).await }));
    }
    let _ = futures;
}
