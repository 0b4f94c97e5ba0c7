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
    let o = flashsel_without_gpu(&["info"]);
    assert_ok(&o);
    let out = stdout(&o);
    assert!(out.contains("cuda  unavailable: ") && out.contains("auto picks: cpu"), "{out}");
    let o = flashsel(&["--version"]);
    assert_ok(&o);
    assert!(stdout(&o).contains(env!("CARGO_PKG_VERSION")));
}
