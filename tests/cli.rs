//! End-to-end tests of the `hubnorm` binary.
mod common;
