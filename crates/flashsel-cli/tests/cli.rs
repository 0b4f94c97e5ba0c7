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

/// Runs flashsel with every GPU hidden (`CUDA_VISIBLE_DEVICES` empty), so the
/// no-GPU behaviour is tested on a GPU machine too, instead of skipped there.
fn flashsel_without_gpu(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flashsel"))
        .env("CUDA_VISIBLE_DEVICES", "")
        .args(args)
        .output()
        .expect("run flashsel")
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
    one_d: bool,
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

    // 1-D scores (one row) give 1-D outputs of k entries, as the Python package does.
    let want_shape = if one_d { vec![k as u64] } else { vec![rows as u64, k as u64] };
    let (shape, descr, idx) = read_npy::<i32>(&out);
    assert_eq!(shape, want_shape);
    assert_eq!(descr, "<i4");
    assert_eq!(idx, want.indices, "indices, k={k} {order:?} {nan:?}");

    let (shape, descr, v) = read_npy::<T>(&vals);
    assert_eq!(shape, want_shape);
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
                check_select(&tmp, &input, &data, rows, cols, k, order, nan, None, "<f4", false);
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
        check_select(&tmp, &input, &data, rows, cols, 16, order, NanPolicy::Largest, None, "<f2", false);
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
            check_select(&tmp, &input, &data, rows, cols, 8, order, NanPolicy::Lowest, l, "<f4", false);
        }
    }
}

#[test]
fn select_one_d_input_is_one_row_with_one_d_outputs() {
    let tmp = Tmp::new("1d");
    let data = scores(100, 5);
    let input = tmp.path("s.npy");
    write_npy(&input, &[100], &data);
    check_select(&tmp, &input, &data, 1, 100, 10, OutputOrder::Score, NanPolicy::Lowest, None, "<f4", true);
    // Padding keeps the 1-D shape too.
    check_select(&tmp, &input, &data, 1, 100, 120, OutputOrder::Score, NanPolicy::Largest, None, "<f4", true);
    let l = tmp.path("l.npy");
    write_npy(&l, &[1], &[30i32]);
    let lengths = Some((l.as_path(), &[30i32][..]));
    check_select(&tmp, &input, &data, 1, 100, 10, OutputOrder::Index, NanPolicy::Lowest, lengths, "<f4", true);
    // A 1-D array in Fortran order is the same bytes as in C order.
    let fortran = tmp.path("f.npy");
    write_npy_with(&fortran, "<f4", npyz::Order::Fortran, &[100], &data);
    check_select(&tmp, &fortran, &data, 1, 100, 10, OutputOrder::Score, NanPolicy::Lowest, None, "<f4", true);
}

/// Writes a 0-d (scalar) array.
fn write_scalar<T: npyz::AutoSerialize + Clone>(path: &Path, x: T) {
    write_npy(path, &[], &[x]);
}

#[test]
fn scalar_lengths_apply_to_every_row() {
    let tmp = Tmp::new("scalar-lengths");
    let (rows, cols) = (4, 33);
    let data = scores(rows * cols, 7);
    let input = tmp.path("s.npy");
    write_npy(&input, &[rows as u64, cols as u64], &data);
    let every = vec![9i32; rows];
    let l32 = tmp.path("l32.npy");
    write_scalar(&l32, 9i32);
    let l64 = tmp.path("l64.npy");
    write_scalar(&l64, 9i64);
    for lp in [&l32, &l64] {
        let l = Some((lp.as_path(), every.as_slice()));
        check_select(&tmp, &input, &data, rows, cols, 12, OutputOrder::Score, NanPolicy::Lowest, l, "<f4", false);
    }
    // A scalar also applies to the one row of a 1-D input.
    let one = tmp.path("one.npy");
    write_npy(&one, &[cols as u64], &data[..cols]);
    let l = Some((l32.as_path(), &every[..1]));
    check_select(&tmp, &one, &data[..cols], 1, cols, 5, OutputOrder::Index, NanPolicy::Lowest, l, "<f4", true);

    // Out of range: a clear error naming the scalar.
    let out = tmp.path("i.npy");
    let bad = tmp.path("bad.npy");
    write_scalar(&bad, 34i64);
    let o = flashsel(&["select", "--input", s(&input), "--k", "2", "--output", s(&out), "--lengths", s(&bad)]);
    assert_fails(&o, 1, &["bad.npy", "34", "0..=33"]);
    write_scalar(&bad, -1i32);
    let o = flashsel(&["select", "--input", s(&input), "--k", "2", "--output", s(&out), "--lengths", s(&bad)]);
    assert_fails(&o, 1, &["bad.npy", "-1", "negative"]);
    assert!(!out.exists());
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
    let (rows, cols) = (2, 50);
    let data = scores(rows * cols, 6);
    let input = tmp.path("s.npy");
    write_npy_with(&input, ">f4", npyz::Order::C, &[2, 50], &data);
    check_select(&tmp, &input, &data, rows, cols, 6, OutputOrder::Score, NanPolicy::Lowest, None, "<f4", false);

    let half: Vec<f16> = data.iter().map(|&x| f16::from_f32(x)).collect();
    write_npy_with(&input, ">f2", npyz::Order::C, &[2, 50], &half);
    check_select(&tmp, &input, &half, rows, cols, 6, OutputOrder::Index, NanPolicy::Largest, None, "<f2", false);

    // Lengths in either integer width, big-endian.
    let lengths = [17i32, 50];
    let l4 = tmp.path("l4.npy");
    write_npy_with(&l4, ">i4", npyz::Order::C, &[2], &lengths);
    let l8 = tmp.path("l8.npy");
    write_npy_with(&l8, ">i8", npyz::Order::C, &[2], &lengths.map(i64::from));
    for lp in [&l4, &l8] {
        let l = Some((lp.as_path(), &lengths[..]));
        check_select(&tmp, &input, &half, rows, cols, 6, OutputOrder::Score, NanPolicy::Lowest, l, "<f2", false);
    }

    // bfloat16 bits as >u2 and >i2: values come back as <u2 and <i2.
    let b: Vec<bf16> = data.iter().map(|&x| bf16::from_f32(x)).collect();
    let view = ScoresView::new(&b, rows, cols).unwrap();
    let want = reference_select(&view, &view.spec(7), None).unwrap();
    let (out, vals) = (tmp.path("i.npy"), tmp.path("v.npy"));
    let run = |input: &Path| {
        assert_ok(&flashsel(&["select", "--input", s(input), "--k", "7", "--output", s(&out), "--values", s(&vals)]));
        assert_eq!(read_npy::<i32>(&out).2, want.indices);
    };
    write_npy_with(&input, ">u2", npyz::Order::C, &[2, 50], &b.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
    run(&input);
    let (_, descr, v) = read_npy::<u16>(&vals);
    assert_eq!((descr.as_str(), v), ("<u2", want.values.iter().map(|x| x.to_bits()).collect()));
    write_npy_with(&input, ">i2", npyz::Order::C, &[2, 50], &b.iter().map(|x| x.to_bits() as i16).collect::<Vec<_>>());
    run(&input);
    let (_, descr, v) = read_npy::<i16>(&vals);
    assert_eq!((descr.as_str(), v), ("<i2", want.values.iter().map(|x| x.to_bits() as i16).collect()));
}

#[test]
fn verbose_says_why_auto_fell_back() {
    let tmp = Tmp::new("verbose");
    let input = tmp.path("s.npy");
    write_npy(&input, &[2, 4], &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
    let out = tmp.path("i.npy");
    let o = flashsel_without_gpu(&["select", "--input", s(&input), "--k", "2", "--output", s(&out)]);
    assert_ok(&o);
    assert!(stderr(&o).is_empty(), "{}", stderr(&o));
    let o = flashsel_without_gpu(&["-v", "select", "--input", s(&input), "--k", "2", "--output", s(&out)]);
    assert_ok(&o);
    let err = stderr(&o);
    assert_eq!(err.matches("CUDA is not usable").count(), 1, "{err}");
    assert!(err.contains("on cpu"), "{err}");
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test -p flashsel-cli --test cli -- --ignored gpu_"]
fn gpu_select_on_cuda_matches_the_reference() {
    let tmp = Tmp::new("gpu");
    let (rows, cols) = (3, 5000);
    let data = scores(rows * cols, 10);
    let input = tmp.path("s.npy");
    write_npy(&input, &[rows as u64, cols as u64], &data);
    let (out, vals) = (tmp.path("i.npy"), tmp.path("v.npy"));
    let o = flashsel(&[
        "-v",
        "select",
        "--backend",
        "cuda",
        "--input",
        s(&input),
        "--k",
        "64",
        "--output",
        s(&out),
        "--values",
        s(&vals),
    ]);
    assert_ok(&o);
    assert!(stderr(&o).contains("on cuda"), "{}", stderr(&o));
    let view = ScoresView::new(&data, rows, cols).unwrap();
    let want = reference_select(&view, &view.spec(64), None).unwrap();
    assert_eq!(read_npy::<i32>(&out).2, want.indices);
    let got: Vec<u32> = read_npy::<f32>(&vals).2.iter().map(|x| x.to_bits()).collect();
    assert_eq!(got, want.values.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
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
    // The message names every accepted dtype.
    assert_fails(&sel(&i4, &[]), 1, &["unsupported dtype", "<i4", "float32 (<f4)", "float16 (<f2)", "<u2/<i2"]);
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
    // A header length of 4 GiB is refused before anything is allocated for it.
    let long = tmp.path("long.npy");
    std::fs::write(&long, [&b"\x93NUMPY\x02\x00"[..], &u32::MAX.to_le_bytes()].concat()).unwrap();
    assert_fails(&sel(&long, &[]), 1, &["long.npy", "header length 4294967295"]);
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

    // k (--k 0 is a usage error: usage_errors_exit_2).
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

/// The names in a directory, sorted.
fn dir_names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

#[test]
fn a_failed_run_leaves_existing_outputs_as_they_were() {
    let tmp = Tmp::new("keep");
    let input = tmp.path("s.npy");
    write_npy(&input, &[2, 8], &scores(16, 8));
    let (out, vals) = (tmp.path("i.npy"), tmp.path("v.npy"));
    std::fs::write(&out, "keep\n").unwrap();
    std::fs::write(&vals, "keep too\n").unwrap();

    // --values cannot be written: --output is not touched.
    let nope = tmp.path("nope/v.npy");
    let o = flashsel(&["select", "--input", s(&input), "--k", "4", "--output", s(&out), "--values", s(&nope)]);
    assert_fails(&o, 1, &["cannot write --values", "nope/v.npy"]);
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "keep\n");
    // --output cannot be written: --values is not touched.
    let o = flashsel(&["select", "--input", s(&input), "--k", "4", "--output", s(&nope), "--values", s(&vals)]);
    assert_fails(&o, 1, &["cannot write --output", "nope/v.npy"]);
    assert_eq!(std::fs::read_to_string(&vals).unwrap(), "keep too\n");
    // An output that is a directory: refused, nothing else changed.
    let sub = tmp.path("sub");
    std::fs::create_dir(&sub).unwrap();
    let o = flashsel(&["select", "--input", s(&input), "--k", "4", "--output", s(&out), "--values", s(&sub)]);
    assert_fails(&o, 1, &["cannot write --values", "directory"]);
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "keep\n");
    // A request the library refuses (rows * k beyond i32) leaves them too.
    let o = flashsel(&["select", "--input", s(&input), "--k", "2000000000", "--output", s(&out), "--values", s(&vals)]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "keep\n");
    assert_eq!(std::fs::read_to_string(&vals).unwrap(), "keep too\n");
    // No temporary file is left behind by any of these.
    assert_eq!(dir_names(&tmp.0), ["i.npy", "s.npy", "sub", "v.npy"]);

    // A run that succeeds replaces both, and leaves nothing else.
    let o = flashsel(&["select", "--input", s(&input), "--k", "4", "--output", s(&out), "--values", s(&vals)]);
    assert_ok(&o);
    assert_eq!(read_npy::<i32>(&out).0, vec![2, 4]);
    assert_eq!(read_npy::<f32>(&vals).0, vec![2, 4]);
    assert_eq!(dir_names(&tmp.0), ["i.npy", "s.npy", "sub", "v.npy"]);
}

/// Runs flashsel with its address space limited to `kib` KiB (`ulimit -v`).
#[cfg(unix)]
fn flashsel_limited(kib: u64, args: &[&str]) -> Output {
    Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -v {kib} && exec \"$0\" \"$@\""))
        .arg(env!("CARGO_BIN_EXE_flashsel"))
        .args(args)
        .output()
        .expect("run sh")
}

#[cfg(unix)]
#[test]
fn out_of_memory_in_the_selection_is_one_error_line_and_leaves_nothing() {
    const LIMIT_KIB: u64 = 2_000_000;
    let tmp = Tmp::new("oom");
    let input = tmp.path("row.npy");
    write_npy(&input, &[1000], &scores(1000, 9));
    let out = tmp.path("h.npy");
    let sel = |k: &str| {
        flashsel_limited(
            LIMIT_KIB,
            &["select", "--backend", "cpu", "--input", s(&input), "--k", k, "--output", s(&out)],
        )
    };
    // Under the same limit a small k runs: the limit itself is not what fails.
    assert_ok(&sel("10"));
    std::fs::remove_file(&out).unwrap();

    // 10^9 output entries (8 GB of indices and values) cannot fit in 2 GB.
    let o = sel("1000000000");
    assert_fails(&o, 1, &["out of memory"]);
    assert_eq!(stderr(&o).lines().count(), 1, "{}", stderr(&o));
    assert_eq!(dir_names(&tmp.0), ["row.npy"]);
    // An existing output stays as it was.
    std::fs::write(&out, "keep\n").unwrap();
    assert_fails(&sel("1000000000"), 1, &["out of memory"]);
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "keep\n");
    assert_eq!(dir_names(&tmp.0), ["h.npy", "row.npy"]);
}

