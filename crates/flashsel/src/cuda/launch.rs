//! The one typed kernel launch every operation goes through.
//!
//! A kernel takes a single parameter block, a `#[repr(C)]` struct mirrored
//! from its `.cu` source ([`KernelParams`]); [`Launch`] carries the geometry
//! and the two launch attributes the kernels rely on:
//! - `programmatic` (programmatic stream serialisation, sm_90+): the kernel
//!   may start before the stream's previous kernel has finished, so it must
//!   execute `griddepcontrol.wait` before it reads what that kernel wrote;
//! - `cooperative`: every CTA resident at once, or the launch fails (kernels
//!   whose CTAs wait on each other);
//! - `cluster`: CTAs launched as thread-block clusters of that many along x
//!   (sm_90+: kernels that read each other's shared memory).

use std::ffi::c_void;

use cudarc::driver::{sys, CudaFunction};

use crate::contract::error::driver_error;
use crate::contract::Result;

/// A kernel parameter block.
///
/// # Safety
/// The type must be `#[repr(C)]` with exactly the layout of the kernel's
/// parameter struct (each implementor asserts its size and offsets in a test
/// and the kernel source asserts its size).
pub(crate) unsafe trait KernelParams: Copy {}

/// The geometry and attributes of one launch.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Launch {
    pub grid: (u32, u32),
    pub block: u32,
    /// Dynamic shared memory, bytes.
    pub smem: u32,
    /// The `CUstream` (0: the legacy default stream).
    pub stream: u64,
    pub programmatic: bool,
    pub cooperative: bool,
    /// CTAs a thread-block cluster along x (sm_90+; 0 or 1: no cluster).
    pub cluster: u32,
}

pub(crate) fn check(r: sys::CUresult, what: &str) -> Result<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(driver_error(what, r))
    }
}

impl Launch {
    /// Launches `f` with `params`.
    ///
    /// # Safety
    /// `f` takes exactly a `P`; every pointer in `params` is a live device
    /// allocation of the size the kernel reads or writes, in the context of
    /// `self.stream`; with `programmatic`, the kernel waits as the module
    /// docs say.
    pub(crate) unsafe fn run<P: KernelParams>(&self, f: &CudaFunction, params: &P) -> Result<()> {
        let mut param = params as *const P as *mut c_void;
        let args = &mut param as *mut *mut c_void;
        let mut attrs: [sys::CUlaunchAttribute; 3] = std::mem::zeroed();
        let mut n = 0;
        if self.programmatic {
            attrs[n].id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
            attrs[n].value.programmaticStreamSerializationAllowed = 1;
            n += 1;
        }
        if self.cooperative {
            attrs[n].id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
            attrs[n].value.cooperative = 1;
            n += 1;
        }
        if self.cluster > 1 {
            attrs[n].id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
            attrs[n].value.clusterDim.x = self.cluster;
            attrs[n].value.clusterDim.y = 1;
            attrs[n].value.clusterDim.z = 1;
            n += 1;
        }
        let config = sys::CUlaunchConfig {
            gridDimX: self.grid.0,
            gridDimY: self.grid.1,
            gridDimZ: 1,
            blockDimX: self.block,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: self.smem,
            hStream: self.stream as sys::CUstream,
            attrs: attrs.as_mut_ptr(),
            numAttrs: n as u32,
        };
        check(sys::cuLaunchKernelEx(&config, f.cu_function(), args, std::ptr::null_mut()), "cuLaunchKernelEx")
    }
}

/// Fills `bytes` bytes at device address `ptr` with `byte` on `stream`
/// (outputs and workspaces are poisoned before a checked run).
///
/// # Safety
/// `ptr .. ptr + bytes` must lie in a live allocation of `stream`'s context.
pub(crate) unsafe fn poison(ptr: u64, byte: u8, bytes: usize, stream: sys::CUstream) -> Result<()> {
    check(sys::cuMemsetD8Async(ptr, byte, bytes, stream), "cuMemsetD8Async")
}
