//! etcd backend for dlock (in progress).
