//! The programs are the `observer-ebpf` binary for `bpfel-unknown-none` (main.rs); this empty
//! library lets the host build (observer-user's build dependency, which aya-build locates the
//! crate through) compile without the BPF-only dependencies.
#![no_std]
#![allow(unused_crate_dependencies)]