#[cfg(unix)]
#[test]
fn out_of_memory_reading_the_input_is_one_error_line() {
    let tmp = Tmp::new("oom-input");
    // A header for 4 GiB of f32 over a sparse file of that size: it reads as
    // valid, and cannot be held in a 2 GB address space.
    let big = tmp.path("big.npy");
    let f = std::fs::File::create(&big).unwrap();
    let header = npyz::WriteOptions::<f32>::new().default_dtype().shape(&[1 << 20, 1 << 10]);
    let f = header.writer(f).write_header_only().unwrap();
    f.set_len(f.metadata().unwrap().len() + (4u64 << 30)).unwrap();
    let out = tmp.path("h.npy");
    std::fs::write(&out, "keep\n").unwrap();
    let o = flashsel_limited(
        2_000_000,
        &["select", "--backend", "cpu", "--input", s(&big), "--k", "1", "--output", s(&out)],
    );
    assert_fails(&o, 1, &["big.npy", "out of memory", "4294967296 bytes"]);
    assert_eq!(stderr(&o).lines().count(), 1, "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "keep\n");
    assert_eq!(dir_names(&tmp.0), ["big.npy", "h.npy"]);
}

#[test]
fn explicit_cuda_without_a_gpu_is_an_error() {
    let tmp = Tmp::new("cuda");
    let input = tmp.path("s.npy");
    write_npy(&input, &[1, 4], &[1.0f32, 2.0, 3.0, 4.0]);
    let out = tmp.path("i.npy");
    let o =
        flashsel_without_gpu(&["select", "--backend", "cuda", "--input", s(&input), "--k", "2", "--output", s(&out)]);
    assert_fails(&o, 1, &["--backend cuda"]);
    assert!(!out.exists());
    let o = flashsel_without_gpu(&["bench", "--quick", "--backend", "cuda"]);
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
        (&["select", "--input", "a.npy", "--k", "0", "--output", "b.npy"], "--k"),
        (&["bench", "--iters", "0"], "--iters"),
        (&["bench", "--only", "topk"], "--only"),
        (&["bench", "--only", "qsa,nope"], "--only"),
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
#[ignore = "needs NVRTC (libnvrtc.so.13 on LD_LIBRARY_PATH): cargo test -p flashsel-cli --test cli -- --ignored nvrtc_"]
fn nvrtc_kernels_compile_only_lists_every_variant() {
    let o = flashsel(&["kernels", "--compile-only", "--arch", "sm_90a"]);
    assert_ok(&o);
    let out = stdout(&o);
    for k in ["fs_scan_f32", "fs_split_bf16", "fs_prep_f16"] {
        assert!(out.contains(k), "kernels output lacks {k}:\n{out}");
    }
    assert!(out.contains("buffer=shared") && out.contains("buffer=global"));
}

#[test]
fn check_without_a_gpu_says_why() {
    let o = flashsel_without_gpu(&["check", "--quick"]);
    assert_fails(&o, 1, &["backend unavailable"]);
    // --filter is taken (a usage error would exit 2).
    let o = flashsel_without_gpu(&["check", "--only", "select", "--filter", "ranges"]);
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
    // top-k: 2 shapes x 2 dtypes x 3 data kinds; qsa/dsa: 4 cases x 3 data
    // kinds; indexer: 4 cases of normal data.
    assert_eq!(results.len(), 28);
    assert_eq!(table_rows(&out), results.len(), "{out}");
    let per_op = |op: &str| results.iter().filter(|r| r["op"] == op).count();
    assert_eq!(
        (per_op("select"), per_op("qsa-decode"), per_op("qsa-prefill"), per_op("dsa"), per_op("indexer")),
        (12, 3, 6, 3, 4)
    );
    assert_eq!(v["groups"], serde_json::json!(["select", "qsa-decode", "qsa-prefill", "dsa", "indexer"]));
    for piece in [
        "qsa/dsa cases",
        "every row at t = 65535",
        "rows at t = 16320..=16383",
        "KV slots",
        "indexer cases",
        "f8e4m3 keys",
        "scores + select fused",
    ] {
        assert!(out.contains(piece), "legend lacks {piece:?}:\n{out}");
    }
    for r in results {
        for f in [
            "op",
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
        // The token cases say what their rows are; their bytes include the ids written.
        let token = r["op"] != "select";
        assert_eq!(r["case"].is_string(), token, "{r}");
        if token {
            let width = if r["k"] == 32 { 131 } else { 2051 };
            let ids = if r["op"] == "dsa" { 8 * 256 * 4 } else { r["rows"].as_u64().unwrap() * width * 4 };
            assert!(r["bytes"].as_u64().unwrap() > ids, "{r}");
        }
    }
    let kinds: std::collections::BTreeSet<_> =
        results.iter().map(|r| (r["dtype"].to_string(), r["data"].to_string())).collect();
    assert_eq!(kinds.len(), 7); // the indexer's f8e4m3 keys

    // --only runs the groups named (comma-separated or repeated), nothing else.
    let o = flashsel(&["bench", "--quick", "--backend", "cpu", "--only", "qsa,dsa", "--json", s(&json)]);
    assert_ok(&o);
    let out = stdout(&o);
    assert!(out.contains("groups: qsa-decode, qsa-prefill, dsa (--only)"), "{out}");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 12);
    assert!(results.iter().all(|r| r["op"] != "select" && r["ok"] == true));
    assert_eq!(table_rows(&out), 12, "{out}");
    let o =
        flashsel(&["bench", "--quick", "--backend", "cpu", "--only", "select", "--only", "dsa", "--json", s(&json)]);
    assert_ok(&o);
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let ops: std::collections::BTreeSet<_> =
        v["results"].as_array().unwrap().iter().map(|r| r["op"].as_str().unwrap().to_string()).collect();
    assert_eq!(ops.into_iter().collect::<Vec<_>>(), ["dsa", "select"]);
    assert!(!stdout(&o).contains("qsa-decode"), "{}", stdout(&o));
    let o = flashsel(&["bench", "--quick", "--backend", "cpu", "--only", "indexer", "--json", s(&json)]);
    assert_ok(&o);
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 4);
    assert!(results.iter().all(|r| r["op"] == "indexer" && r["ok"] == true), "{v}");
    assert_eq!(table_rows(&stdout(&o)), 4, "{}", stdout(&o));

    // --iters is honoured.
    let o = flashsel(&["bench", "--quick", "--backend", "cpu", "--iters", "1", "--json", s(&json)]);
    assert_ok(&o);
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert!(v["results"].as_array().unwrap().iter().all(|r| r["iters"] == 1));

    // An unwritable --json fails before the suite runs.
    let o = flashsel(&["bench", "--quick", "--backend", "cpu", "--json", s(&tmp.path("no/dir/b.json"))]);
    assert_fails(&o, 1, &["cannot write --json"]);
}

/// The table's rows: lines whose first word is an op and whose second is `RxC`.
fn table_rows(out: &str) -> usize {
    out.lines()
        .filter(|l| {
            let mut w = l.split_whitespace();
            let op = w.next().unwrap_or("");
            let shape = w.next().unwrap_or("").trim_end_matches('*');
            ["select", "qsa-decode", "qsa-prefill", "dsa", "indexer"].contains(&op)
                && shape.split_once('x').is_some_and(|(r, c)| r.parse::<u64>().is_ok() && c.parse::<u64>().is_ok())
        })
        .count()
}

#[test]
fn info_lists_backends() {
    let o = flashsel(&["info"]);
    assert_ok(&o);
    let out = stdout(&o);
    assert!(out.contains(env!("CARGO_PKG_VERSION")), "{out}");
    assert!(out.contains("cpu") && out.contains("available"), "{out}");
    let o = flashsel_without_gpu(&["info"]);
    assert_ok(&o);
    let out = stdout(&o);
    assert!(out.contains("cuda  unavailable: ") && out.contains("auto picks: cpu"), "{out}");
    let o = flashsel(&["--version"]);
    assert_ok(&o);
    assert!(stdout(&o).contains(env!("CARGO_PKG_VERSION")));
}

// ------------------------------------------------- select --starts (ranges)

/// Asserts that `path` is an int32 `.npy` of `shape` holding `want`, and
/// byte for byte the file npyz writes for that array.
#[track_caller]
fn assert_i32_npy(path: &Path, shape: &[u64], want: &[i32], ctx: &str) {
    let (got_shape, descr, got) = read_npy::<i32>(path);
    assert_eq!((got_shape.as_slice(), descr.as_str()), (shape, "<i4"), "{ctx}");
    assert_eq!(got, want, "{ctx}");
    let expected = path.with_extension("expected.npy");
    write_npy_with(&expected, "<i4", npyz::Order::C, shape, want);
    assert!(std::fs::read(path).unwrap() == std::fs::read(&expected).unwrap(), "file bytes differ: {ctx}");
    std::fs::remove_file(expected).unwrap();
}

/// Reads a values file's shape, dtype and element bits, whatever its dtype.
fn read_bits(path: &Path) -> (Vec<u64>, String, Vec<u32>) {
    fn widen<T: npyz::Deserialize>(path: &Path, bits: impl Fn(T) -> u32) -> (Vec<u64>, String, Vec<u32>) {
        let (shape, descr, v) = read_npy::<T>(path);
        (shape, descr, v.into_iter().map(bits).collect())
    }
    let bytes = std::fs::read(path).unwrap();
    let descr = npyz::NpyFile::new(&bytes[..]).unwrap().dtype().descr();
    match descr.trim_matches('\'') {
        "<f4" => widen(path, f32::to_bits),
        "<f2" => widen(path, |x: f16| x.to_bits() as u32),
        "<u2" => widen(path, |x: u16| x as u32),
        "<i2" => widen(path, |x: i16| x as u16 as u32),
        d => panic!("unexpected values dtype {d}"),
    }
}

/// Runs `select --starts` on the CPU and checks indices and value bits
/// against `flashsel::cpu::select_ranges` on the same data.
#[allow(clippy::too_many_arguments)]
fn check_ranges<T: ScoreElem>(
    tmp: &Tmp,
    input: &Path,
    data: &[T],
    (rows, cols, one_d): (usize, usize, bool),
    k: usize,
    order: OutputOrder,
    nan: NanPolicy,
    starts: (&Path, &[i32]),
    ends: Option<(&Path, &[i32])>,
    backend: &str,
) {
    let (out, vals) = (tmp.path("ri.npy"), tmp.path("rv.npy"));
    let ks = k.to_string();
    let mut args = vec!["select", "--backend", backend, "--input", s(input), "--k", &ks, "--starts", s(starts.0)];
    args.extend(["--order", order.name(), "--nan", nan.name(), "--output", s(&out), "--values", s(&vals)]);
    if let Some((p, _)) = ends {
        args.extend(["--lengths", s(p)]);
    }
    let o = flashsel(&args);
    assert_ok(&o);
    assert!(stderr(&o).is_empty(), "{}", stderr(&o));

    let view = ScoresView::new(data, rows, cols).unwrap();
    let spec = view.spec(k).with_order(order).with_nan(nan);
    let want = flashsel::cpu::select_ranges(&view, &spec, starts.1, ends.map(|e| e.1)).unwrap();
    let shape = if one_d { vec![k as u64] } else { vec![rows as u64, k as u64] };
    let ctx = format!("k={k} {order:?} {nan:?} starts={:?} ends={:?}", starts.1, ends.map(|e| e.1));
    assert_i32_npy(&out, &shape, &want.indices, &ctx);
    let (vshape, _, got) = read_bits(&vals);
    assert_eq!(vshape, shape);
    assert_eq!(got, want.values.iter().map(|x| x.bits()).collect::<Vec<_>>(), "value bits, {ctx}");
}

#[test]
fn select_starts_matches_select_ranges() {
    let tmp = Tmp::new("ranges");
    let (rows, cols) = (9, 60);
    let data = scores(rows * cols, 21);
    let input = tmp.path("s.npy");
    write_npy(&input, &[rows as u64, cols as u64], &data);
    // Empty ranges (rows 1, 2, 5), one column (6), short, long, the whole row.
    let starts = [0i32, 0, 5, 10, 59, 60, 30, 17, 0];
    let ends = [60i32, 0, 5, 40, 60, 60, 31, 20, 60];
    let (sp, ep) = (tmp.path("st.npy"), tmp.path("en.npy"));
    write_npy(&sp, &[rows as u64], &starts);
    write_npy(&ep, &[rows as u64], &ends);
    let geo = (rows, cols, false);
    for k in [1, 3, 8, 60, 70] {
        for order in [OutputOrder::Score, OutputOrder::Index] {
            for nan in [NanPolicy::Lowest, NanPolicy::Largest] {
                check_ranges(&tmp, &input, &data, geo, k, order, nan, (&sp, &starts), Some((&ep, &ends)), "cpu");
            }
        }
    }
    // Without --lengths every range ends at cols (the default backend: auto runs it on the CPU).
    check_ranges(&tmp, &input, &data, geo, 8, OutputOrder::Score, NanPolicy::Lowest, (&sp, &starts), None, "auto");

    // Starts and ends in int64 and big-endian int32.
    let (sp8, ep4) = (tmp.path("st8.npy"), tmp.path("en4.npy"));
    write_npy(&sp8, &[rows as u64], &starts.map(i64::from));
    write_npy_with(&ep4, ">i4", npyz::Order::C, &[rows as u64], &ends);
    check_ranges(
        &tmp,
        &input,
        &data,
        geo,
        8,
        OutputOrder::Index,
        NanPolicy::Largest,
        (&sp8, &starts),
        Some((&ep4, &ends)),
        "cpu",
    );

    // A scalar start for every row, with per-row ends and with a scalar end.
    let every = [12i32; 9];
    let sc = tmp.path("sc.npy");
    write_scalar(&sc, 12i64);
    let ends_from_12 = [12i32, 13, 20, 40, 60, 60, 31, 20, 60];
    let ep2 = tmp.path("en2.npy");
    write_npy(&ep2, &[rows as u64], &ends_from_12);
    check_ranges(
        &tmp,
        &input,
        &data,
        geo,
        5,
        OutputOrder::Score,
        NanPolicy::Lowest,
        (&sc, &every),
        Some((&ep2, &ends_from_12)),
        "cpu",
    );
    let esc = tmp.path("esc.npy");
    write_scalar(&esc, 12i32);
    check_ranges(
        &tmp,
        &input,
        &data,
        geo,
        5,
        OutputOrder::Score,
        NanPolicy::Lowest,
        (&sc, &every),
        Some((&esc, &[12; 9])),
        "cpu",
    );

    // Starts of 0 are plain select with lengths.
    let zeros = tmp.path("z.npy");
    write_scalar(&zeros, 0i32);
    check_ranges(
        &tmp,
        &input,
        &data,
        geo,
        8,
        OutputOrder::Score,
        NanPolicy::Lowest,
        (&zeros, &[0; 9]),
        Some((&ep, &ends)),
        "cpu",
    );
    let plain = tmp.path("plain.npy");
    assert_ok(&flashsel(&[
        "select",
        "--backend",
        "cpu",
        "--input",
        s(&input),
        "--k",
        "8",
        "--lengths",
        s(&ep),
        "--output",
        s(&plain),
    ]));
    assert_eq!(std::fs::read(&plain).unwrap(), std::fs::read(tmp.path("ri.npy")).unwrap());
}

#[test]
fn select_starts_on_f16_bf16_and_one_d_input() {
    let tmp = Tmp::new("ranges-types");
    let (rows, cols) = (4, 130);
    let raw = scores(rows * cols, 22);
    let starts = [0i32, 64, 100, 129];
    let ends = [130i32, 128, 100, 130];
    let (sp, ep) = (tmp.path("st.npy"), tmp.path("en.npy"));
    write_npy(&sp, &[rows as u64], &starts);
    write_npy(&ep, &[rows as u64], &ends);
    let geo = (rows, cols, false);

    let half: Vec<f16> = raw.iter().map(|&x| f16::from_f32(x)).collect();
    let input = tmp.path("h.npy");
    write_npy(&input, &[rows as u64, cols as u64], &half);
    check_ranges(
        &tmp,
        &input,
        &half,
        geo,
        16,
        OutputOrder::Score,
        NanPolicy::Largest,
        (&sp, &starts),
        Some((&ep, &ends)),
        "cpu",
    );

    let b: Vec<bf16> = raw.iter().map(|&x| bf16::from_f32(x)).collect();
    let input = tmp.path("b.npy");
    write_npy(&input, &[rows as u64, cols as u64], &b.iter().map(|x| x.to_bits()).collect::<Vec<u16>>());
    check_ranges(
        &tmp,
        &input,
        &b,
        geo,
        16,
        OutputOrder::Index,
        NanPolicy::Lowest,
        (&sp, &starts),
        Some((&ep, &ends)),
        "cpu",
    );
    let input = tmp.path("bi.npy");
    write_npy_with(
        &input,
        ">i2",
        npyz::Order::C,
        &[rows as u64, cols as u64],
        &b.iter().map(|x| x.to_bits() as i16).collect::<Vec<_>>(),
    );
    check_ranges(&tmp, &input, &b, geo, 16, OutputOrder::Score, NanPolicy::Lowest, (&sp, &starts), None, "cpu");

    // A 1-D input is one row: starts of one entry or a scalar, 1-D outputs.
    let input = tmp.path("row.npy");
    write_npy(&input, &[cols as u64], &raw[..cols]);
    let (s1, e1) = (tmp.path("s1.npy"), tmp.path("e1.npy"));
    write_npy(&s1, &[1], &[40i32]);
    write_scalar(&e1, 90i64);
    let geo = (1, cols, true);
    check_ranges(
        &tmp,
        &input,
        &raw[..cols],
        geo,
        10,
        OutputOrder::Score,
        NanPolicy::Lowest,
        (&s1, &[40]),
        Some((&e1, &[90])),
        "cpu",
    );
    write_scalar(&s1, 129i32);
    check_ranges(&tmp, &input, &raw[..cols], geo, 3, OutputOrder::Index, NanPolicy::Lowest, (&s1, &[129]), None, "cpu");
}

#[test]
fn select_starts_errors_are_clear() {
    let tmp = Tmp::new("ranges-errors");
    let input = tmp.path("s.npy");
    write_npy(&input, &[2, 6], &scores(12, 23));
    let (sp, ep, out) = (tmp.path("st.npy"), tmp.path("en.npy"), tmp.path("out.npy"));
    let sel = |extra: &[&str]| {
        let mut a = vec!["select", "--backend", "cpu", "--input", s(&input), "--k", "2", "--output", s(&out)];
        a.extend(extra);
        flashsel(&a)
    };
    let with_starts = |extra: &[&str]| {
        let mut a = vec!["--starts", s(&sp)];
        a.extend(extra);
        sel(&a)
    };
    write_npy(&ep, &[2], &[4i32, 6]);

    // dtype and shape.
    write_npy(&sp, &[2], &[1.0f32, 2.0]);
    assert_fails(&with_starts(&[]), 1, &["st.npy", "starts dtype", "<f4", "int32 (<i4) or int64 (<i8)"]);
    write_npy(&sp, &[2], &[1u32, 2]);
    assert_fails(&with_starts(&[]), 1, &["starts dtype", "<u4"]);
    write_npy(&sp, &[2, 1], &[1i32, 2]);
    assert_fails(&with_starts(&[]), 1, &["starts must be a scalar or 1-D", "(2, 1)"]);
    write_npy(&sp, &[3], &[1i32, 2, 3]);
    assert_fails(&with_starts(&[]), 1, &["starts has 3 entries", "2 rows"]);
    assert_fails(&sel(&["--starts", s(&tmp.path("nope.npy"))]), 1, &["cannot read", "nope.npy"]);

    // Values: negative, beyond the row's end, beyond cols, not int32.
    write_npy(&sp, &[2], &[-1i32, 0]);
    assert_fails(&with_starts(&["--lengths", s(&ep)]), 1, &["starts[0] = -1", "negative"]);
    write_npy(&sp, &[2], &[5i32, 0]);
    assert_fails(
        &with_starts(&["--lengths", s(&ep)]),
        1,
        &["st.npy", "starts[0] = 5", "beyond its row's end 4", "lengths[0]", "en.npy"],
    );
    write_scalar(&sp, 5i64);
    assert_fails(&with_starts(&["--lengths", s(&ep)]), 1, &["starts (a scalar, for every row) = 5", "end 4"]);
    write_npy(&sp, &[2], &[0i32, 7]);
    assert_fails(&with_starts(&[]), 1, &["starts[1] = 7", "beyond cols = 6", "0..=6"]);
    write_npy(&sp, &[2], &[0i64, 1 << 40]);
    assert_fails(&with_starts(&[]), 1, &["starts[1] = 1099511627776", "int32"]);
    // An end beyond cols is the lengths' error, also with --starts.
    write_npy(&sp, &[2], &[0i32, 0]);
    write_npy(&ep, &[2], &[4i32, 7]);
    assert_fails(&with_starts(&["--lengths", s(&ep)]), 1, &["en.npy", "lengths[1] = 7", "beyond cols = 6"]);
    assert!(!out.exists(), "a failed run leaves no output");

    // An explicit CUDA run without a GPU: the error of plain select, before anything is read.
    let o = flashsel_without_gpu(&[
        "select",
        "--backend",
        "cuda",
        "--input",
        s(&input),
        "--k",
        "2",
        "--output",
        s(&out),
        "--starts",
        s(&sp),
    ]);
    assert_fails(&o, 1, &["--backend cuda"]);
    assert!(!out.exists());
    // `auto` without a GPU runs on the CPU and says why with -v, once.
    let o = flashsel_without_gpu(&[
        "-v",
        "select",
        "--input",
        s(&input),
        "--k",
        "2",
        "--output",
        s(&out),
        "--starts",
        s(&sp),
    ]);
    assert_ok(&o);
    let err = stderr(&o);
    assert_eq!(err.matches("CUDA is not usable").count(), 1, "{err}");
    assert!(err.contains("over per-row ranges") && err.contains("on cpu"), "{err}");
    // An output over an input is refused.
    let o = flashsel(&["select", "--input", s(&input), "--k", "2", "--output", s(&sp), "--starts", s(&sp)]);
    assert_fails(&o, 1, &["refusing to overwrite the input", "--starts"]);
}

// ------------------------------------------------------------------- qsa

use flashsel::ops::qsa::{PageMap, QsaSelection, QsaSpec};

/// A page table for `qsa`: `[sequences, max_pages]`, the page size, and the
/// sequence of each row.
struct Pages {
    table: Vec<i32>,
    max_pages: usize,
    page_size: usize,
    seq_ids: Vec<i32>,
}

/// `flashsel::cpu::qsa_select` on the data a `qsa` run reads.
fn qsa_want<T: ScoreElem>(
    data: &[T],
    nb: usize,
    positions: &[i64],
    spec: &QsaSpec,
    pages: Option<&Pages>,
) -> QsaSelection {
    let view = ScoresView::new(data, positions.len(), nb).unwrap();
    let map = pages.map(|p| PageMap::new(&p.table, p.max_pages, p.page_size, &p.seq_ids).unwrap());
    flashsel::cpu::qsa_select(&view, positions, spec, map.as_ref()).unwrap()
}

/// Runs `flashsel qsa` on the CPU with `spec`'s options (written out in full
/// or left at their defaults, alternately) and checks both outputs against
/// the library, byte for byte.
#[allow(clippy::too_many_arguments)]
fn check_qsa<T: ScoreElem>(
    tmp: &Tmp,
    scores_path: &Path,
    data: &[T],
    nb: usize,
    positions_path: &Path,
    positions: &[i64],
    spec: &QsaSpec,
    pages: Option<(&Path, &Path, &Pages)>,
) {
    let (ids, counts) = (tmp.path("ids.npy"), tmp.path("counts.npy"));
    let (ratio, kb) = (spec.ratio.to_string(), spec.k_blocks.to_string());
    let mut args = vec!["qsa", "--scores", s(scores_path), "--positions", s(positions_path), "--ids", s(&ids)];
    args.extend(["--counts", s(&counts), "--backend", "cpu"]);
    args.extend(["--ratio", &ratio, "--k-blocks", &kb, "--order", spec.order.name(), "--nan", spec.nan.name()]);
    let ps = pages.map(|(_, _, p)| p.page_size.to_string());
    if let (Some((pt, q, _)), Some(ps)) = (pages, &ps) {
        args.extend(["--page-table", s(pt), "--seq-ids", s(q), "--page-size", ps]);
    }
    let o = flashsel(&args);
    assert_ok(&o);
    assert!(stderr(&o).is_empty(), "qsa should be quiet without -v: {}", stderr(&o));
    let want = qsa_want(data, nb, positions, spec, pages.map(|p| p.2));
    let rows = positions.len() as u64;
    let ctx = format!("{spec:?}, pages: {}", pages.is_some());
    assert_i32_npy(&ids, &[rows, spec.width() as u64], &want.ids, &ctx);
    assert_i32_npy(&counts, &[rows], &want.counts, &ctx);
}

/// Positions at every boundary of `V = (t + 1) / ratio` against `k_blocks`
/// (below, equal, one above, with and without a tail) and of `nb`.
fn qsa_positions(ratio: usize, k_blocks: usize, nb: usize) -> Vec<i64> {
    let (r, k, nb) = (ratio as i64, k_blocks as i64, nb as i64);
    let mut p = vec![0, r - 1, r, k * r - 1, k * r, k * r + r - 1, k * r + r, k * r + r + 1];
    p.extend([nb * r - 1, nb * r + r - 2, (nb / 2) * r + 1, (k + 7) * r + (r - 1) / 2, nb * r / 3]);
    p.retain(|&t| t >= 0 && (t + 1) / r <= nb);
    p
}

#[test]
fn qsa_matches_the_library_in_every_order_nan_policy_and_dtype() {
    let tmp = Tmp::new("qsa");
    for (ratio, k_blocks, nb) in [(4usize, 32usize, 300usize), (3, 7, 50), (1, 5, 9), (4, 512, 600)] {
        let positions = qsa_positions(ratio, k_blocks, nb);
        let rows = positions.len();
        let raw = scores(rows * nb, (ratio * 1000 + k_blocks) as u64);
        let pos_path = tmp.path("p.npy");
        write_npy(&pos_path, &[rows as u64], &positions);
        let shape = [rows as u64, nb as u64];

        let f32_path = tmp.path("s32.npy");
        write_npy(&f32_path, &shape, &raw);
        let half: Vec<f16> = raw.iter().map(|&x| f16::from_f32(x)).collect();
        let f16_path = tmp.path("s16.npy");
        write_npy(&f16_path, &shape, &half);
        let b: Vec<bf16> = raw.iter().map(|&x| bf16::from_f32(x)).collect();
        let bu_path = tmp.path("bu.npy");
        write_npy(&bu_path, &shape, &b.iter().map(|x| x.to_bits()).collect::<Vec<u16>>());
        let bi_path = tmp.path("bi.npy");
        write_npy(&bi_path, &shape, &b.iter().map(|x| x.to_bits() as i16).collect::<Vec<i16>>());
        for order in [OutputOrder::Index, OutputOrder::Score] {
            for nan in [NanPolicy::Lowest, NanPolicy::Largest] {
                let spec =
                    QsaSpec::new(rows, nb).with_ratio(ratio).with_k_blocks(k_blocks).with_order(order).with_nan(nan);
                check_qsa(&tmp, &f32_path, &raw, nb, &pos_path, &positions, &spec, None);
                check_qsa(&tmp, &f16_path, &half, nb, &pos_path, &positions, &spec, None);
                check_qsa(&tmp, &bu_path, &b, nb, &pos_path, &positions, &spec, None);
                check_qsa(&tmp, &bi_path, &b, nb, &pos_path, &positions, &spec, None);
            }
        }
    }
}

#[test]
fn qsa_defaults_big_endian_and_int32_positions() {
    let tmp = Tmp::new("qsa-defaults");
    let nb = 700;
    let positions = qsa_positions(4, 512, nb);
    let rows = positions.len();
    let raw = scores(rows * nb, 31);
    let input = tmp.path("s.npy");
    write_npy_with(&input, ">f4", npyz::Order::C, &[rows as u64, nb as u64], &raw);
    let pos = tmp.path("p.npy");
    write_npy_with(
        &pos,
        ">i4",
        npyz::Order::C,
        &[rows as u64],
        &positions.iter().map(|&t| t as i32).collect::<Vec<_>>(),
    );
    // The defaults: ratio 4, 512 blocks, index order, NaN lowest; no --counts.
    let ids = tmp.path("ids.npy");
    let o = flashsel(&["qsa", "--scores", s(&input), "--positions", s(&pos), "--ids", s(&ids)]);
    assert_ok(&o);
    let want = qsa_want(&raw, nb, &positions, &QsaSpec::new(rows, nb), None);
    assert_eq!(want.width, 2051);
    assert_i32_npy(&ids, &[rows as u64, 2051], &want.ids, "defaults");
    assert_eq!(dir_names(&tmp.0), ["ids.npy", "p.npy", "s.npy"]);

    // The worked example of docs/semantics.md.
    let ex = tmp.path("ex.npy");
    write_npy(&ex, &[4, 8], &[[0.5f32, 2.0, -1.0, 2.0, f32::NAN, 3.0, 0.0, 9.0]; 4].concat());
    write_npy(&pos, &[4], &[9i64, 22, 22, 31]);
    let counts = tmp.path("c.npy");
    let run = |extra: &[&str]| {
        let mut a = vec!["qsa", "--scores", s(&ex), "--positions", s(&pos), "--k-blocks", "2", "--ids", s(&ids)];
        a.extend(["--counts", s(&counts)]);
        a.extend(extra);
        assert_ok(&flashsel(&a));
        (read_npy::<i32>(&ids).2, read_npy::<i32>(&counts).2)
    };
    let (i, c) = run(&[]);
    assert_eq!(&i[..11], &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, -1]);
    assert_eq!(&i[11..22], &[4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22]);
    assert_eq!(c, [10, 11, 11, 8]);
    let (i, _) = run(&["--order", "score", "--nan", "largest"]);
    assert_eq!(&i[22..33], &[16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22]);
    let (i, _) = run(&["--order", "score"]);
    assert_eq!(&i[33..], &[28, 29, 30, 31, 20, 21, 22, 23, -1, -1, -1]);
}

