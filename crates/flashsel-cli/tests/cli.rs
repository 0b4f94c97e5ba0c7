//! The `flashsel` binary end to end: .npy files written and read back with
//! `npyz` (an independent implementation of the format), results compared with
//! `flashsel::reference_select`, and every error path checked for a clear
//! message and a non-zero status.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

use flashsel::{reference_select, NanPolicy, OutputOrder, ScoreElem, ScoresView};
use half::{bf16, f16};
use npyz::WriterBuilder;

// ---------------------------------------------------------------- helpers

/// A fresh directory under the system temp dir, removed on drop.
struct Tmp(PathBuf);

impl Tmp {
    fn new(name: &str) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "flashsel-cli-test-{}-{}-{name}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Tmp(dir)
    }
    fn path(&self, file: &str) -> PathBuf {
        self.0.join(file)
    }
}

impl Drop for Tmp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn flashsel(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flashsel")).args(args).output().expect("run flashsel")
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[track_caller]
fn assert_ok(o: &Output) {
    assert!(o.status.success(), "status {:?}\nstdout:\n{}\nstderr:\n{}", o.status, stdout(o), stderr(o));
}

/// Asserts a failure with status `code`, one `error:` line naming every piece.
#[track_caller]
fn assert_fails(o: &Output, code: i32, pieces: &[&str]) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(code), "stderr:\n{err}");
    assert!(err.starts_with("error: "), "stderr does not start with 'error: ':\n{err}");
    for p in pieces {
        assert!(err.contains(p), "stderr lacks {p:?}:\n{err}");
    }
    assert!(!err.contains("panicked") && !err.contains("internal error"), "{err}");
}

fn write_npy<T: npyz::AutoSerialize + Clone>(path: &Path, shape: &[u64], data: &[T]) {
    let f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut w = npyz::WriteOptions::new().default_dtype().shape(shape).writer(f).begin_nd().unwrap();
    w.extend(data.iter().cloned()).unwrap();
    w.finish().unwrap();
}

fn write_npy_with<T: npyz::Serialize + Clone>(path: &Path, descr: &str, order: npyz::Order, shape: &[u64], data: &[T]) {
    let f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let dtype = npyz::DType::Plain(descr.parse().unwrap());
    let mut w = npyz::WriteOptions::new().dtype(dtype).order(order).shape(shape).writer(f).begin_nd().unwrap();
    w.extend(data.iter().cloned()).unwrap();
    w.finish().unwrap();
}

/// Reads a .npy file: (shape, dtype string, data).
fn read_npy<T: npyz::Deserialize>(path: &Path) -> (Vec<u64>, String, Vec<T>) {
    let bytes = std::fs::read(path).unwrap();
    let f = npyz::NpyFile::new(&bytes[..]).unwrap();
    let shape = f.shape().to_vec();
    let descr = f.dtype().descr().trim_matches('\'').to_string();
    assert_eq!(f.order(), npyz::Order::C);
    (shape, descr, f.into_vec().unwrap())
}

/// Deterministic scores with many ties, both zeros, infinities and NaNs.
fn scores(n: usize, seed: u64) -> Vec<f32> {
    let mut st = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            st = st.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let r = (st >> 33) as u32;
            match r % 41 {
                0 => f32::NAN,
                1 => f32::INFINITY,
                2 => f32::NEG_INFINITY,
                3 => -0.0,
                4 => 0.0,
                5 => f32::from_bits(0xffc0_1234), // a negative NaN with a payload
                _ => ((r / 41) % 23) as f32 * 0.25 - 2.5,
            }
        })
        .collect()
}

fn cuda_available() -> bool {
    flashsel::cuda::CudaEngine::new(0).is_ok()
}

