//! Just enough of the `.npy` format: read a score matrix or a lengths vector,
//! write a C-order array. Every failure is a message naming the file and what
//! is wrong with it; nothing here panics on a bad file.
//!
//! The header is parsed here rather than by a library so that a hostile or
//! corrupt header (a shape whose product overflows, say) is an error, never a
//! panic or a huge allocation: the declared data must fit in the file before
//! anything is allocated.

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Seek, Write};
use std::path::Path;

use half::{bf16, f16};

/// The scores of an input file, in the element type they are selected as.
pub enum Scores {
    F32(Vec<f32>),
    F16(Vec<f16>),
    /// bfloat16 bit patterns, read from a `<u2` (`signed == false`) or `<i2` file.
    Bf16 {
        data: Vec<bf16>,
        signed: bool,
    },
}

/// A score matrix read from a file.
pub struct Matrix {
    pub rows: usize,
    pub cols: usize,
    /// `true` when the file held a 1-D array (read as one row).
    pub one_d: bool,
    /// The dtype string as written in the file, e.g. `<f4`.
    pub descr: String,
    pub scores: Scores,
}

/// What a `.npy` header says.
#[derive(Debug, Clone, PartialEq)]
pub struct Header {
    pub descr: String,
    pub fortran_order: bool,
    pub shape: Vec<u64>,
}

impl Header {
    pub fn shape_str(&self) -> String {
        shape_str(&self.shape)
    }
}

/// `(3, 4)`, `(5,)`, `()` as numpy prints them.
pub fn shape_str(shape: &[u64]) -> String {
    match shape {
        [] => "()".into(),
        [n] => format!("({n},)"),
        _ => format!("({})", shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")),
    }
}

/// A dtype string split into byte order, kind and size: `<f4` → (`<`, `f`, 4).
struct TypeStr {
    big_endian: bool,
    kind: char,
    size: usize,
}

fn parse_typestr(descr: &str) -> Option<TypeStr> {
    let mut chars = descr.chars();
    let order = chars.next()?;
    let (big_endian, rest) = match order {
        '<' | '|' | '=' => (false, chars.as_str()),
        '>' => (true, chars.as_str()),
        _ => (false, descr),
    };
    let mut rc = rest.chars();
    let kind = rc.next()?;
    let size: usize = rc.as_str().parse().ok()?;
    Some(TypeStr { big_endian, kind, size })
}

/// An open `.npy` file positioned at its data, with the parsed header.
struct NpyIn {
    path: String,
    header: Header,
    reader: BufReader<File>,
    /// Bytes of data after the header.
    data_bytes: u64,
}

fn open(path: &Path) -> Result<NpyIn, String> {
    let p = path.display().to_string();
    let file = File::open(path).map_err(|e| format!("cannot read {p}: {e}"))?;
    let meta = file.metadata().map_err(|e| format!("cannot read {p}: {e}"))?;
    if meta.is_dir() {
        return Err(format!("cannot read {p}: it is a directory"));
    }
    let mut reader = BufReader::with_capacity(1 << 20, file);
    let header = read_header(&mut reader).map_err(|e| format!("{p}: not a valid .npy file: {e}"))?;
    let pos = reader.stream_position().map_err(|e| format!("cannot read {p}: {e}"))?;
    let data_bytes = meta.len().saturating_sub(pos);
    Ok(NpyIn { path: p, header, reader, data_bytes })
}

/// Reads the magic, the version and the header dict; leaves `r` at the data.
pub fn read_header(r: &mut impl Read) -> Result<Header, String> {
    let mut magic = [0u8; 8];
    r.read_exact(&mut magic).map_err(|_| "file is shorter than the .npy magic".to_string())?;
    if &magic[..6] != b"\x93NUMPY" {
        return Err("missing the \\x93NUMPY magic".into());
    }
    let major = magic[6];
    let len = match major {
        1 => {
            let mut b = [0u8; 2];
            r.read_exact(&mut b).map_err(|_| "truncated header".to_string())?;
            u16::from_le_bytes(b) as usize
        }
        2 | 3 => {
            let mut b = [0u8; 4];
            r.read_exact(&mut b).map_err(|_| "truncated header".to_string())?;
            u32::from_le_bytes(b) as usize
        }
        v => return Err(format!("unsupported .npy format version {v}.{}", magic[7])),
    };
    if len > 1 << 24 {
        return Err(format!("header length {len} is implausible"));
    }
    let mut text = vec![0u8; len];
    r.read_exact(&mut text).map_err(|_| "truncated header".to_string())?;
    let text = String::from_utf8_lossy(&text);
    parse_header_dict(&text)
}

/// A tiny subset of Python literals: what `numpy.save` writes in a header.
#[derive(Debug, Clone, PartialEq)]
enum Lit {
    Str(String),
    Int(u64),
    Bool(bool),
    Seq(Vec<Lit>),
    Dict(Vec<(Lit, Lit)>),
    Other,
}

struct LitParser<'a> {
    s: &'a [u8],
    i: usize,
    depth: usize,
}