#[test]
fn qsa_rows_that_see_at_most_k_blocks_are_causal_and_read_no_score() {
    let tmp = Tmp::new("qsa-short");
    let (nb, k) = (64, 16);
    // Every row sees V <= k_blocks: ids 0..=t, whatever the scores (all NaN here).
    let positions: Vec<i64> = (0..(k as i64 * 4 + 4)).step_by(3).collect();
    let rows = positions.len();
    let raw = vec![f32::NAN; rows * nb];
    let (input, pos) = (tmp.path("s.npy"), tmp.path("p.npy"));
    write_npy(&input, &[rows as u64, nb as u64], &raw);
    write_npy(&pos, &[rows as u64], &positions);
    for order in [OutputOrder::Index, OutputOrder::Score] {
        let spec = QsaSpec::new(rows, nb).with_k_blocks(k).with_order(order).with_nan(NanPolicy::Largest);
        check_qsa(&tmp, &input, &raw, nb, &pos, &positions, &spec, None);
        let want = qsa_want(&raw, nb, &positions, &spec, None);
        for (r, &t) in positions.iter().enumerate() {
            let n = t as usize + 1;
            assert!(want.row(r)[..n].iter().copied().eq(0..n as i32) && want.row(r)[n..].iter().all(|&x| x == -1));
        }
    }
    // No rows at all: empty outputs of the right shapes.
    write_npy::<f32>(&input, &[0, nb as u64], &[]);
    write_npy::<i64>(&pos, &[0], &[]);
    let spec = QsaSpec::new(0, nb).with_k_blocks(k);
    check_qsa(&tmp, &input, &[] as &[f32], nb, &pos, &[], &spec, None);
}