/// Runs `select` and checks indices (and values, bitwise) against the reference.
#[allow(clippy::too_many_arguments)]
fn check_select<T: ScoreElem + npyz::Deserialize>(
    tmp: &Tmp,
    input: &Path,
    data: &[T],
    rows: usize,
    cols: usize,
    k: usize,
    order: OutputOrder,
    nan: NanPolicy,
    lengths: Option<(&Path, &[i32])>,
    values_descr: &str,
    out_shape_rows: u64,
) {
    let out = tmp.path("idx.npy");
    let vals = tmp.path("vals.npy");
    let ks = k.to_string();
    let mut args = vec![
        "select",
        "--backend",
        "cpu",
        "--input",
        s(input),
        "--k",
        &ks,
        "--order",
        order.name(),
        "--nan",
        nan.name(),
        "--output",
        s(&out),
        "--values",
        s(&vals),
    ];
    if let Some((p, _)) = lengths {
        args.extend(["--lengths", s(p)]);
    }
    let o = flashsel(&args);
    assert_ok(&o);
    assert!(stderr(&o).is_empty(), "select should be quiet without -v: {}", stderr(&o));

    let view = ScoresView::new(data, rows, cols).unwrap();
    let spec = view.spec(k).with_order(order).with_nan(nan);
    let want = reference_select(&view, &spec, lengths.map(|(_, l)| l)).unwrap();

    let (shape, descr, idx) = read_npy::<i32>(&out);
    assert_eq!(shape, vec![out_shape_rows, k as u64]);
    assert_eq!(descr, "<i4");
    assert_eq!(idx, want.indices, "indices, k={k} {order:?} {nan:?}");

    let (shape, descr, v) = read_npy::<T>(&vals);
    assert_eq!(shape, vec![out_shape_rows, k as u64]);
    assert_eq!(descr, values_descr);
    let got: Vec<u32> = v.iter().map(|x| x.bits()).collect();
    let exp: Vec<u32> = want.values.iter().map(|x| x.bits()).collect();
    assert_eq!(got, exp, "value bits, k={k} {order:?} {nan:?}");
}

// ------------------------------------------------------------- round trips

#[test]
fn select_f32_all_orders_and_nan_policies() {
    let tmp = Tmp::new("f32");
    let (rows, cols) = (5, 37);
    let data = scores(rows * cols, 1);
    let input = tmp.path("s.npy");
    write_npy(&input, &[rows as u64, cols as u64], &data);
    for k in [1, 7, 37, 50] {
        for order in [OutputOrder::Score, OutputOrder::Index] {
            for nan in [NanPolicy::Lowest, NanPolicy::Largest] {
                check_select(&tmp, &input, &data, rows, cols, k, order, nan, None, "<f4", rows as u64);
            }
        }
    }
}

#[test]
fn select_f16_with_values() {
    let tmp = Tmp::new("f16");
    let (rows, cols) = (4, 300);
    let data: Vec<f16> = scores(rows * cols, 2).into_iter().map(f16::from_f32).collect();
    let input = tmp.path("s.npy");
    write_npy(&input, &[rows as u64, cols as u64], &data);
    for order in [OutputOrder::Score, OutputOrder::Index] {
        check_select(&tmp, &input, &data, rows, cols, 16, order, NanPolicy::Largest, None, "<f2", rows as u64);
    }
}

