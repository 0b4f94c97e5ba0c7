fn main() {
    let arch = std::env::args().nth(1).unwrap_or("sm_80".into());
    let v = flashsel::cuda::compile::Variant { arch: Box::leak(arch.into_boxed_str()), block: 512, global_buffer: false };
    let c = flashsel::cuda::compile::compile(&v).unwrap();
    println!("{}", c.log);
}