impl LitParser<'_> {
    fn ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }
    fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.s.get(self.i).copied()
    }
    fn expect(&mut self, c: u8) -> Result<(), String> {
        if self.peek() == Some(c) {
            self.i += 1;
            Ok(())
        } else {
            Err(format!("expected '{}' at byte {} of the header", c as char, self.i))
        }
    }
    fn value(&mut self) -> Result<Lit, String> {
        self.depth += 1;
        if self.depth > 32 {
            return Err("header nests too deeply".into());
        }
        let v = self.value_inner();
        self.depth -= 1;
        v
    }
    fn value_inner(&mut self) -> Result<Lit, String> {
        match self.peek() {
            None => Err("unexpected end of header".into()),
            Some(q @ (b'\'' | b'"')) => {
                self.i += 1;
                let start = self.i;
                while self.i < self.s.len() && self.s[self.i] != q {
                    self.i += 1;
                }
                if self.i >= self.s.len() {
                    return Err("unterminated string in header".into());
                }
                let out = String::from_utf8_lossy(&self.s[start..self.i]).into_owned();
                self.i += 1;
                Ok(Lit::Str(out))
            }
            Some(open @ (b'(' | b'[')) => {
                let close = if open == b'(' { b')' } else { b']' };
                self.i += 1;
                let mut items = Vec::new();
                loop {
                    if self.peek() == Some(close) {
                        self.i += 1;
                        return Ok(Lit::Seq(items));
                    }
                    items.push(self.value()?);
                    match self.peek() {
                        Some(b',') => self.i += 1,
                        Some(c) if c == close => {}
                        _ => return Err(format!("expected ',' or '{}' in header", close as char)),
                    }
                }
            }
            Some(b'{') => {
                self.i += 1;
                let mut items = Vec::new();
                loop {
                    if self.peek() == Some(b'}') {
                        self.i += 1;
                        return Ok(Lit::Dict(items));
                    }
                    let k = self.value()?;
                    self.expect(b':')?;
                    let v = self.value()?;
                    items.push((k, v));
                    match self.peek() {
                        Some(b',') => self.i += 1,
                        Some(b'}') => {}
                        _ => return Err("expected ',' or '}' in header".into()),
                    }
                }
            }
            Some(_) => {
                let start = self.i;
                while self.i < self.s.len()
                    && (self.s[self.i].is_ascii_alphanumeric() || b"_-+.".contains(&self.s[self.i]))
                {
                    self.i += 1;
                }
                let word = std::str::from_utf8(&self.s[start..self.i]).unwrap_or("");
                if word.is_empty() {
                    return Err(format!("unexpected character {:?} in header", self.s[start] as char));
                }
                Ok(match word {
                    "True" => Lit::Bool(true),
                    "False" => Lit::Bool(false),
                    w => {
                        let w = w.strip_suffix('L').unwrap_or(w);
                        match w.parse::<u64>() {
                            Ok(n) => Lit::Int(n),
                            Err(_) if w.starts_with('-') && w[1..].bytes().all(|b| b.is_ascii_digit()) => {
                                return Err(format!("negative dimension {w} in the shape"));
                            }
                            Err(_) if w.bytes().all(|b| b.is_ascii_digit()) => {
                                return Err(format!("dimension {w} is too large"));
                            }
                            Err(_) => Lit::Other,
                        }
                    }
                })
            }
        }
    }
}

