//! The process allocator: mimalloc, called the way `malloc` is wherever a layout allows.
//!
//! The `mimalloc` crate sends every allocation through `mi_malloc_aligned`. In mimalloc 3 that
//! entry point serves a block whose rounded size is not a power of two by over-allocating and
//! aligning inside it, even at alignment 1: each 8 KiB read buffer an HTTP/1.1 connection
//! allocates per message took about 400 instructions there. `mi_malloc` already aligns a block
//! as `malloc` must (to 16 bytes, or to the largest power of two not above a smaller size), so
//! a layout within that guarantee takes the plain entry point, as the standard library's own
//! `System` allocator does with `malloc`; only a larger alignment goes to the aligned one.
#![allow(unsafe_code)]

use libmimalloc_sys as mi;
use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

/// What `mi_malloc` guarantees for a block of at least this size (`MI_MAX_ALIGN_SIZE`).
const PLAIN_ALIGN: usize = 16;

/// Whether `mi_malloc`'s own alignment satisfies `align` for a block of `size` bytes.
#[inline]
fn plain(align: usize, size: usize) -> bool {
    align <= PLAIN_ALIGN && align <= size
}

/// mimalloc as the global allocator: `#[global_allocator] static A: Mimalloc = Mimalloc;`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Mimalloc;

// SAFETY: every block comes from mimalloc, which returns null on failure, aligns as asked
// (plainly only where `plain` holds, see above) and frees blocks from either entry point
// with `mi_free`.
unsafe impl GlobalAlloc for Mimalloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let (size, align) = (layout.size(), layout.align());
        // SAFETY: no preconditions beyond a power-of-two alignment, which `Layout` ensures.
        unsafe {
            if plain(align, size) {
                mi::mi_malloc(size).cast()
            } else {
                mi::mi_malloc_aligned(size, align).cast()
            }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let (size, align) = (layout.size(), layout.align());
        // SAFETY: as `alloc`.
        unsafe {
            if plain(align, size) {
                mi::mi_zalloc(size).cast()
            } else {
                mi::mi_zalloc_aligned(size, align).cast()
            }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from this allocator (the caller's contract).
        unsafe { mi::mi_free(ptr.cast::<c_void>()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let align = layout.align();
        // SAFETY: `ptr` came from this allocator with `layout` (the caller's contract); the
        // block keeps `align` whichever entry point resizes it.
        unsafe {
            if plain(align, new_size) {
                mi::mi_realloc(ptr.cast::<c_void>(), new_size).cast()
            } else {
                mi::mi_realloc_aligned(ptr.cast::<c_void>(), new_size, align).cast()
            }
        }
    }
}

/// Hands memory freed so far back to the OS now instead of after the allocator's purge delay.
/// Worth its few milliseconds after a large structure has been dropped, off any request path.
pub fn release_freed() {
    // SAFETY: mi_collect has no preconditions; it only walks the allocator's own structures.
    unsafe { mi::mi_collect(true) }
}
