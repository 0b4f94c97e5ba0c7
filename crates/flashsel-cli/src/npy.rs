//! `.npy` input and output for `flashsel select`, over the `npyz` crate.
//!
//! npyz parses the header, converts big-endian data and writes the files.
//! What is ours:
//! - the bfloat16 convention: NumPy has no bfloat16, so `<u2`/`<i2` (either
//!   byte order) hold bf16 bit patterns, and values go back out in the same
//!   16-bit integer dtype, little-endian;
//! - which dtypes and shapes are accepted, each refusal naming what is;
//! - two guards npyz lacks: the header length is bounded before npyz allocates
//!   it (npyz allocates whatever length the file declares, up to 4 GiB), and
//!   the element count is a checked product compared with the file's size
//!   before any data is read (npyz's own count is an unchecked product);
//! - fallible allocation of the data, so an input too large for memory is an
//!   error, never an abort.
//!
//! Cost: npyz converts element by element, about 1.3 GB/s from the page cache
//! (a chunked read of our own measured 2.2 GB/s; 0.20 s against 0.12 s for
//! 256 MB of f32). Nothing here panics on a bad file.

use std::fs::File;
use std::io::{self, BufReader, Read, Seek, Write};
use std::path::Path;

use half::{bf16, f16};
use npyz::{DType, Endianness, NpyFile, NpyHeader, Order, TypeChar, TypeStr, WriterBuilder};

/// The longest header accepted, in bytes: far above what NumPy writes for any
/// array this tool reads (under 128 bytes), small enough to allocate anywhere.
const MAX_HEADER_BYTES: u32 = 1 << 20;

/// Reader and writer buffer size: large enough that the per-call cost vanishes.
const IO_BUFFER_BYTES: usize = 1 << 20;

const SCORE_DTYPES: &str = "float32 (<f4), float16 (<f2), or bfloat16 bits as uint16/int16 (<u2/<i2)";

/// The scores of an input file, in the element type they are selected as.
pub enum Scores {
    F32(Vec<f32>),
    F16(Vec<f16>),
    /// bfloat16 bit patterns, read from a `u2` (`signed == false`) or `i2` file.
    Bf16 {
        data: Vec<bf16>,
        signed: bool,
    },
}

/// A score matrix read from a file.
pub struct Matrix {
    pub rows: usize,
    pub cols: usize,
    /// `true` when the file held a 1-D array: one row, and 1-D outputs.
    pub one_d: bool,
    /// The dtype string as written in the file, e.g. `>f4`.
    pub descr: String,
    pub scores: Scores,
}

impl Matrix {
    /// The dtype the selected values are written in: the input's, little-endian.
    pub fn values_dtype(&self) -> &'static str {
        match self.scores {
            Scores::F32(_) => "<f4",
            Scores::F16(_) => "<f2",
            Scores::Bf16 { signed: false, .. } => "<u2",
            Scores::Bf16 { signed: true, .. } => "<i2",
        }
    }

    /// The shape of each output: `[k]` for a 1-D input, else `[rows, k]`.
    pub fn output_shape(&self, k: usize) -> Vec<u64> {
        if self.one_d {
            vec![k as u64]
        } else {
            vec![self.rows as u64, k as u64]
        }
    }
}