#[test]
fn select_bf16_as_u2_and_i2_bits() {
    let tmp = Tmp::new("bf16");
    let (rows, cols) = (3, 257);
    let data: Vec<bf16> = scores(rows * cols, 3).into_iter().map(bf16::from_f32).collect();

    // <u2: what arr.view(np.uint16) of an ml_dtypes bfloat16 array gives.
    let bits_u: Vec<u16> = data.iter().map(|x| x.to_bits()).collect();
    let input = tmp.path("su.npy");
    write_npy(&input, &[rows as u64, cols as u64], &bits_u);
    for order in [OutputOrder::Score, OutputOrder::Index] {
        let out = tmp.path("i.npy");
        let vals = tmp.path("v.npy");
        let o = flashsel(&[
            "select",
            "--input",
            s(&input),
            "--k",
            "20",
            "--order",
            order.name(),
            "--output",
            s(&out),
            "--values",
            s(&vals),
            "--backend",
            "cpu",
        ]);
        assert_ok(&o);
        let view = ScoresView::new(&data, rows, cols).unwrap();
        let want = reference_select(&view, &view.spec(20).with_order(order), None).unwrap();
        let (shape, descr, idx) = read_npy::<i32>(&out);
        assert_eq!((shape, descr.as_str()), (vec![rows as u64, 20], "<i4"));
        assert_eq!(idx, want.indices);
        let (_, descr, v) = read_npy::<u16>(&vals);
        assert_eq!(descr, "<u2");
        assert_eq!(v, want.values.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
    }

    // <i2: what torch_tensor.view(torch.int16).numpy() gives; values come back as <i2.
    let bits_i: Vec<i16> = data.iter().map(|x| x.to_bits() as i16).collect();
    let input = tmp.path("si.npy");
    write_npy(&input, &[rows as u64, cols as u64], &bits_i);
    let out = tmp.path("i.npy");
    let vals = tmp.path("v.npy");
    let o = flashsel(&["select", "--input", s(&input), "--k", "9", "--output", s(&out), "--values", s(&vals)]);
    assert_ok(&o);
    let view = ScoresView::new(&data, rows, cols).unwrap();
    let want = reference_select(&view, &view.spec(9), None).unwrap();
    assert_eq!(read_npy::<i32>(&out).2, want.indices);
    let (_, descr, v) = read_npy::<i16>(&vals);
    assert_eq!(descr, "<i2");
    assert_eq!(v, want.values.iter().map(|x| x.to_bits() as i16).collect::<Vec<_>>());
}

#[test]
fn select_with_lengths_i32_and_i64() {
    let tmp = Tmp::new("lengths");
    let (rows, cols) = (6, 40);
    let data = scores(rows * cols, 4);
    let input = tmp.path("s.npy");
    write_npy(&input, &[rows as u64, cols as u64], &data);
    let lengths: Vec<i32> = vec![0, 1, 5, 12, 39, 40];

    let l32 = tmp.path("l32.npy");
    write_npy(&l32, &[rows as u64], &lengths);
    let l64 = tmp.path("l64.npy");
    write_npy(&l64, &[rows as u64], &lengths.iter().map(|&x| x as i64).collect::<Vec<_>>());
    for lp in [&l32, &l64] {
        for order in [OutputOrder::Score, OutputOrder::Index] {
            let l = Some((lp.as_path(), lengths.as_slice()));
            check_select(&tmp, &input, &data, rows, cols, 8, order, NanPolicy::Lowest, l, "<f4", rows as u64);
        }
    }
}

#[test]
fn select_one_d_input_is_one_row() {
    let tmp = Tmp::new("1d");
    let data = scores(100, 5);
    let input = tmp.path("s.npy");
    write_npy(&input, &[100], &data);
    check_select(&tmp, &input, &data, 1, 100, 10, OutputOrder::Score, NanPolicy::Lowest, None, "<f4", 1);
    let l = tmp.path("l.npy");
    write_npy(&l, &[1], &[30i32]);
    let lengths = Some((l.as_path(), &[30i32][..]));
    check_select(&tmp, &input, &data, 1, 100, 10, OutputOrder::Index, NanPolicy::Lowest, lengths, "<f4", 1);
}

#[test]
fn select_pads_when_k_exceeds_the_row() {
    let tmp = Tmp::new("pad");
    let data = [3.0f32, 1.0, 2.0];
    let input = tmp.path("s.npy");
    write_npy(&input, &[1, 3], &data);
    let (out, vals) = (tmp.path("i.npy"), tmp.path("v.npy"));
    let o = flashsel(&["select", "--input", s(&input), "--k", "5", "--output", s(&out), "--values", s(&vals)]);
    assert_ok(&o);
    assert_eq!(read_npy::<i32>(&out).2, vec![0, 2, 1, -1, -1]);
    let v = read_npy::<f32>(&vals).2;
    assert_eq!(&v[..3], &[3.0, 2.0, 1.0]);
    assert!(v[3] == f32::NEG_INFINITY && v[4] == f32::NEG_INFINITY);
}

#[test]
fn select_reads_big_endian_and_writes_little_endian() {
    let tmp = Tmp::new("be");
    let data = scores(2 * 50, 6);
    let input = tmp.path("s.npy");
    write_npy_with(&input, ">f4", npyz::Order::C, &[2, 50], &data);
    check_select(&tmp, &input, &data, 2, 50, 6, OutputOrder::Score, NanPolicy::Lowest, None, "<f4", 2);
}

#[test]
fn verbose_says_why_auto_fell_back() {
    if cuda_available() {
        return;
    }
    let tmp = Tmp::new("verbose");
    let input = tmp.path("s.npy");
    write_npy(&input, &[2, 4], &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
    let out = tmp.path("i.npy");
    let o = flashsel(&["select", "--input", s(&input), "--k", "2", "--output", s(&out)]);
    assert_ok(&o);
    assert!(stderr(&o).is_empty(), "{}", stderr(&o));
    let o = flashsel(&["-v", "select", "--input", s(&input), "--k", "2", "--output", s(&out)]);
    assert_ok(&o);
    let err = stderr(&o);
    assert_eq!(err.matches("CUDA is not usable").count(), 1, "{err}");
}

// ------------------------------------------------------------- error paths

/// Writes a raw .npy file with an arbitrary header dict and data bytes.
fn write_raw(path: &Path, dict: &str, data: &[u8]) {
    let mut header = dict.to_string();
    while !(10 + header.len() + 1).is_multiple_of(64) {
        header.push(' ');
    }
    header.push('\n');
    let mut b = b"\x93NUMPY\x01\x00".to_vec();
    b.extend_from_slice(&(header.len() as u16).to_le_bytes());
    b.extend_from_slice(header.as_bytes());
    b.extend_from_slice(data);
    std::fs::write(path, b).unwrap();
}

#[test]
fn bad_inputs_are_clear_errors() {
    let tmp = Tmp::new("errors");
    let good = tmp.path("good.npy");
    write_npy(&good, &[2, 4], &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
    let out = tmp.path("out.npy");
    let sel = |input: &Path, extra: &[&str]| {
        let mut a = vec!["select", "--backend", "cpu", "--input", s(input), "--output", s(&out)];
        if !extra.contains(&"--k") {
            a.extend(["--k", "2"]);
        }
        a.extend(extra);
        flashsel(&a)
    };

    // Unreadable or not .npy.
    assert_fails(&sel(&tmp.path("missing.npy"), &[]), 1, &["cannot read", "missing.npy"]);
    assert_fails(&sel(&tmp.0, &[]), 1, &["cannot read"]);
    let junk = tmp.path("junk.npy");
    std::fs::write(&junk, b"hello world, not numpy").unwrap();
    assert_fails(&sel(&junk, &[]), 1, &["junk.npy", "not a valid .npy file"]);
    let garbled = tmp.path("garbled.npy");
    write_raw(&garbled, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, ", &[]);
    assert_fails(&sel(&garbled, &[]), 1, &["not a valid .npy file"]);

    // Wrong dtypes and shapes.
    let f8 = tmp.path("f8.npy");
    write_npy(&f8, &[2, 2], &[1.0f64, 2.0, 3.0, 4.0]);
    assert_fails(&sel(&f8, &[]), 1, &["unsupported dtype", "<f8", "float32"]);
    let i4 = tmp.path("i4.npy");
    write_npy(&i4, &[2, 2], &[1i32, 2, 3, 4]);
    assert_fails(&sel(&i4, &[]), 1, &["unsupported dtype", "<i4"]);
    let u1 = tmp.path("u1.npy");
    write_npy(&u1, &[4], &[1u8, 2, 3, 4]);
    assert_fails(&sel(&u1, &[]), 1, &["unsupported dtype", "|u1"]);
    let threed = tmp.path("3d.npy");
    write_npy(&threed, &[2, 2, 2], &[0.0f32; 8]);
    assert_fails(&sel(&threed, &[]), 1, &["3-D", "(2, 2, 2)"]);
    let scalar = tmp.path("0d.npy");
    write_raw(&scalar, "{'descr': '<f4', 'fortran_order': False, 'shape': (), }", &1.0f32.to_le_bytes());
    assert_fails(&sel(&scalar, &[]), 1, &["0-D", "()"]);
    let fortran = tmp.path("fortran.npy");
    write_npy_with(&fortran, "<f4", npyz::Order::Fortran, &[2, 3], &[0.0f32; 6]);
    assert_fails(&sel(&fortran, &[]), 1, &["Fortran", "C order"]);
    let structured = tmp.path("rec.npy");
    write_raw(&structured, "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }", &[0; 8]);
    assert_fails(&sel(&structured, &[]), 1, &["structured"]);

    // Truncated or absurd sizes: an error, never an allocation or a panic.
    let trunc = tmp.path("trunc.npy");
    write_raw(&trunc, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 4), }", &[0; 20]);
    assert_fails(&sel(&trunc, &[]), 1, &["truncated", "32 bytes", "20"]);
    let huge = tmp.path("huge.npy");
    write_raw(&huge, "{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000000, 1000000000000), }", &[]);
    assert_fails(&sel(&huge, &[]), 1, &["huge.npy"]);
    let neg = tmp.path("neg.npy");
    write_raw(&neg, "{'descr': '<f4', 'fortran_order': False, 'shape': (-1, 4), }", &[]);
    assert_fails(&sel(&neg, &[]), 1, &["negative"]);

    // k.
    assert_fails(&sel(&good, &["--k", "0"]), 1, &["k must be at least 1"]);
    assert_fails(&sel(&good, &["--k", "3000000000"]), 1, &["does not fit in i32"]);

    // Lengths.
    let lp = tmp.path("l.npy");
    write_npy(&lp, &[3], &[1i32, 2, 3]);
    assert_fails(&sel(&good, &["--lengths", s(&lp)]), 1, &["lengths has 3 entries", "2 rows"]);
    write_npy(&lp, &[2], &[1i32, 5]);
    assert_fails(&sel(&good, &["--lengths", s(&lp)]), 1, &["lengths[1] = 5", "0..=4"]);
    write_npy(&lp, &[2], &[-1i32, 2]);
    assert_fails(&sel(&good, &["--lengths", s(&lp)]), 1, &["lengths[0] = -1", "negative"]);
    write_npy(&lp, &[2], &[1i64, 5_000_000_000]);
    assert_fails(&sel(&good, &["--lengths", s(&lp)]), 1, &["lengths[1] = 5000000000", "int32"]);
    write_npy(&lp, &[2], &[1.0f32, 2.0]);
    assert_fails(&sel(&good, &["--lengths", s(&lp)]), 1, &["lengths dtype", "<f4", "int32"]);
    write_npy(&lp, &[2, 1], &[1i32, 2]);
    assert_fails(&sel(&good, &["--lengths", s(&lp)]), 1, &["1-D", "(2, 1)"]);
    assert_fails(&sel(&good, &["--lengths", s(&tmp.path("nope.npy"))]), 1, &["cannot read", "nope.npy"]);

    // Outputs.
    let bad_out = tmp.path("no/such/dir/out.npy");
    let o = flashsel(&["select", "--input", s(&good), "--k", "2", "--output", s(&bad_out)]);
    assert_fails(&o, 1, &["cannot write", "no/such/dir/out.npy"]);
    let o = flashsel(&["select", "--input", s(&good), "--k", "2", "--output", s(&out), "--values", s(&bad_out)]);
    assert_fails(&o, 1, &["cannot write --values"]);
    assert!(!out.exists(), "a failed run must not leave a half-written --output");
    let o = flashsel(&["select", "--input", s(&good), "--k", "2", "--output", s(&out), "--values", s(&out)]);
    assert_fails(&o, 1, &["same file"]);
}

#[test]
fn explicit_cuda_without_a_gpu_is_an_error() {
    if cuda_available() {
        return;
    }
    let tmp = Tmp::new("cuda");
    let input = tmp.path("s.npy");
    write_npy(&input, &[1, 4], &[1.0f32, 2.0, 3.0, 4.0]);
    let out = tmp.path("i.npy");
    let o = flashsel(&["select", "--backend", "cuda", "--input", s(&input), "--k", "2", "--output", s(&out)]);
    assert_fails(&o, 1, &["--backend cuda"]);
    let o = flashsel(&["bench", "--quick", "--backend", "cuda"]);
    assert_fails(&o, 1, &["--backend cuda"]);
}

#[test]
fn usage_errors_exit_2() {
    let cases: &[(&[&str], &str)] = &[
        (&["select", "--input", "a.npy", "--output", "b.npy"], "--k"),
        (&["select", "--input", "a.npy", "--k", "x", "--output", "b.npy"], "--k"),
        (&["select", "--input", "a.npy", "--k", "1", "--output", "b.npy", "--order", "best"], "--order"),
        (&["select", "--input", "a.npy", "--k", "1", "--output", "b.npy", "--nan", "highest"], "--nan"),
        (&["select", "--input", "a.npy", "--k", "1", "--output", "b.npy", "--backend", "tpu"], "--backend"),
        (&["select", "--input", "a.npy", "--k", "-1", "--output", "b.npy"], "-1"),
        (&["bench", "--iters", "0"], "--iters"),
        (&["plan", "--rows", "1", "--cols", "8", "--k", "2", "--dtype", "f64"], "--dtype"),
        (&["plan", "--rows", "1", "--cols", "8"], "--k"),
        (&["kernels", "--arch", "volta"], "--arch"),
        (&["check", "--backend", "tpu"], "--backend"),
        (&["frobnicate"], "frobnicate"),
    ];
    for (args, piece) in cases {
        assert_fails(&flashsel(args), 2, &[piece]);
    }
}

#[test]
fn gpu_subcommands_parse_their_flags() {
    for cmd in ["plan", "kernels", "check"] {
        let o = flashsel(&[cmd, "--help"]);
        assert_ok(&o);
    }
    let help = stdout(&flashsel(&["plan", "--help"]));
    for f in ["--rows", "--cols", "--k", "--dtype", "--lengths-present", "--sm-count", "--json"] {
        assert!(help.contains(f), "plan --help lacks {f}");
    }
    let help = stdout(&flashsel(&["kernels", "--help"]));
    assert!(help.contains("--compile-only") && help.contains("--arch"));
    let help = stdout(&flashsel(&["check", "--help"]));
    assert!(help.contains("--quick") && help.contains("--seed") && help.contains("--backend"));
}

#[test]
fn plan_prints_the_path_a_geometry_takes_without_a_gpu() {
    let o = flashsel(&["plan", "--rows", "1", "--cols", "4194304", "--k", "2048", "--sm-count", "132", "--json"]);
    assert_ok(&o);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("plan --json is JSON");
    assert_eq!(v["path"], "split");
    assert_eq!(v["ctas_per_row"], 132);
    assert_eq!(v["merge_levels"], 1);
    assert!(v["workspace_bytes"].as_u64().unwrap() >= 132 * 2048 * 8);
    assert_eq!(v["sampled"], true);
    let o = flashsel(&["plan", "--rows", "1", "--cols", "1048576", "--k", "2048", "--sm-count", "132", "--json"]);
    assert_ok(&o);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["path"], "grid");
    assert_eq!(v["ctas_per_row"], 132);
    assert_eq!(v["merge_levels"], 0);
    assert!(v["workspace_bytes"].as_u64().unwrap() >= (2048 + 256) * 8 + 12_320 * 4);
    let o = flashsel(&["plan", "--rows", "8192", "--cols", "131072", "--k", "2048", "--sm-count", "132", "--json"]);
    assert_ok(&o);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(
        (v["path"].as_str(), v["ctas_per_row"].as_u64(), v["workspace_bytes"].as_u64()),
        (Some("row"), Some(1), Some(0))
    );
    // A k too large for shared memory still has a plan.
    let o = flashsel(&["plan", "--rows", "2", "--cols", "1000000", "--k", "100000", "--sm-count", "132", "--json"]);
    assert_ok(&o);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["buffer"], "global");
    // The human-readable form names the same fields; bad geometry is an error.
    let o = flashsel(&["plan", "--rows", "1", "--cols", "262144", "--k", "512", "--sm-count", "132"]);
    assert_ok(&o);
    for f in ["path", "ctas_per_row", "merge_levels", "workspace_bytes"] {
        assert!(stdout(&o).contains(f), "plan output lacks {f}");
    }
    assert_fails(
        &flashsel(&["plan", "--rows", "1", "--cols", "8", "--k", "0", "--sm-count", "132"]),
        1,
        &["k must be"],
    );
}

#[test]
fn kernels_compile_only_lists_every_variant_when_nvrtc_is_present() {
    let o = flashsel(&["kernels", "--compile-only", "--arch", "sm_90a"]);
    if !o.status.success() && stderr(&o).contains("libnvrtc") {
        // CI sets FLASHSEL_REQUIRE_NVRTC=1 and installs NVRTC: there this must run.
        assert!(std::env::var_os("FLASHSEL_REQUIRE_NVRTC").is_none(), "NVRTC required: {}", stderr(&o));
        eprintln!("skipped: {}", stderr(&o));
        return;
    }
    assert_ok(&o);
    let out = stdout(&o);
    for k in ["fs_scan_f32", "fs_split_bf16", "fs_prep_f16"] {
        assert!(out.contains(k), "kernels output lacks {k}:\n{out}");
    }
    assert!(out.contains("buffer=shared") && out.contains("buffer=global"));
}

#[test]
fn check_without_a_gpu_says_why() {
    if flashsel::cuda::availability().is_ok() && flashsel::cuda::CudaEngine::new(0).is_ok() {
        return; // a GPU is here: `check` would run for real (done on the GPU machine)
    }
    let o = flashsel(&["check", "--quick"]);
    assert_fails(&o, 1, &["backend unavailable"]);
}

// ------------------------------------------------------------- bench, info

#[test]
fn bench_quick_cpu_prints_a_verified_table_and_json() {
    let tmp = Tmp::new("bench");
    let json = tmp.path("bench.json");
    let o = flashsel(&["bench", "--quick", "--backend", "cpu", "--json", s(&json)]);
    assert_ok(&o);
    let out = stdout(&o);
    for piece in
        ["median us", "GB/s", "floor GB/s", "of floor", "verified", "1x65536", "bf16", "relu-sparse", "all verified"]
    {
        assert!(out.contains(piece), "table lacks {piece:?}:\n{out}");
    }

    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["backend"], "cpu");
    assert_eq!(v["suite"], "quick");
    assert_eq!(v["ok"], true);
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 12); // 2 shapes x 2 dtypes x 3 data kinds
                                   // One row of the table per result.
    let table_rows = out.lines().filter(|l| {
        let first = l.split_whitespace().next().unwrap_or("");
        first.split_once('x').is_some_and(|(r, c)| r.parse::<u64>().is_ok() && c.parse::<u64>().is_ok())
    });
    assert_eq!(table_rows.count(), results.len(), "{out}");
    for r in results {
        for f in [
            "shape",
            "rows",
            "cols",
            "k",
            "dtype",
            "data",
            "backend",
            "iters",
            "median_us",
            "gbps",
            "floor_us",
            "floor_gbps",
            "fraction_of_floor",
            "verified",
            "ok",
        ] {
            assert!(r.get(f).is_some(), "result lacks {f}: {r}");
        }
        assert_eq!(r["ok"], true);
        assert!(r["median_us"].as_f64().unwrap() > 0.0);
        assert!(r["gbps"].as_f64().unwrap() > 0.0);
        assert!(r["floor_us"].as_f64().unwrap() > 0.0);
        assert_eq!(r["shape"].as_str().unwrap(), format!("{}x{}", r["rows"], r["cols"]));
        assert!(r["verified"].as_str().unwrap().contains("ref"));
    }
    let kinds: std::collections::BTreeSet<_> =
        results.iter().map(|r| (r["dtype"].to_string(), r["data"].to_string())).collect();
    assert_eq!(kinds.len(), 6);

    // --iters is honoured.
    let o = flashsel(&["bench", "--quick", "--backend", "cpu", "--iters", "1", "--json", s(&json)]);
    assert_ok(&o);
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert!(v["results"].as_array().unwrap().iter().all(|r| r["iters"] == 1));

    // An unwritable --json fails before the suite runs.
    let o = flashsel(&["bench", "--quick", "--backend", "cpu", "--json", s(&tmp.path("no/dir/b.json"))]);
    assert_fails(&o, 1, &["cannot write --json"]);
}

#[test]
fn info_lists_backends() {
    let o = flashsel(&["info"]);
    assert_ok(&o);
    let out = stdout(&o);
    assert!(out.contains(env!("CARGO_PKG_VERSION")), "{out}");
    assert!(out.contains("cpu") && out.contains("available"), "{out}");
    if !cuda_available() {
        assert!(out.contains("cuda  unavailable: "), "{out}");
    }
    let o = flashsel(&["--version"]);
    assert_ok(&o);
    assert!(stdout(&o).contains(env!("CARGO_PKG_VERSION")));
}