/// A page table of `sequences x max_pages` distinct pages, entries past
/// `used` pages left `-1` (no row reads them).
fn page_table(sequences: usize, max_pages: usize, used: usize) -> Vec<i32> {
    (0..sequences * max_pages).map(|i| if i % max_pages < used { ((i * 37 + 11) % 1009) as i32 } else { -1 }).collect()
}

#[test]
fn qsa_maps_tokens_through_a_page_table() {
    let tmp = Tmp::new("qsa-pages");
    let nb = 300;
    let positions = qsa_positions(4, 32, nb);
    let rows = positions.len();
    let raw = scores(rows * nb, 41);
    let (input, pos) = (tmp.path("s.npy"), tmp.path("p.npy"));
    write_npy(&input, &[rows as u64, nb as u64], &raw);
    write_npy(&pos, &[rows as u64], &positions);
    let max_t = *positions.iter().max().unwrap() as usize;
    let (pt, q) = (tmp.path("pt.npy"), tmp.path("q.npy"));
    for (page_size, int64) in [(64usize, false), (16, true), (1, false), (5000, true)] {
        let used = max_t / page_size + 1;
        let max_pages = used + 3;
        let pages = Pages {
            table: page_table(3, max_pages, used),
            max_pages,
            page_size,
            seq_ids: (0..rows).map(|i| (i % 3) as i32).collect(),
        };
        if int64 {
            write_npy(&pt, &[3, max_pages as u64], &pages.table.iter().map(|&x| i64::from(x)).collect::<Vec<_>>());
            write_npy_with(
                &q,
                ">i8",
                npyz::Order::C,
                &[rows as u64],
                &pages.seq_ids.iter().map(|&x| i64::from(x)).collect::<Vec<_>>(),
            );
        } else {
            write_npy_with(&pt, ">i4", npyz::Order::C, &[3, max_pages as u64], &pages.table);
            write_npy(&q, &[rows as u64], &pages.seq_ids);
        }
        for order in [OutputOrder::Index, OutputOrder::Score] {
            let spec = QsaSpec::new(rows, nb).with_k_blocks(32).with_order(order);
            check_qsa(&tmp, &input, &raw, nb, &pos, &positions, &spec, Some((&pt, &q, &pages)));
        }
    }
    // --page-size defaults to 64.
    let used = max_t / 64 + 1;
    let pages = Pages { table: page_table(1, used, used), max_pages: used, page_size: 64, seq_ids: vec![0; rows] };
    write_npy(&pt, &[1, used as u64], &pages.table);
    write_scalar(&q, 0i32);
    write_npy(&q, &[rows as u64], &pages.seq_ids);
    let ids = tmp.path("ids.npy");
    let o = flashsel(&[
        "qsa",
        "--scores",
        s(&input),
        "--positions",
        s(&pos),
        "--k-blocks",
        "32",
        "--ids",
        s(&ids),
        "--page-table",
        s(&pt),
        "--seq-ids",
        s(&q),
    ]);
    assert_ok(&o);
    let want = qsa_want(&raw, nb, &positions, &QsaSpec::new(rows, nb).with_k_blocks(32), Some(&pages));
    assert_i32_npy(&ids, &[rows as u64, want.width as u64], &want.ids, "default page size");
}

