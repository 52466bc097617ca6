//! Weight memory the CPU backend owns (repacked matrices). On Linux it is an anonymous mapping
//! (zero-filled by the kernel, pages faulted in as they are written) 2 MiB-aligned and marked
//! for transparent huge pages before anything touches it, so that streaming a large matrix for
//! one token does not take a TLB miss every 4 KiB. With THP in `madvise` mode, the common
//! default, memory is only backed by huge pages where asked for.

/// A zero-initialised byte buffer of a fixed length.
pub struct WeightBuf {
    #[cfg(target_os = "linux")]
    map: (*mut u8, usize),
    ptr: *mut u8,
    len: usize,
    #[cfg(not(target_os = "linux"))]
    _vec: Vec<u8>,
}

// SAFETY: memory owned by this value alone; `&WeightBuf` only gives `&[u8]`.
unsafe impl Send for WeightBuf {}
unsafe impl Sync for WeightBuf {}

#[cfg(target_os = "linux")]
const HUGE: usize = 2 << 20;

impl WeightBuf {
    #[cfg(target_os = "linux")]
    pub fn zeroed(len: usize) -> WeightBuf {
        let size = len.max(1).next_multiple_of(HUGE) + HUGE;
        // SAFETY: a fresh private anonymous mapping; nothing else refers to it.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            // Out of address space or memory: the same failure as a refused allocation.
            std::alloc::handle_alloc_error(std::alloc::Layout::from_size_align(size, HUGE).expect("layout"));
        }
        let base = base as *mut u8;
        let ptr = base.wrapping_add(base.align_offset(HUGE));
        // SAFETY: the range lies in the mapping; MADV_HUGEPAGE only changes how it is backed (an
        // error, e.g. THP disabled, leaves it as it was).
        unsafe { libc::madvise(ptr as *mut libc::c_void, size - HUGE, libc::MADV_HUGEPAGE) };
        WeightBuf {
            map: (base, size),
            ptr,
            len,
        }
    }

    #[cfg(not(target_os = "linux"))]
    pub fn zeroed(len: usize) -> WeightBuf {
        let mut v = vec![0u8; len];
        WeightBuf {
            ptr: v.as_mut_ptr(),
            len,
            _vec: v,
        }
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `len` bytes of the buffer, zero-initialised or written since.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

#[cfg(target_os = "linux")]
impl Drop for WeightBuf {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `zeroed`, unmapped once.
        unsafe { libc::munmap(self.map.0 as *mut libc::c_void, self.map.1) };
    }
}
