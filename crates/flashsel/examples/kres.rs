//! Prints the NVRTC/ptxas log of one variant: `kres ARCH [DEFINES] [CUBIN_OUT]`
//! (with CUBIN_OUT, also writes the cubin there, for `nvdisasm`).
fn main() {
    let arch = std::env::args().nth(1).unwrap_or("sm_90a".into());
    let defines = std::env::args().nth(2).unwrap_or_default();
    let v = flashsel::cuda::compile::Variant {
        defines,
        ..flashsel::cuda::compile::Variant::new(Box::leak(arch.into_boxed_str()), false)
    };
    let c = flashsel::cuda::compile::compile(&v).unwrap();
    println!("{}", c.log);
    if let Some(path) = std::env::args().nth(3) {
        std::fs::write(&path, &c.cubin).unwrap();
    }
}