/// `(3, 4)`, `(5,)`, `()` as NumPy prints them.
fn shape_str(shape: &[u64]) -> String {
    match shape {
        [n] => format!("({n},)"),
        _ => format!("({})", shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")),
    }
}

/// An open `.npy` file whose header npyz parsed, positioned at its data.
struct NpyIn {
    path: String,
    header: NpyHeader,
    /// The plain dtype (structured and pickled dtypes are refused on opening).
    dtype: TypeStr,
    reader: BufReader<File>,
    /// Bytes in the file after the header.
    data_bytes: u64,
}

fn open(path: &Path) -> Result<NpyIn, String> {
    let p = path.display().to_string();
    let file = File::open(path).map_err(|e| format!("cannot read {p}: {e}"))?;
    let meta = file.metadata().map_err(|e| format!("cannot read {p}: {e}"))?;
    if meta.is_dir() {
        return Err(format!("cannot read {p}: it is a directory"));
    }
    let mut reader = BufReader::with_capacity(IO_BUFFER_BYTES, file);
    let invalid = |e: &dyn std::fmt::Display| format!("{p}: not a valid .npy file: {e}");
    check_header_length(&mut reader).map_err(|e| invalid(&e))?;
    let header = NpyHeader::from_reader(&mut reader).map_err(|e| invalid(&e))?;
    let data_start = reader.stream_position().map_err(|e| format!("cannot read {p}: {e}"))?;
    let dtype = match header.dtype() {
        DType::Plain(t) if !t.uses_pickled_array() => t,
        DType::Plain(t) => return Err(format!("{p}: unsupported dtype '{t}' (Python objects)")),
        _ => return Err(format!("{p}: structured (record) dtypes are not supported")),
    };
    Ok(NpyIn { path: p, header, dtype, reader, data_bytes: meta.len().saturating_sub(data_start) })
}

/// Refuses a header length beyond [`MAX_HEADER_BYTES`] before npyz allocates
/// it; leaves `r` at the start of the file. Magic and version are npyz's to check.
fn check_header_length(r: &mut BufReader<File>) -> io::Result<()> {
    let mut pre = [0u8; 12];
    let got = read_up_to(r, &mut pre)?;
    r.rewind()?;
    // Versions 2 and 3 store the length in 4 bytes; version 1's 2 bytes are small anyway.
    if got == pre.len() && pre.starts_with(b"\x93NUMPY") && matches!(pre[6], 2 | 3) {
        let len = u32::from_le_bytes([pre[8], pre[9], pre[10], pre[11]]);
        if len > MAX_HEADER_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("header length {len} is implausible (at most {MAX_HEADER_BYTES})"),
            ));
        }
    }
    Ok(())
}

/// Reads until `buf` is full or the input ends; returns the bytes read.
fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

impl NpyIn {
    /// The element count, checked against overflow and against the bytes the
    /// file holds, so a corrupt or hostile shape never reaches an allocation.
    fn element_count(&self) -> Result<usize, String> {
        let shape = self.header.shape();
        let too_big = || format!("{}: shape {} is too large", self.path, shape_str(shape));
        let n = shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d)).ok_or_else(too_big)?;
        let size = self.dtype.num_bytes().unwrap_or(0) as u64;
        let bytes = n.checked_mul(size).ok_or_else(too_big)?;
        if self.data_bytes < bytes {
            return Err(format!(
                "{}: truncated: shape {} of {} needs {bytes} bytes of data but the file holds {}",
                self.path,
                shape_str(shape),
                self.dtype,
                self.data_bytes
            ));
        }
        usize::try_from(n).map_err(|_| too_big())
    }

    /// Reads every element as `T` (npyz converts the byte order) and maps it
    /// with `conv` into a vector reserved up front, fallibly.
    fn read_all<T: npyz::Deserialize, U>(self, what: &str, conv: impl Fn(T) -> U) -> Result<Vec<U>, String> {
        let n = self.element_count()?;
        let mut out = Vec::new();
        out.try_reserve_exact(n).map_err(|_| {
            let bytes = n as u128 * std::mem::size_of::<U>() as u128;
            format!("{}: out of memory: {what} need {bytes} bytes", self.path)
        })?;
        let path = self.path;
        let elems = NpyFile::with_header(self.header, self.reader).data::<T>().map_err(|e| format!("{path}: {e}"))?;
        let mut failure = None;
        out.extend(elems.map_while(|r| r.map_err(|e| failure = Some(e)).ok()).map(conv));
        match failure {
            Some(e) => Err(format!("cannot read {path}: {e}")),
            None => Ok(out),
        }
    }
}