#[test]
fn qsa_errors_are_clear() {
    let tmp = Tmp::new("qsa-errors");
    let (rows, nb) = (3, 10);
    let input = tmp.path("s.npy");
    write_npy(&input, &[rows as u64, nb as u64], &scores(rows * nb, 51));
    let (pos, pt, q, ids, counts) =
        (tmp.path("p.npy"), tmp.path("pt.npy"), tmp.path("q.npy"), tmp.path("i.npy"), tmp.path("c.npy"));
    write_npy(&pos, &[3], &[5i64, 20, 39]);
    let qsa_on = |scores: &Path, extra: &[&str]| {
        let mut a = vec!["qsa", "--backend", "cpu", "--scores", s(scores), "--positions", s(&pos), "--k-blocks", "2"];
        a.extend(["--ids", s(&ids), "--counts", s(&counts)]);
        a.extend(extra);
        flashsel(&a)
    };
    let qsa = |extra: &[&str]| qsa_on(&input, extra);
    assert_ok(&qsa(&[]));
    std::fs::remove_file(&ids).unwrap();
    std::fs::remove_file(&counts).unwrap();

    // Scores.
    let bad = tmp.path("bad.npy");
    write_npy(&bad, &[3, 2], &[0.0f64; 6]);
    assert_fails(&qsa_on(&bad, &[]), 1, &["bad.npy", "unsupported dtype", "<f8", "float32"]);
    write_npy(&bad, &[10], &[0.0f32; 10]);
    assert_fails(&qsa_on(&bad, &[]), 1, &["bad.npy", "2-D", "1-D"]);
    write_npy(&bad, &[3, 2, 5], &[0.0f32; 30]);
    assert_fails(&qsa_on(&bad, &[]), 1, &["bad.npy", "3-D", "(3, 2, 5)"]);
    assert_fails(&qsa_on(&tmp.path("nope.npy"), &[]), 1, &["cannot read", "nope.npy"]);

    // Positions: dtype, shape, count, sign, and more blocks than the scores hold.
    write_npy(&pos, &[3], &[5.0f32, 20.0, 39.0]);
    assert_fails(&qsa(&[]), 1, &["p.npy", "positions dtype", "<f4", "int32 (<i4) or int64 (<i8)"]);
    write_npy(&pos, &[3, 1], &[5i64, 20, 39]);
    assert_fails(&qsa(&[]), 1, &["positions must be 1-D", "(3, 1)"]);
    write_scalar(&pos, 5i64);
    assert_fails(&qsa(&[]), 1, &["positions must be 1-D", "()"]);
    write_npy(&pos, &[2], &[5i64, 20]);
    assert_fails(&qsa(&[]), 1, &["positions has 2 entries", "3 rows"]);
    write_npy(&pos, &[3], &[5i32, -1, 39]);
    assert_fails(&qsa(&[]), 1, &["p.npy", "positions[1] = -1", "negative"]);
    write_npy(&pos, &[3], &[5i64, 20, 44]);
    assert_fails(&qsa(&[]), 1, &["positions[2] = 44", "11 blocks", "hold 10"]);
    write_npy(&pos, &[3], &[5i64, 20, 39]);

    // Page tables: both or neither, dtype, shape, the pages a row needs, seq ids.
    write_npy(&pt, &[2, 1], &[0i32, 1]);
    write_npy(&q, &[3], &[0i32, 1, 0]);
    assert_fails(&qsa(&["--page-table", s(&pt)]), 2, &["--seq-ids"]);
    assert_fails(&qsa(&["--seq-ids", s(&q)]), 2, &["--page-table"]);
    assert_fails(&qsa(&["--page-size", "16"]), 2, &["--page-table"]);
    let paged = |extra: &[&str]| {
        let mut a = vec!["--page-table", s(&pt), "--seq-ids", s(&q)];
        a.extend(extra);
        qsa(&a)
    };
    assert_ok(&paged(&[]));
    std::fs::remove_file(&ids).unwrap();
    std::fs::remove_file(&counts).unwrap();
    write_npy(&pt, &[2, 1], &[0.0f32, 1.0]);
    assert_fails(&paged(&[]), 1, &["pt.npy", "page_table dtype", "<f4"]);
    write_npy(&pt, &[2], &[0i32, 1]);
    assert_fails(&paged(&[]), 1, &["page_table must be 2-D", "(2,)"]);
    write_npy::<i32>(&pt, &[2, 0], &[]);
    assert_fails(&paged(&[]), 1, &["pt.npy", "(2, 0)", "no pages"]);
    write_npy_with(&pt, "<i4", npyz::Order::Fortran, &[2, 2], &[0i32, 1, 2, 3]);
    assert_fails(&paged(&[]), 1, &["page_table", "Fortran"]);
    write_npy(&pt, &[2, 1], &[0i64, 1 << 33]);
    assert_fails(&paged(&[]), 1, &["page_table[1, 0] = 8589934592", "int32"]);
    write_npy(&pt, &[2, 1], &[0i32, 1]);
    assert_fails(&paged(&["--page-size", "16"]), 1, &["token 16 is on page 1", "1 pages"]);
    write_npy(&pt, &[2, 1], &[0i32, -1]);
    assert_fails(&paged(&[]), 1, &["page_table entry", "page_table[1, 0] = -1", ">= 0"]);
    write_npy(&pt, &[2, 1], &[0i32, 1]);
    write_npy(&q, &[3], &[0i32, 2, 0]);
    assert_fails(&paged(&[]), 1, &["seq_ids[1] = 2", "outside 0..2"]);
    write_npy(&q, &[3], &[0i32, -1, 0]);
    assert_fails(&paged(&[]), 1, &["seq_ids[1] = -1"]);
    write_npy(&q, &[2], &[0i32, 1]);
    assert_fails(&paged(&[]), 1, &["q.npy", "seq_ids has 2 entries", "3 rows"]);
    write_npy(&q, &[3], &[0i64, 1 << 40, 0]);
    assert_fails(&paged(&[]), 1, &["seq_ids[1] = 1099511627776", "int32"]);
    write_npy(&q, &[3], &[0.5f32, 1.0, 0.0]);
    assert_fails(&paged(&[]), 1, &["seq_ids dtype", "<f4"]);

    // Options: zero is a usage error; a width beyond int32 is an error.
    let bare = |extra: &[&str]| {
        let mut a = vec!["qsa", "--scores", s(&input), "--positions", s(&pos), "--ids", s(&ids)];
        a.extend(extra);
        flashsel(&a)
    };
    for flag in ["--ratio", "--k-blocks", "--page-size"] {
        assert_fails(&bare(&[flag, "0"]), 2, &[flag, "at least 1"]);
    }
    assert_fails(&bare(&["--order", "best"]), 2, &["--order"]);
    assert_fails(&bare(&["--nan", "high"]), 2, &["--nan"]);
    assert_fails(&bare(&["--backend", "tpu"]), 2, &["--backend"]);
    assert_fails(&bare(&["--ratio", "3000000000", "--k-blocks", "1"]), 1, &["does not fit in i32"]);
    assert_fails(&flashsel(&["qsa", "--scores", s(&input), "--ids", s(&ids)]), 2, &["--positions"]);
    assert_fails(&flashsel(&["qsa", "--scores", s(&input), "--positions", s(&pos)]), 2, &["--ids"]);

    // Outputs.
    assert_fails(&bare(&["--counts", s(&ids)]), 1, &["--ids and --counts are the same file"]);
    assert_fails(&bare(&["--counts", s(&input)]), 1, &["refusing to overwrite the input", "--scores"]);
    let o = flashsel(&["qsa", "--scores", s(&input), "--positions", s(&pos), "--ids", s(&pos)]);
    assert_fails(&o, 1, &["refusing to overwrite the input", "--positions"]);
    let o = flashsel(&[
        "qsa",
        "--scores",
        s(&input),
        "--positions",
        s(&pos),
        "--page-table",
        s(&pt),
        "--seq-ids",
        s(&q),
        "--ids",
        s(&q),
    ]);
    assert_fails(&o, 1, &["refusing to overwrite the input", "--seq-ids"]);

    // An explicit CUDA run without a GPU is an error that names the flag.
    assert_fails(
        &flashsel_without_gpu(&[
            "qsa",
            "--backend",
            "cuda",
            "--scores",
            s(&input),
            "--positions",
            s(&pos),
            "--ids",
            s(&ids),
        ]),
        1,
        &["--backend cuda"],
    );
    assert_eq!(dir_names(&tmp.0), ["bad.npy", "p.npy", "pt.npy", "q.npy", "s.npy"], "no output or temporary is left");
}

