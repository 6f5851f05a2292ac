//! The allocator as a program uses it: installed as the global allocator, every layout comes
//! back aligned and usable, and resizing keeps both the contents and the alignment.
#![allow(unsafe_code)]

use cftunnel_alloc::Mimalloc;
use std::alloc::{alloc, alloc_zeroed, dealloc, realloc, Layout};

#[global_allocator]
static ALLOC: Mimalloc = Mimalloc;

const SIZES: &[usize] = &[
    1, 2, 3, 7, 8, 9, 15, 16, 17, 24, 31, 40, 48, 63, 64, 100, 1000, 1024, 4095, 4096, 8192, 8200,
    65_536, 100_000,
];
const ALIGNS: &[usize] = &[1, 2, 4, 8, 16, 32, 64, 128, 4096, 65_536];

fn fill(ptr: *mut u8, len: usize, seed: u8) {
    for i in 0..len {
        // SAFETY: `ptr` points to at least `len` writable bytes.
        unsafe { ptr.add(i).write(seed.wrapping_add(i as u8)) }
    }
}

fn holds(ptr: *const u8, len: usize, seed: u8) -> bool {
    // SAFETY: `ptr` points to at least `len` initialised bytes.
    (0..len).all(|i| unsafe { ptr.add(i).read() } == seed.wrapping_add(i as u8))
}

#[test]
fn every_layout_is_aligned_and_keeps_its_contents_through_realloc() {
    for &align in ALIGNS {
        for &size in SIZES {
            let Ok(layout) = Layout::from_size_align(size, align) else {
                continue;
            };
            // Many at once, so blocks come from the middle of pages as well as their starts.
            let blocks: Vec<*mut u8> = (0..16)
                .map(|n| {
                    // SAFETY: the layout has a non-zero size.
                    let p = unsafe { alloc(layout) };
                    assert!(!p.is_null(), "{size} bytes at {align}");
                    assert_eq!(p as usize % align, 0, "{size} bytes at {align}");
                    fill(p, size, n);
                    p
                })
                .collect();
            for (n, &p) in blocks.iter().enumerate() {
                let seed = n as u8;
                assert!(holds(p, size, seed), "{size} bytes at {align}");
                // Grown, then shrunk below the original size.
                let (grown, shrunk) = (size * 3 + 5, size / 2 + 1);
                // SAFETY: `p` came from `alloc(layout)`; the new size is non-zero.
                let q = unsafe { realloc(p, layout, grown) };
                assert!(!q.is_null());
                assert_eq!(q as usize % align, 0, "{size} → {grown} at {align}");
                assert!(holds(q, size, seed), "{size} → {grown} at {align}");
                let grown_layout = Layout::from_size_align(grown, align).expect("layout");
                // SAFETY: `q` holds `grown` bytes at `align`; the new size is non-zero.
                let r = unsafe { realloc(q, grown_layout, shrunk) };
                assert!(!r.is_null());
                assert_eq!(r as usize % align, 0, "{grown} → {shrunk} at {align}");
                assert!(holds(r, shrunk, seed), "{grown} → {shrunk} at {align}");
                let shrunk_layout = Layout::from_size_align(shrunk, align).expect("layout");
                // SAFETY: `r` holds `shrunk` bytes at `align`.
                unsafe { dealloc(r, shrunk_layout) };
            }
        }
    }
}

#[test]
fn zeroed_blocks_are_zero_and_aligned() {
    for &align in ALIGNS {
        for &size in SIZES {
            let Ok(layout) = Layout::from_size_align(size, align) else {
                continue;
            };
            // Dirty a block of the same layout first, so a reused one would show.
            // SAFETY: non-zero size.
            let dirty = unsafe { alloc(layout) };
            fill(dirty, size, 0xA5);
            // SAFETY: `dirty` came from `alloc(layout)`.
            unsafe { dealloc(dirty, layout) };
            // SAFETY: non-zero size.
            let p = unsafe { alloc_zeroed(layout) };
            assert!(!p.is_null());
            assert_eq!(p as usize % align, 0, "{size} bytes at {align}");
            // SAFETY: `p` points to `size` initialised (zeroed) bytes.
            assert!((0..size).all(|i| unsafe { p.add(i).read() } == 0));
            // SAFETY: `p` came from `alloc_zeroed(layout)`.
            unsafe { dealloc(p, layout) };
        }
    }
}

#[test]
fn collections_and_freed_memory_behave_under_it() {
    let mut v: Vec<String> = (0..10_000).map(|i| format!("value {i}")).collect();
    v.retain(|s| s.ends_with('0'));
    let joined = v.join(",");
    drop(v);
    cftunnel_alloc::release_freed();
    assert_eq!(joined.split(',').count(), 1_000);
    assert!(joined.starts_with("value 0,value 10,"));
    assert!(joined.ends_with(",value 9990"));
}
