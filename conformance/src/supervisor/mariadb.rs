//! mariadb servers for the tests (see the module docs of `supervisor`).
