//! Keeping the resident set close to the live heap.
//!
//! A config push builds a whole new table while the old one still serves, then frees the old
//! one: tens of megabytes at 10,000 rules. The allocator (mimalloc) keeps freed pages for reuse
//! and, with transparent huge pages, backs its arenas with 2 MiB pages, so without help the
//! resident set ratchets up by a table's size on every push. Two measures keep it down: huge
//! pages are turned off for the process at start, and freed memory is handed back to the OS
//! right after a table is released.
#![allow(unsafe_code)]

/// Turns transparent huge pages off for this process (Linux; a no-op elsewhere).
pub fn disable_huge_pages() {
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_THP_DISABLE takes plain integer arguments and touches no memory of ours.
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
}

/// Returns memory freed so far to the OS now instead of after the allocator's purge delay.
/// Called after a large table has been dropped; costs a few milliseconds, off the request path.
pub fn release_freed() {
    cftunnel_alloc::release_freed();
}