#[test]
fn qsa_failed_runs_leave_existing_outputs_as_they_were() {
    let tmp = Tmp::new("qsa-keep");
    let input = tmp.path("s.npy");
    write_npy(&input, &[2, 8], &scores(16, 61));
    let pos = tmp.path("p.npy");
    write_npy(&pos, &[2], &[7i64, 31]);
    let (ids, counts) = (tmp.path("i.npy"), tmp.path("c.npy"));
    std::fs::write(&ids, "keep\n").unwrap();
    std::fs::write(&counts, "keep too\n").unwrap();
    let qsa = |counts: &Path| {
        flashsel(&[
            "qsa",
            "--scores",
            s(&input),
            "--positions",
            s(&pos),
            "--k-blocks",
            "2",
            "--ids",
            s(&ids),
            "--counts",
            s(counts),
        ])
    };
    // --counts cannot be written: --ids is not touched.
    assert_fails(&qsa(&tmp.path("nope/c.npy")), 1, &["cannot write --counts", "nope/c.npy"]);
    assert_eq!(std::fs::read_to_string(&ids).unwrap(), "keep\n");
    // The library refuses the request (a position past the blocks): both stay.
    write_npy(&pos, &[2], &[7i64, 35]);
    assert_fails(&qsa(&counts), 1, &["positions[1] = 35", "9 blocks", "hold 8"]);
    assert_eq!(std::fs::read_to_string(&ids).unwrap(), "keep\n");
    assert_eq!(std::fs::read_to_string(&counts).unwrap(), "keep too\n");
    assert_eq!(dir_names(&tmp.0), ["c.npy", "i.npy", "p.npy", "s.npy"]);
    // A run that succeeds replaces both and leaves nothing else; -v says where it ran (auto
    // without a GPU: the CPU, and why).
    write_npy(&pos, &[2], &[7i64, 31]);
    let o = flashsel_without_gpu(&[
        "-v",
        "qsa",
        "--scores",
        s(&input),
        "--positions",
        s(&pos),
        "--k-blocks",
        "2",
        "--ids",
        s(&ids),
        "--counts",
        s(&counts),
    ]);
    assert_ok(&o);
    let err = stderr(&o);
    assert!(err.contains("CUDA is not usable") && err.contains("ids [2, 11] on cpu"), "{err}");
    assert_eq!(read_npy::<i32>(&counts).2, [8, 8]);
    assert_eq!(dir_names(&tmp.0), ["c.npy", "i.npy", "p.npy", "s.npy"]);
}

// ---------------------------------------------- select --page-table (KV slots)

/// The slot of column `col` of a row of sequence `seq` (the contract of
/// `flashsel::ops::pages`, written out here independently).
fn slot_of(p: &Pages, seq: usize, col: i32) -> i32 {
    if col < 0 {
        return col;
    }
    let (ps, col) = (p.page_size, col as usize);
    p.table[seq * p.max_pages + col / ps] * ps as i32 + (col % ps) as i32
}