/// Reads a 1-D or 2-D C-order score matrix of f32, f16, or bf16 bits (u2/i2),
/// in either byte order. A 1-D array is one row (and a 1-D array in Fortran
/// order is the same bytes).
pub fn read_scores(path: &Path) -> Result<Matrix, String> {
    let f = open(path)?;
    let t = f.dtype.clone();
    let kind = (t.type_char(), t.size_field());
    if !matches!(kind, (TypeChar::Float, 4 | 2) | (TypeChar::Uint | TypeChar::Int, 2)) {
        let hint = match kind {
            (TypeChar::Float, 8) => " (float64: convert with .astype(np.float32))",
            (TypeChar::RawData, 2) => {
                " (a 2-byte void type, e.g. ml_dtypes bfloat16: pass its bits with .view(np.uint16))"
            }
            _ => "",
        };
        return Err(format!("{}: unsupported dtype '{t}'{hint}; scores must be {SCORE_DTYPES}", f.path));
    }
    let shape = f.header.shape().to_vec();
    let (rows, cols, one_d) = match shape.as_slice() {
        [n] => (1, *n, true),
        [r, c] => (*r, *c, false),
        s => {
            return Err(format!(
                "{}: scores must be 1-D or 2-D, got a {}-D array of shape {}",
                f.path,
                s.len(),
                shape_str(s)
            ))
        }
    };
    if f.header.order() == Order::Fortran && !one_d {
        return Err(format!(
            "{}: the array is in Fortran (column-major) order; save it in C order (np.ascontiguousarray) first",
            f.path
        ));
    }
    // Both fit: rows * cols was checked against the file size by read_all.
    let (rows, cols) = (rows as usize, cols as usize);
    let scores = match kind {
        (TypeChar::Float, 4) => Scores::F32(f.read_all("the scores", |x: f32| x)?),
        (TypeChar::Float, _) => Scores::F16(f.read_all("the scores", |x: f16| x)?),
        (TypeChar::Uint, _) => Scores::Bf16 { data: f.read_all("the scores", bf16::from_bits)?, signed: false },
        _ => Scores::Bf16 { data: f.read_all("the scores", |x: i16| bf16::from_bits(x as u16))?, signed: true },
    };
    Ok(Matrix { rows, cols, one_d, descr: t.to_string(), scores })
}

/// An integer input read whole: int32 or int64 (either byte order), widened.
struct Ints {
    path: String,
    shape: Vec<u64>,
    values: Vec<i64>,
}

/// Reads an int32 or int64 array (either byte order) as `i64`; `what` names
/// it in messages (`lengths`, `positions`, ...). A 2-D array must be in C order.
fn read_ints(path: &Path, what: &str) -> Result<Ints, String> {
    let f = open(path)?;
    let t = f.dtype.clone();
    if !(t.type_char() == TypeChar::Int && matches!(t.size_field(), 4 | 8)) {
        return Err(format!("{}: unsupported {what} dtype '{t}'; {what} must be int32 (<i4) or int64 (<i8)", f.path));
    }
    let shape = f.header.shape().to_vec();
    if f.header.order() == Order::Fortran && shape.len() > 1 {
        return Err(format!(
            "{}: {what} is in Fortran (column-major) order; save it in C order (np.ascontiguousarray) first",
            f.path
        ));
    }
    let path = f.path.clone();
    let values = if t.size_field() == 4 {
        f.read_all(&format!("the {what}"), |x: i32| i64::from(x))?
    } else {
        f.read_all(&format!("the {what}"), |x: i64| x)?
    };
    Ok(Ints { path, shape, values })
}

/// A vector of `n` copies of `x`, allocated fallibly.
fn filled(path: &str, what: &str, n: usize, x: i32) -> Result<Vec<i32>, String> {
    let mut every = Vec::new();
    every
        .try_reserve_exact(n)
        .map_err(|_| format!("{path}: out of memory: the {what} need {} bytes", n as u128 * 4))?;
    every.resize(n, x);
    Ok(every)
}

/// A per-row input of `rows` entries: 1-D with one entry per row, or a 0-d
/// scalar for every row (`true` when it was a scalar).
fn per_row(f: &Ints, what: &str, rows: usize, scalar_ok: bool) -> Result<bool, String> {
    match f.shape.as_slice() {
        [] if scalar_ok => Ok(true),
        &[n] if n == rows as u64 => Ok(false),
        &[n] => Err(format!("{}: {what} has {n} entries but the scores have {rows} rows", f.path)),
        s => Err(format!(
            "{}: {what} must be {} with one entry per row, got a {}-D array of shape {}",
            f.path,
            if scalar_ok { "a scalar or 1-D" } else { "1-D" },
            s.len(),
            shape_str(s)
        )),
    }
}

