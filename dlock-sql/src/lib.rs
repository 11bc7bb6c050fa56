//! SQL backends for dlock: PostgreSQL, MySQL/MariaDB, SQLite (in progress).