/// Runs `select --page-table` (with `--starts` / `--lengths` when given) on
/// `backend` and checks both outputs against
/// `flashsel::cpu::select_ranges_paged`, and the slots against the page
/// table applied by hand to the plain selection's columns.
#[allow(clippy::too_many_arguments)]
fn check_paged<T: ScoreElem>(
    tmp: &Tmp,
    input: &Path,
    data: &[T],
    (rows, cols, one_d): (usize, usize, bool),
    (k, order, nan): (usize, OutputOrder, NanPolicy),
    starts: Option<(&Path, &[i32])>,
    ends: Option<(&Path, &[i32])>,
    (pt, q, pages): (&Path, &Path, &Pages),
    backend: &str,
) {
    let (out, vals) = (tmp.path("pi.npy"), tmp.path("pv.npy"));
    let (ks, ps) = (k.to_string(), pages.page_size.to_string());
    let mut args = vec!["select", "--backend", backend, "--input", s(input), "--k", &ks, "--order", order.name()];
    args.extend(["--nan", nan.name(), "--output", s(&out), "--values", s(&vals)]);
    args.extend(["--page-table", s(pt), "--seq-ids", s(q), "--page-size", &ps]);
    if let Some((p, _)) = starts {
        args.extend(["--starts", s(p)]);
    }
    if let Some((p, _)) = ends {
        args.extend(["--lengths", s(p)]);
    }
    let o = flashsel(&args);
    assert_ok(&o);
    assert!(stderr(&o).is_empty(), "{}", stderr(&o));

    let view = ScoresView::new(data, rows, cols).unwrap();
    let spec = view.spec(k).with_order(order).with_nan(nan);
    let map = PageMap::new(&pages.table, pages.max_pages, pages.page_size, &pages.seq_ids).unwrap();
    let (st, en) = (starts.map(|x| x.1), ends.map(|x| x.1));
    let want = flashsel::cpu::select_ranges_paged(&view, &spec, st, en, &map).unwrap();
    let plain = match st {
        Some(st) => flashsel::cpu::select_ranges(&view, &spec, st, en).unwrap(),
        None => flashsel::cpu::select(&view, &spec, en).unwrap(),
    };
    let by_hand: Vec<i32> =
        plain.indices.iter().enumerate().map(|(i, &c)| slot_of(pages, pages.seq_ids[i / k] as usize, c)).collect();
    assert_eq!(want.indices, by_hand, "the library's slots");
    let shape = if one_d { vec![k as u64] } else { vec![rows as u64, k as u64] };
    let ctx = format!("k={k} {order:?} {nan:?} page_size={} starts={st:?} ends={en:?}", pages.page_size);
    assert_i32_npy(&out, &shape, &want.indices, &ctx);
    let (vshape, _, got) = read_bits(&vals);
    assert_eq!(vshape, shape);
    // The values are the selected scores, as without a page table.
    assert_eq!(got, plain.values.iter().map(|x| x.bits()).collect::<Vec<_>>(), "value bits, {ctx}");
}

/// Writes a page table and seq ids as int32 or (big-endian) int64.
fn write_pages(pt: &Path, q: &Path, p: &Pages, int64: bool) {
    let sequences = (p.table.len() / p.max_pages) as u64;
    if int64 {
        write_npy(pt, &[sequences, p.max_pages as u64], &p.table.iter().map(|&x| i64::from(x)).collect::<Vec<_>>());
        let seqs: Vec<i64> = p.seq_ids.iter().map(|&x| i64::from(x)).collect();
        write_npy_with(q, ">i8", npyz::Order::C, &[p.seq_ids.len() as u64], &seqs);
    } else {
        write_npy_with(pt, ">i4", npyz::Order::C, &[sequences, p.max_pages as u64], &p.table);
        write_npy(q, &[p.seq_ids.len() as u64], &p.seq_ids);
    }
}

#[test]
fn select_writes_kv_slots_through_a_page_table() {
    let tmp = Tmp::new("paged");
    let (rows, cols) = (7, 200);
    let data = scores(rows * cols, 71);
    let input = tmp.path("s.npy");
    write_npy(&input, &[rows as u64, cols as u64], &data);
    // Empty (row 1), one-column (row 5), short and whole ranges.
    let starts = [0i32, 50, 3, 64, 190, 199, 0];
    let ends = [200i32, 50, 130, 200, 200, 200, 70];
    let (sp, ep, pt, q) = (tmp.path("st.npy"), tmp.path("en.npy"), tmp.path("pt.npy"), tmp.path("q.npy"));
    write_npy(&sp, &[rows as u64], &starts);
    write_npy(&ep, &[rows as u64], &ends);
    let geo = (rows, cols, false);
    for (page_size, int64) in [(16usize, true), (64, false), (1, false), (5000, true)] {
        let used = cols.div_ceil(page_size);
        let max_pages = used + 2;
        let pages = Pages {
            table: page_table(3, max_pages, used),
            max_pages,
            page_size,
            seq_ids: (0..rows).map(|i| ((i * 2) % 3) as i32).collect(),
        };
        write_pages(&pt, &q, &pages, int64);
        let paged = (pt.as_path(), q.as_path(), &pages);
        for k in [1, 5, 64, 250] {
            for (order, nan) in [(OutputOrder::Score, NanPolicy::Lowest), (OutputOrder::Index, NanPolicy::Largest)] {
                let opts = (k, order, nan);
                check_paged(&tmp, &input, &data, geo, opts, Some((&sp, &starts)), Some((&ep, &ends)), paged, "cpu");
                check_paged(&tmp, &input, &data, geo, opts, None, Some((&ep, &ends)), paged, "cpu");
                check_paged(&tmp, &input, &data, geo, opts, None, None, paged, "cpu");
            }
        }
        // Starts without ends (ranges to cols); the default backend (auto) too.
        let opts = (8, OutputOrder::Score, NanPolicy::Lowest);
        check_paged(&tmp, &input, &data, geo, opts, Some((&sp, &starts)), None, paged, "auto");
    }

    // f16 and bf16 bits: the values stay in the input's dtype.
    let pages = Pages { table: page_table(1, 4, 4), max_pages: 4, page_size: 64, seq_ids: vec![0; rows] };
    write_pages(&pt, &q, &pages, false);
    let paged = (pt.as_path(), q.as_path(), &pages);
    let opts = (10, OutputOrder::Index, NanPolicy::Lowest);
    let half: Vec<f16> = data.iter().map(|&x| f16::from_f32(x)).collect();
    let hp = tmp.path("h.npy");
    write_npy(&hp, &[rows as u64, cols as u64], &half);
    check_paged(&tmp, &hp, &half, geo, opts, Some((&sp, &starts)), Some((&ep, &ends)), paged, "cpu");
    let b: Vec<bf16> = data.iter().map(|&x| bf16::from_f32(x)).collect();
    let bp = tmp.path("b.npy");
    write_npy(&bp, &[rows as u64, cols as u64], &b.iter().map(|x| x.to_bits()).collect::<Vec<u16>>());
    check_paged(&tmp, &bp, &b, geo, opts, None, None, paged, "cpu");

    // A 1-D input is one row: one seq id, 1-D outputs.
    let rp = tmp.path("row.npy");
    write_npy(&rp, &[cols as u64], &data[..cols]);
    let one = Pages { table: page_table(2, 4, 4), max_pages: 4, page_size: 64, seq_ids: vec![1] };
    write_pages(&pt, &q, &one, false);
    let (s1, e1) = (tmp.path("s1.npy"), tmp.path("e1.npy"));
    write_scalar(&s1, 70i32);
    write_scalar(&e1, 180i64);
    let paged = (pt.as_path(), q.as_path(), &one);
    let opts = (12, OutputOrder::Score, NanPolicy::Largest);
    check_paged(&tmp, &rp, &data[..cols], (1, cols, true), opts, Some((&s1, &[70])), Some((&e1, &[180])), paged, "cpu");

    // Pages no row reaches may be anything: with every range from column 64,
    // page 0 (of 64 tokens) may be -1; without the ranges it is an error.
    let from_64 = [64i32; 7];
    let s64 = tmp.path("s64.npy");
    write_npy(&s64, &[rows as u64], &from_64);
    let mut holes = Pages { table: page_table(1, 4, 4), max_pages: 4, page_size: 64, seq_ids: vec![0; rows] };
    holes.table[0] = -1;
    write_pages(&pt, &q, &holes, false);
    let paged = (pt.as_path(), q.as_path(), &holes);
    let opts = (6, OutputOrder::Score, NanPolicy::Lowest);
    check_paged(&tmp, &input, &data, geo, opts, Some((&s64, &from_64)), None, paged, "cpu");
    let out = tmp.path("o.npy");
    let o = flashsel(&[
        "select",
        "--backend",
        "cpu",
        "--input",
        s(&input),
        "--k",
        "6",
        "--output",
        s(&out),
        "--page-table",
        s(&pt),
        "--seq-ids",
        s(&q),
    ]);
    assert_fails(&o, 1, &["page_table entry", "page_table[0, 0] = -1", ">= 0"]);
    assert!(!out.exists());

    // --page-size defaults to 64; -v says the indices are slots.
    let pages = Pages { table: page_table(1, 4, 4), max_pages: 4, page_size: 64, seq_ids: vec![0; rows] };
    write_pages(&pt, &q, &pages, false);
    let o = flashsel_without_gpu(&[
        "-v",
        "select",
        "--input",
        s(&input),
        "--k",
        "9",
        "--output",
        s(&out),
        "--page-table",
        s(&pt),
        "--seq-ids",
        s(&q),
    ]);
    assert_ok(&o);
    let err = stderr(&o);
    assert!(err.contains("as KV slots through the page table") && err.contains("on cpu"), "{err}");
    let view = ScoresView::new(&data, rows, cols).unwrap();
    let map = PageMap::new(&pages.table, 4, 64, &pages.seq_ids).unwrap();
    let want = flashsel::cpu::select_ranges_paged(&view, &view.spec(9), None, None, &map).unwrap();
    assert_i32_npy(&out, &[rows as u64, 9], &want.indices, "default page size");
}

