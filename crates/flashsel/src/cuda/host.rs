//! Host-side views of the plain element types the device buffers hold
//! (f32, bf16, f16, e4m3, i32, u8: no padding, every bit pattern valid), for
//! the host forms that upload a request and download its result.

/// The bytes of a slice of plain elements.
pub(crate) fn bytes_of<T: Copy>(x: &[T]) -> &[u8] {
    // SAFETY: the element types are plain bits without padding: every byte is
    // initialised; the length is the slice's size in bytes.
    unsafe { std::slice::from_raw_parts(x.as_ptr() as *const u8, std::mem::size_of_val(x)) }
}

/// The first `n` elements stored in `raw` (a downloaded buffer of them).
pub(crate) fn elems_of<T: Copy>(raw: &[u8], n: usize) -> Vec<T> {
    let elem = std::mem::size_of::<T>();
    assert!(raw.len() >= n * elem, "elems_of: {} bytes for {n} elements of {elem}", raw.len());
    (0..n)
        // SAFETY: in bounds (above); T is a plain element type, any bits valid.
        .map(|j| unsafe { std::ptr::read_unaligned(raw[j * elem..].as_ptr() as *const T) })
        .collect()
}
