//! The mock's counters of host waits and allocations, named: what a steady step must not raise
//! (issue 16). Shared by `tests/allocator.rs` (through `common`) and `benches/async_step.rs`
//! (which includes this file by path).
#![allow(dead_code)]

use ascend::mock::MockStats;

/// How to read one counter from a snapshot.
pub type Counter = fn(&MockStats) -> u64;

/// Each counter's name and how to read it.
pub const HOST_WAITS_AND_ALLOCATIONS: [(&str, Counter); 7] = [
    ("stream syncs", |s| s.stream_synchronizes),
    ("event syncs", |s| s.event_synchronizes),
    ("device syncs", |s| s.device_synchronizes),
    ("aclrtMalloc", |s| s.device_mallocs),
    ("aclrtFree", |s| s.device_frees),
    ("blocking copies", |s| s.blocking_copies),
    ("aclrtMallocHost", |s| s.host_mallocs),
];