#[test]
fn select_page_table_errors_are_clear() {
    let tmp = Tmp::new("paged-errors");
    let input = tmp.path("s.npy");
    write_npy(&input, &[3, 40], &scores(120, 81));
    let (pt, q, sp, out) = (tmp.path("pt.npy"), tmp.path("q.npy"), tmp.path("st.npy"), tmp.path("out.npy"));
    write_npy(&pt, &[2, 3], &[0i32, 1, 2, 3, 4, 5]);
    write_npy(&q, &[3], &[0i32, 1, 0]);
    write_npy(&sp, &[3], &[0i32, 4, 8]);
    let sel = |extra: &[&str]| {
        let mut a = vec!["select", "--backend", "cpu", "--input", s(&input), "--k", "4", "--output", s(&out)];
        a.extend(extra);
        flashsel(&a)
    };
    let paged = |extra: &[&str]| {
        let mut a = vec!["--page-table", s(&pt), "--seq-ids", s(&q), "--page-size", "16"];
        a.extend(extra);
        sel(&a)
    };
    assert_ok(&paged(&[]));
    assert_ok(&paged(&["--starts", s(&sp)]));
    std::fs::remove_file(&out).unwrap();

    // Usage: both files or neither; --page-size needs the table and is at least 1.
    assert_fails(&sel(&["--page-table", s(&pt)]), 2, &["--seq-ids"]);
    assert_fails(&sel(&["--seq-ids", s(&q)]), 2, &["--page-table"]);
    assert_fails(&sel(&["--page-size", "16"]), 2, &["--page-table"]);
    let zero = ["--page-table", s(&pt), "--seq-ids", s(&q), "--page-size", "0"];
    assert_fails(&sel(&zero), 2, &["--page-size", "at least 1"]);

    // The table: dtype, shape, the pages a row reaches, its entries.
    write_npy(&pt, &[2, 3], &[0.0f32; 6]);
    assert_fails(&paged(&[]), 1, &["pt.npy", "page_table dtype", "<f4"]);
    write_npy(&pt, &[6], &[0i32, 1, 2, 3, 4, 5]);
    assert_fails(&paged(&[]), 1, &["page_table must be 2-D", "(6,)"]);
    write_npy(&pt, &[2, 2], &[0i32, 1, 2, 3]);
    assert_fails(&paged(&[]), 1, &["token 32 is on page 2", "2 pages"]);
    write_npy(&pt, &[2, 3], &[0i32, 1, 2, 3, -4, 5]);
    assert_fails(&paged(&[]), 1, &["page_table entry", "page_table[1, 1] = -4"]);
    write_npy(&pt, &[2, 3], &[0i64, 1, 2, 3, 4, 1 << 40]);
    assert_fails(&paged(&[]), 1, &["page_table[1, 2] = 1099511627776", "int32"]);
    write_npy(&pt, &[2, 3], &[0i32, 1, 2, 3, 4, i32::MAX / 8]);
    assert_fails(&paged(&[]), 1, &["KV slot", "does not fit in i32"]);
    write_npy(&pt, &[2, 3], &[0i32, 1, 2, 3, 4, 5]);

    // Seq ids: count, range, dtype.
    write_npy(&q, &[2], &[0i32, 1]);
    assert_fails(&paged(&[]), 1, &["q.npy", "seq_ids has 2 entries", "3 rows"]);
    write_npy(&q, &[3], &[0i32, 2, 0]);
    assert_fails(&paged(&[]), 1, &["seq_ids[1] = 2", "outside 0..2"]);
    write_npy(&q, &[3], &[0.0f32, 1.0, 0.0]);
    assert_fails(&paged(&[]), 1, &["seq_ids dtype", "<f4"]);
    write_npy(&q, &[3], &[0i32, 1, 0]);

    // Outputs over the new inputs are refused.
    let o = flashsel(&[
        "select",
        "--input",
        s(&input),
        "--k",
        "4",
        "--page-table",
        s(&pt),
        "--seq-ids",
        s(&q),
        "--output",
        s(&pt),
    ]);
    assert_fails(&o, 1, &["refusing to overwrite the input", "--page-table"]);
    let o = flashsel(&[
        "select",
        "--input",
        s(&input),
        "--k",
        "4",
        "--page-table",
        s(&pt),
        "--seq-ids",
        s(&q),
        "--output",
        s(&out),
        "--values",
        s(&q),
    ]);
    assert_fails(&o, 1, &["refusing to overwrite the input", "--seq-ids"]);
    // An explicit CUDA run without a GPU fails before reading anything.
    let o = flashsel_without_gpu(&[
        "select",
        "--backend",
        "cuda",
        "--input",
        s(&tmp.path("missing.npy")),
        "--k",
        "4",
        "--page-table",
        s(&pt),
        "--seq-ids",
        s(&q),
        "--output",
        s(&out),
    ]);
    assert_fails(&o, 1, &["--backend cuda"]);
    assert!(!stderr(&o).contains("missing.npy"), "{}", stderr(&o));
    assert_eq!(dir_names(&tmp.0), ["pt.npy", "q.npy", "s.npy", "st.npy"], "no output or temporary is left");
}

// ---------------------------------------------------------- CUDA token paths

#[test]
#[ignore = "needs a CUDA GPU: cargo test -p flashsel-cli --test cli -- --ignored gpu_"]
fn gpu_select_ranges_and_slots_on_cuda_match_the_cpu() {
    let tmp = Tmp::new("gpu-ranges");
    let (rows, cols) = (7, 5000);
    let data = scores(rows * cols, 91);
    let input = tmp.path("s.npy");
    write_npy(&input, &[rows as u64, cols as u64], &data);
    let starts = [0i32, 50, 3, 64, 4990, 4999, 0];
    let ends = [5000i32, 50, 1300, 5000, 5000, 5000, 700];
    let (sp, ep, pt, q) = (tmp.path("st.npy"), tmp.path("en.npy"), tmp.path("pt.npy"), tmp.path("q.npy"));
    write_npy(&sp, &[rows as u64], &starts);
    write_npy(&ep, &[rows as u64], &ends);
    let geo = (rows, cols, false);
    let used = cols.div_ceil(64);
    let pages =
        Pages { table: page_table(3, used, used), max_pages: used, page_size: 64, seq_ids: vec![2, 0, 1, 1, 0, 2, 0] };
    write_pages(&pt, &q, &pages, false);
    let paged = (pt.as_path(), q.as_path(), &pages);
    for k in [1, 64, 2048] {
        for (order, nan) in [(OutputOrder::Score, NanPolicy::Lowest), (OutputOrder::Index, NanPolicy::Largest)] {
            check_ranges(&tmp, &input, &data, geo, k, order, nan, (&sp, &starts), Some((&ep, &ends)), "cuda");
            let opts = (k, order, nan);
            check_paged(&tmp, &input, &data, geo, opts, Some((&sp, &starts)), Some((&ep, &ends)), paged, "cuda");
            check_paged(&tmp, &input, &data, geo, opts, None, None, paged, "cuda");
        }
    }
    // -v says where it ran.
    let out = tmp.path("o.npy");
    let o = flashsel(&[
        "-v",
        "select",
        "--backend",
        "cuda",
        "--input",
        s(&input),
        "--k",
        "16",
        "--starts",
        s(&sp),
        "--output",
        s(&out),
    ]);
    assert_ok(&o);
    assert!(stderr(&o).contains("over per-row ranges") && stderr(&o).contains("on cuda"), "{}", stderr(&o));
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test -p flashsel-cli --test cli -- --ignored gpu_"]
fn gpu_qsa_on_cuda_matches_the_cpu() {
    let tmp = Tmp::new("gpu-qsa");
    let nb = 3000;
    let positions = qsa_positions(4, 512, nb);
    let rows = positions.len();
    let raw = scores(rows * nb, 92);
    let b: Vec<bf16> = raw.iter().map(|&x| bf16::from_f32(x)).collect();
    let (input, pos, ids, counts) = (tmp.path("s.npy"), tmp.path("p.npy"), tmp.path("i.npy"), tmp.path("c.npy"));
    write_npy(&input, &[rows as u64, nb as u64], &b.iter().map(|x| x.to_bits()).collect::<Vec<u16>>());
    write_npy(&pos, &[rows as u64], &positions);
    let max_t = *positions.iter().max().unwrap() as usize;
    let used = max_t / 64 + 1;
    let pages = Pages { table: page_table(2, used, used), max_pages: used, page_size: 64, seq_ids: vec![1; rows] };
    let (pt, q) = (tmp.path("pt.npy"), tmp.path("q.npy"));
    write_pages(&pt, &q, &pages, true);
    for order in [OutputOrder::Index, OutputOrder::Score] {
        for with_pages in [false, true] {
            let mut args = vec!["-v", "qsa", "--backend", "cuda", "--scores", s(&input), "--positions", s(&pos)];
            args.extend(["--order", order.name(), "--ids", s(&ids), "--counts", s(&counts)]);
            if with_pages {
                args.extend(["--page-table", s(&pt), "--seq-ids", s(&q)]);
            }
            let o = flashsel(&args);
            assert_ok(&o);
            assert!(stderr(&o).contains("on cuda"), "{}", stderr(&o));
            let spec = QsaSpec::new(rows, nb).with_order(order);
            let want = qsa_want(&b, nb, &positions, &spec, with_pages.then_some(&pages));
            let ctx = format!("{order:?} pages {with_pages}");
            assert_i32_npy(&ids, &[rows as u64, 2051], &want.ids, &ctx);
            assert_i32_npy(&counts, &[rows as u64], &want.counts, &ctx);
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test -p flashsel-cli --test cli -- --ignored gpu_"]
fn gpu_bench_token_rows_on_cuda_are_verified_against_the_cpu() {
    let tmp = Tmp::new("gpu-bench");
    let json = tmp.path("b.json");
    let o = flashsel(&["bench", "--quick", "--backend", "cuda", "--only", "qsa,dsa", "--json", s(&json)]);
    assert_ok(&o);
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["backend"], "cuda");
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 12);
    for r in results {
        assert_eq!(r["ok"], true, "{r}");
        assert!(r["verified"].as_str().unwrap().contains("cpu all"), "{r}");
        assert!(r["floor_us"].as_f64().unwrap() > 0.0, "{r}");
    }
}