fn parse_header_dict(text: &str) -> Result<Header, String> {
    let mut p = LitParser { s: text.as_bytes(), i: 0, depth: 0 };
    let dict = match p.value()? {
        Lit::Dict(d) => d,
        _ => return Err("header is not a dict".into()),
    };
    let get = |key: &str| dict.iter().find(|(k, _)| *k == Lit::Str(key.into())).map(|(_, v)| v);
    let descr = match get("descr") {
        Some(Lit::Str(s)) => s.clone(),
        Some(Lit::Seq(_)) => return Err("structured (record) dtypes are not supported".into()),
        Some(_) => return Err("'descr' is not a dtype string".into()),
        None => return Err("header has no 'descr'".into()),
    };
    let fortran_order = match get("fortran_order") {
        Some(Lit::Bool(b)) => *b,
        Some(_) => return Err("'fortran_order' is not True or False".into()),
        None => return Err("header has no 'fortran_order'".into()),
    };
    let shape = match get("shape") {
        Some(Lit::Seq(items)) => items
            .iter()
            .map(|d| match d {
                Lit::Int(n) => Ok(*n),
                _ => Err("'shape' holds something other than integers".to_string()),
            })
            .collect::<Result<Vec<u64>, String>>()?,
        Some(_) => return Err("'shape' is not a tuple".into()),
        None => return Err("header has no 'shape'".into()),
    };
    Ok(Header { descr, fortran_order, shape })
}

/// Element count of a shape, or an error when it overflows.
fn element_count(shape: &[u64]) -> Option<u64> {
    shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d))
}

/// Checks that the data the header declares is in the file; returns the count.
fn check_data_size(f: &NpyIn, elem_size: usize) -> Result<usize, String> {
    let h = &f.header;
    let too_big = || format!("{}: shape {} is too large", f.path, h.shape_str());
    let n = element_count(&h.shape).ok_or_else(too_big)?;
    let bytes = n.checked_mul(elem_size as u64).ok_or_else(too_big)?;
    if f.data_bytes < bytes {
        return Err(format!(
            "{}: truncated: shape {} of {} needs {bytes} bytes of data but the file holds {}",
            f.path,
            h.shape_str(),
            h.descr,
            f.data_bytes
        ));
    }
    usize::try_from(n).map_err(|_| too_big())
}

/// Reads `n` elements of `size` bytes and converts each with `conv`
/// (given little-endian bytes), in bounded chunks.
fn read_elems<T, const N: usize>(
    f: &mut NpyIn,
    n: usize,
    big_endian: bool,
    conv: impl Fn([u8; N]) -> T,
) -> Result<Vec<T>, String> {
    let mut out = Vec::with_capacity(n);
    let mut buf = vec![0u8; (1 << 20) * N];
    let mut left = n;
    while left > 0 {
        let take = left.min(1 << 20);
        let bytes = &mut buf[..take * N];
        f.reader.read_exact(bytes).map_err(|e| format!("cannot read {}: {e}", f.path))?;
        out.extend(bytes.chunks_exact(N).map(|c| {
            let mut a: [u8; N] = c.try_into().expect("chunk of N bytes");
            if big_endian {
                a.reverse();
            }
            conv(a)
        }));
        left -= take;
    }
    Ok(out)
}

