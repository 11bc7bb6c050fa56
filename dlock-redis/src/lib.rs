//! Redis backend for dlock: single instance with watchdog renewal, Cluster, Sentinel, and RedLock (in progress).