/// The name of entry `row` of a per-row input, for messages.
fn entry_name(what: &str, scalar: bool, row: usize) -> String {
    if scalar {
        format!("{what} (a scalar, for every row)")
    } else {
        format!("{what}[{row}]")
    }
}

/// Reads the candidate counts: a 1-D array of int32 or int64 with one entry
/// per row, or a 0-d scalar that applies to every row; each in `0..=cols`.
/// With `--starts` they are the ranges' ends.
pub fn read_lengths(path: &Path, rows: usize, cols: usize) -> Result<Vec<i32>, String> {
    Ok(read_columns(path, "lengths", rows, cols)?.0)
}

/// Reads per-row column numbers (`what`: lengths or starts), each in
/// `0..=cols`, one per row or a 0-d scalar for every row (then `true`).
fn read_columns(path: &Path, what: &str, rows: usize, cols: usize) -> Result<(Vec<i32>, bool), String> {
    let f = read_ints(path, what)?;
    let scalar = per_row(&f, what, rows, true)?;
    for (row, &x) in f.values.iter().enumerate() {
        check_length(&f.path, &entry_name(what, scalar, row), x, cols)?;
    }
    let values = if scalar {
        filled(&f.path, what, rows, f.values[0] as i32)?
    } else {
        f.values.into_iter().map(|x| x as i32).collect()
    };
    Ok((values, scalar))
}

/// One length in `0..=cols` (and so in i32), or a message naming it.
fn check_length(path: &str, name: &str, len: i64, cols: usize) -> Result<(), String> {
    let why = if len < 0 {
        "is negative".to_string()
    } else if len > i32::MAX as i64 {
        "does not fit in int32".to_string()
    } else if len > cols as i64 {
        format!("is beyond cols = {cols}")
    } else {
        return Ok(());
    };
    Err(format!("{path}: {name} = {len} {why} (valid: 0..={cols})"))
}

/// Reads the range starts of `select --starts`: int32 or int64, one per row
/// or a 0-d scalar, each in `0..=end` where a row's end is its entry of
/// `ends` (the `--lengths` file and its values) or else `cols`.
pub fn read_starts(path: &Path, rows: usize, cols: usize, ends: Option<(&Path, &[i32])>) -> Result<Vec<i32>, String> {
    let (starts, scalar) = read_columns(path, "starts", rows, cols)?;
    if let Some((ends_path, ends)) = ends {
        if let Some(row) = (0..rows).find(|&r| starts[r] > ends[r]) {
            return Err(format!(
                "{}: {} = {} is beyond its row's end {} (lengths[{row}] in {}; row i selects among columns \
                 starts[i]..lengths[i], so 0 <= start <= end)",
                path.display(),
                entry_name("starts", scalar, row),
                starts[row],
                ends[row],
                ends_path.display(),
            ));
        }
    }
    Ok(starts)
}

/// Reads the query positions of `qsa`: int32 or int64, 1-D with one entry
/// per row, each `>= 0`.
pub fn read_positions(path: &Path, rows: usize) -> Result<Vec<i64>, String> {
    let f = read_ints(path, "positions")?;
    per_row(&f, "positions", rows, false)?;
    if let Some((i, &t)) = f.values.iter().enumerate().find(|&(_, &t)| t < 0) {
        return Err(format!("{}: positions[{i}] = {t} is negative (a position is >= 0)", f.path));
    }
    Ok(f.values)
}

/// Reads the sequence of each row (`--seq-ids` of `qsa` and `select`): int32 or int64,
/// 1-D with one entry per row, each fitting int32 (the library checks each
/// against the page table's sequences).
pub fn read_seq_ids(path: &Path, rows: usize) -> Result<Vec<i32>, String> {
    let f = read_ints(path, "seq_ids")?;
    per_row(&f, "seq_ids", rows, false)?;
    to_i32(&f, "seq_ids", |i| format!("[{i}]"))
}

/// A page table: `[sequences, max_pages]` int32 page numbers, row-major.
pub struct PageTable {
    pub table: Vec<i32>,
    pub max_pages: usize,
}

/// A page table with the sequence of each row and the page size, as read
/// from `--page-table`, `--seq-ids` and `--page-size` (`qsa`, `select`).
pub struct Paging<'a> {
    pub path: &'a Path,
    pub table: PageTable,
    pub seq_ids: Vec<i32>,
    pub page_size: usize,
}