const SCORE_DTYPES: &str = "float32 (<f4), float16 (<f2), or bfloat16 bits as uint16/int16 (<u2/<i2)";

/// Reads a 1-D or 2-D C-order score matrix of f32, f16, or bf16 bits (u2/i2).
pub fn read_scores(path: &Path) -> Result<Matrix, String> {
    let mut f = open(path)?;
    let h = f.header.clone();
    let ts = parse_typestr(&h.descr);
    let (kind, size, big) = match &ts {
        Some(t) => (t.kind, t.size, t.big_endian),
        None => ('?', 0, false),
    };
    let supported = matches!((kind, size), ('f', 4) | ('f', 2) | ('u', 2) | ('i', 2));
    if !supported {
        let hint = match (kind, size) {
            ('f', 8) => " (float64: convert with .astype(np.float32))",
            ('V', 2) => " (a 2-byte void type, e.g. ml_dtypes bfloat16: pass its bits with .view(np.uint16))",
            _ => "",
        };
        return Err(format!("{}: unsupported dtype '{}'{hint}; scores must be {SCORE_DTYPES}", f.path, h.descr));
    }
    let (rows, cols, one_d) = match h.shape.as_slice() {
        [n] => (1u64, *n, true),
        [r, c] => (*r, *c, false),
        s => {
            return Err(format!(
                "{}: scores must be 1-D or 2-D, got a {}-D array of shape {}",
                f.path,
                s.len(),
                h.shape_str()
            ))
        }
    };
    if h.fortran_order && !one_d {
        return Err(format!(
            "{}: the array is in Fortran (column-major) order; save it in C order (np.ascontiguousarray) first",
            f.path
        ));
    }
    let n = check_data_size(&f, size)?;
    let (rows, cols) = (rows as usize, cols as usize);
    let scores = match (kind, size) {
        ('f', 4) => Scores::F32(read_elems(&mut f, n, big, f32::from_le_bytes)?),
        ('f', 2) => Scores::F16(read_elems(&mut f, n, big, |b| f16::from_bits(u16::from_le_bytes(b)))?),
        (k, _) => Scores::Bf16 {
            data: read_elems(&mut f, n, big, |b| bf16::from_bits(u16::from_le_bytes(b)))?,
            signed: k == 'i',
        },
    };
    Ok(Matrix { rows, cols, one_d, descr: h.descr, scores })
}

/// Reads a 1-D lengths vector of i32 or i64 with `rows` entries, each in
/// `0..=cols`.
pub fn read_lengths(path: &Path, rows: usize, cols: usize) -> Result<Vec<i32>, String> {
    let mut f = open(path)?;
    let h = f.header.clone();
    let (size, big) = match parse_typestr(&h.descr) {
        Some(TypeStr { kind: 'i', size: s @ (4 | 8), big_endian }) => (s, big_endian),
        _ => {
            return Err(format!(
                "{}: unsupported lengths dtype '{}'; lengths must be int32 (<i4) or int64 (<i8)",
                f.path, h.descr
            ))
        }
    };
    let n = match h.shape.as_slice() {
        [n] => *n,
        s => {
            return Err(format!(
                "{}: lengths must be 1-D with one entry per row, got a {}-D array of shape {}",
                f.path,
                s.len(),
                h.shape_str()
            ))
        }
    };
    if n != rows as u64 {
        return Err(format!("{}: lengths has {n} entries but the scores have {rows} rows", f.path));
    }
    let n = check_data_size(&f, size)?;
    let wide: Vec<i64> = if size == 4 {
        read_elems(&mut f, n, big, |b| i32::from_le_bytes(b) as i64)?
    } else {
        read_elems(&mut f, n, big, i64::from_le_bytes)?
    };
    let mut out = Vec::with_capacity(n);
    for (row, &len) in wide.iter().enumerate() {
        if len < 0 || len > cols as i64 || len > i32::MAX as i64 {
            let why = if len < 0 {
                "is negative".to_string()
            } else if len > i32::MAX as i64 {
                "does not fit in int32".to_string()
            } else {
                format!("is beyond cols = {cols}")
            };
            return Err(format!("{}: lengths[{row}] = {len} {why} (valid: 0..={cols})", f.path));
        }
        out.push(len as i32);
    }
    Ok(out)
}

