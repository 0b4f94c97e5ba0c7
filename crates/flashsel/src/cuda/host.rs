//! Host-side views of the plain element types the device buffers hold
//! (f32, bf16, f16, e4m3, i32, u8: no padding, every bit pattern valid), for
//! the host forms that upload a request and download its result, and the
//! device buffers those host forms use.

use cudarc::driver::{CudaSlice, DevicePtr};

use super::CudaEngine;
use crate::contract::error::cuda_err;
use crate::contract::{DType, Result};

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

/// A device copy of `bytes` on the engine's stream (256 zero bytes when
/// empty, so that every buffer has an address).
pub(crate) fn upload(e: &CudaEngine, bytes: &[u8]) -> Result<CudaSlice<u8>> {
    if bytes.is_empty() {
        return e.stream().alloc_zeros(256).map_err(cuda_err);
    }
    e.stream().clone_htod(bytes).map_err(cuda_err)
}

/// `bytes` (at least 256) of zeroed device memory.
pub(crate) fn alloc(e: &CudaEngine, bytes: usize) -> Result<CudaSlice<u8>> {
    e.stream().alloc_zeros(bytes.max(256)).map_err(cuda_err)
}

/// The `CUdeviceptr` of a buffer.
pub(crate) fn ptr(e: &CudaEngine, s: &CudaSlice<u8>) -> u64 {
    s.device_ptr(e.stream()).0
}

/// The first `n` elements of a downloaded f32 or bf16 buffer, as f32
/// (exact).
pub(crate) fn widen_f32(bytes: &[u8], dtype: DType, n: usize) -> Vec<f32> {
    match dtype {
        DType::BF16 => elems_of::<half::bf16>(bytes, n).into_iter().map(|b| b.to_f32()).collect(),
        _ => elems_of::<f32>(bytes, n),
    }
}