impl<'a> Paging<'a> {
    /// Reads both files when both are given (clap lets through both or
    /// neither): the table, and one sequence per row of `rows`.
    pub fn read(
        page_table: Option<&'a Path>,
        seq_ids: Option<&Path>,
        page_size: usize,
        rows: usize,
    ) -> Result<Option<Self>, String> {
        match (page_table, seq_ids) {
            (Some(path), Some(q)) => {
                Ok(Some(Self { path, table: read_page_table(path)?, seq_ids: read_seq_ids(q, rows)?, page_size }))
            }
            _ => Ok(None),
        }
    }

    /// The library's view of it; its geometry errors name the table's file.
    pub fn map(&self) -> Result<flashsel::PageMap<'_>, String> {
        flashsel::PageMap::new(&self.table.table, self.table.max_pages, self.page_size, &self.seq_ids)
            .map_err(|e| format!("{}: {e}", self.path.display()))
    }
}

/// Reads `--page-table` (`qsa`, `select`): int32 or int64 (each fitting int32), 2-D
/// `[sequences, max_pages]` in C order, at least one page a sequence.
pub fn read_page_table(path: &Path) -> Result<PageTable, String> {
    let f = read_ints(path, "page_table")?;
    let max_pages = match f.shape.as_slice() {
        &[_, p] => p as usize,
        s => {
            return Err(format!(
                "{}: page_table must be 2-D [sequences, max_pages], got a {}-D array of shape {}",
                f.path,
                s.len(),
                shape_str(s)
            ))
        }
    };
    if max_pages == 0 {
        return Err(format!("{}: page_table has shape {}: no pages", f.path, shape_str(&f.shape)));
    }
    let table = to_i32(&f, "page_table", |i| format!("[{}, {}]", i / max_pages, i % max_pages))?;
    Ok(PageTable { table, max_pages })
}

/// The values of `f` as `i32`, or a message naming the first that does not fit.
fn to_i32(f: &Ints, what: &str, at: impl Fn(usize) -> String) -> Result<Vec<i32>, String> {
    f.values
        .iter()
        .enumerate()
        .map(|(i, &x)| i32::try_from(x).map_err(|_| format!("{}: {what}{} = {x} does not fit in int32", f.path, at(i))))
        .collect()
}

/// Elements written to an output file: as themselves, or for bf16 as the
/// 16-bit integer bits of `dtype` (`<u2` or `<i2`).
pub trait NpyElem: Copy {
    fn write(w: impl Write, dtype: &str, shape: &[u64], data: &[Self]) -> io::Result<()>;
}

macro_rules! plain_npy_elem {
    ($($t:ty),*) => {$(
        impl NpyElem for $t {
            fn write(w: impl Write, dtype: &str, shape: &[u64], data: &[Self]) -> io::Result<()> {
                write_array(w, dtype, shape, data.iter().copied())
            }
        }
    )*};
}
plain_npy_elem!(i32, f32, f16);

impl NpyElem for bf16 {
    fn write(w: impl Write, dtype: &str, shape: &[u64], data: &[Self]) -> io::Result<()> {
        if dtype.ends_with("i2") {
            write_array(w, dtype, shape, data.iter().map(|x| x.to_bits() as i16))
        } else {
            write_array(w, dtype, shape, data.iter().map(|x| x.to_bits()))
        }
    }
}

/// Writes a C-order array of `dtype` (a little-endian type string) to `w`.
fn write_array<T: npyz::Serialize>(
    mut w: impl Write,
    dtype: &str,
    shape: &[u64],
    items: impl Iterator<Item = T>,
) -> io::Result<()> {
    let t: TypeStr = dtype.parse().map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    debug_assert!(t.endianness() != Endianness::Big, "outputs are little-endian");
    let mut out = npyz::WriteOptions::new().dtype(DType::Plain(t)).shape(shape).writer(&mut w).begin_nd()?;
    out.extend(items)?;
    out.finish()?;
    w.flush()
}

/// Buffered writes to a file, sized like the reader's buffer.
pub fn buffered(f: File) -> io::BufWriter<File> {
    io::BufWriter::with_capacity(IO_BUFFER_BYTES, f)
}