/// Elements that can be written to a `.npy` file as little-endian bytes.
pub trait NpyElem: Copy {
    const SIZE: usize;
    fn put(self, out: &mut Vec<u8>);
}

impl NpyElem for i32 {
    const SIZE: usize = 4;
    fn put(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
}
impl NpyElem for f32 {
    const SIZE: usize = 4;
    fn put(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
}
impl NpyElem for f16 {
    const SIZE: usize = 2;
    fn put(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_bits().to_le_bytes());
    }
}
impl NpyElem for bf16 {
    const SIZE: usize = 2;
    fn put(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_bits().to_le_bytes());
    }
}

/// The header bytes (magic, version, length, padded dict) for a C-order array.
pub fn header_bytes(descr: &str, shape: &[u64]) -> Vec<u8> {
    let mut dict = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {}, }}", shape_str(shape));
    // Magic (6) + version (2) + length (2), then the dict padded with spaces and
    // ended by '\n' so the data starts on a 64-byte boundary.
    let mut version = 1u8;
    let mut prefix = 10;
    if dict.len() + 1 + prefix > u16::MAX as usize {
        version = 2;
        prefix = 12;
    }
    let total = (prefix + dict.len() + 1).div_ceil(64) * 64;
    while prefix + dict.len() + 1 < total {
        dict.push(' ');
    }
    dict.push('\n');
    let mut out = Vec::with_capacity(total);
    out.extend_from_slice(b"\x93NUMPY");
    out.push(version);
    out.push(0);
    if version == 1 {
        out.extend_from_slice(&(dict.len() as u16).to_le_bytes());
    } else {
        out.extend_from_slice(&(dict.len() as u32).to_le_bytes());
    }
    out.extend_from_slice(dict.as_bytes());
    out
}

/// Writes a C-order array to an already created file.
pub fn write_array<T: NpyElem>(file: File, descr: &str, shape: &[u64], data: &[T]) -> io::Result<()> {
    let mut w = BufWriter::with_capacity(1 << 20, file);
    w.write_all(&header_bytes(descr, shape))?;
    let mut buf = Vec::with_capacity((1 << 16) * T::SIZE);
    for chunk in data.chunks(1 << 16) {
        buf.clear();
        for &x in chunk {
            x.put(&mut buf);
        }
        w.write_all(&buf)?;
    }
    w.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_roundtrip_and_alignment() {
        for shape in [vec![], vec![5], vec![3, 4], vec![1, 1 << 40]] {
            let b = header_bytes("<f4", &shape);
            assert_eq!(b.len() % 64, 0);
            let h = read_header(&mut &b[..]).unwrap();
            assert_eq!(h, Header { descr: "<f4".into(), fortran_order: false, shape });
        }
    }

    #[test]
    fn header_parser_rejects_garbage() {
        assert!(parse_header_dict("{'descr': '<f4', 'fortran_order': False}").is_err());
        assert!(parse_header_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (-1, 2)}").is_err());
        assert!(
            parse_header_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999999,)}").is_err()
        );
        assert!(parse_header_dict(&"[".repeat(100)).is_err());
        assert!(parse_header_dict("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,)}")
            .unwrap_err()
            .contains("structured"));
        let h = parse_header_dict("{\"descr\": \">f2\", \"shape\": (2, 3), \"fortran_order\": True}").unwrap();
        assert_eq!(h.shape, vec![2, 3]);
        assert!(h.fortran_order);
        assert_eq!(element_count(&[1 << 40, 1 << 40]), None);
    }
}
