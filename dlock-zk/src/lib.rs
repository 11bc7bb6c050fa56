//! ZooKeeper backend for dlock (in progress).
